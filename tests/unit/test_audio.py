"""Tests for serve_app.engine.audio: streaming encoders round-trip through
PyAV (ffmpeg) and libsndfile decoders; G.711 (8 kHz) and the volume gain."""

from __future__ import annotations

import io
import subprocess

import av
import numpy as np
import pytest
import soundfile as sf
from scipy.signal import resample_poly

from serve_app.engine.audio import (
    AUDIO_FORMATS,
    CONTENT_TYPES,
    ENCODER_FORMATS,
    GAIN_DB_RANGE,
    PCM_RATES,
    RATE_FORMATS,
    SAMPLE_RATE,
    TELEPHONY_FORMATS,
    AudioEncoder,
    apply_gain,
    content_type,
    encode_file,
    format_bytes_per_second,
    format_sample_rate,
    new_encoder,
    nominal_bytes_per_second,
    pcm_format,
    to_int16,
)

SR = SAMPLE_RATE
N = 2 * SR  # 2.0 s test signal
FREQ = 440.0
LOSSY = ("mp3", "opus", "aac")
LOSSLESS = ("flac", "wav", "pcm")


def whole(pcm: np.ndarray, fmt: str, gain_db: float = 0.0) -> bytes:
    """A whole clip in one go, as a file is written (``encode_file``)."""
    return b"".join(encode_file([pcm], fmt, gain_db=gain_db))


# Uneven chunk sizes (incl. empty and 1-sample writes); the rest of the signal
# goes in one last write.
SCHEDULE = [0, 1, 511, 12000, 0, 7, 24000, 2400, 1]

# Decoded length minus input length, in samples, for codecs whose raw streams
# cannot signal encoder priming/padding (measured; deterministic):
#   mp3 (LAME, 576-sample frames at 24 kHz, no Xing/LAME tag on a stream):
#     1152 priming + padding to a whole frame -> (1152, 1728], i.e. 48-72 ms.
#   aac (ADTS, 1024-sample frames): 1024 priming + padding -> (1024, 2048],
#     i.e. 43-85 ms.
#   opus (Ogg): pre-skip and final granule position trim exactly -> 0.
EXTRA_SAMPLES = {"mp3": (1152, 1152 + 576), "aac": (1024, 2048), "opus": (0, 0)}

# Lossy quality bounds for a 0.5-amplitude tone (measured at 440 Hz: mp3 81 dB,
# aac 38 dB, opus 38 dB via ffmpeg / 27 dB via libsndfile's 24 kHz decode).
# LAME's output comes back at 0.95x amplitude (-0.45 dB, with both ffmpeg and
# mpg123 decoding, at any level), hence the loose amplitude bound.
MIN_SNR_DB = 20.0
AMP_RANGE = (0.45, 0.52)

DEMUXERS = {
    "mp3": "mp3",
    "opus": "ogg",
    "aac": "aac",
    "flac": "flac",
    "wav": "wav",
    "pcm": "s16le",
    "ulaw": "mulaw",
    "alaw": "alaw",
}
RAW_RATES = {"pcm": SR, "ulaw": 8000, "alaw": 8000}  # headerless: the demuxer is told the rate


def sine(n: int = N, freq: float = FREQ, amp: float = 0.5) -> np.ndarray:
    return (amp * np.sin(2 * np.pi * freq * np.arange(n) / SR)).astype(np.float32)


def feed(enc: AudioEncoder, x: np.ndarray, schedule: list[int] = SCHEDULE) -> tuple[bytes, list[bytes]]:
    """Write x in the given chunk sizes (remainder last), close; return
    (all bytes, per-write outputs excluding close)."""
    outs, pos = [], 0
    for n in schedule:
        outs.append(enc.write(x[pos : pos + n]))
        pos += n
    outs.append(enc.write(x[pos:]))
    return b"".join(outs) + enc.close(), outs


def decode_av(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decode with PyAV; returns (samples as [channels, n], sample rate)."""
    opts = {"sample_rate": str(RAW_RATES[fmt]), "ch_layout": "mono"} if fmt in RAW_RATES else {}
    with av.open(io.BytesIO(data), format=DEMUXERS[fmt], options=opts) as c:
        stream = c.streams.audio[0]
        assert stream.codec_context.channels == 1
        frames = [f.to_ndarray().reshape(f.layout.nb_channels, -1) for f in c.decode(stream)]
        rate = stream.codec_context.sample_rate
    return (np.concatenate(frames, axis=1) if frames else np.zeros((1, 0), np.int16)), rate


def as_float(y: np.ndarray) -> np.ndarray:
    return y / 32768.0 if y.dtype == np.int16 else y.astype(np.float64)


def sine_fit(y: np.ndarray, rate: int, freq: float = FREQ) -> tuple[float, float]:
    """Least-squares fit of a sine at freq (any phase, so codec delay does not
    matter) to the middle of y; returns (SNR in dB, fitted amplitude)."""
    edge = int(0.15 * rate)  # skip priming and the fade at the ends
    y = as_float(y)[edge:-edge]
    t = np.arange(len(y)) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t), np.ones_like(t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, y, rcond=None)
    fit = basis @ coef
    snr = 10 * np.log10(np.sum(fit**2) / max(np.sum((y - fit) ** 2), 1e-20))
    return float(snr), float(np.hypot(coef[0], coef[1]))


def sf_read_int16(data: bytes) -> np.ndarray:
    """Read all frames with libsndfile. python-soundfile seeks after every
    read, and libsndfile cannot seek to the end of a FLAC stream whose
    STREAMINFO says total_samples=0 ("unknown", all a live stream can say),
    so read through the C API until it returns 0 frames."""
    with sf.SoundFile(io.BytesIO(data)) as f:
        assert f.channels == 1 and f.samplerate == SR
        parts, buf = [], np.empty(4096, np.int16)
        ptr = sf._ffi.cast("short *", buf.ctypes.data)
        while (n := sf._snd.sf_readf_short(f._file, ptr, len(buf))) > 0:
            parts.append(buf[:n].copy())
    return np.concatenate(parts) if parts else np.zeros(0, np.int16)


def libsndfile_reads(fmt: str) -> bool:
    if fmt in ("wav", "flac"):
        return True
    if fmt == "mp3":
        return "MP3" in sf.available_formats()
    if fmt == "opus":
        return "OGG" in sf.available_formats() and "OPUS" in sf.available_subtypes("OGG")
    return False


# --- round trips -------------------------------------------------------------


# The 24 kHz formats; G.711's 8 kHz ones have their own round trips below.
FULL_RATE = tuple(f for f in AUDIO_FORMATS if f not in TELEPHONY_FORMATS)


@pytest.mark.parametrize("fmt", FULL_RATE)
def test_roundtrip_pyav(fmt: str) -> None:
    x = sine()
    data, _ = feed(new_encoder(fmt), x)
    y, rate = decode_av(data, fmt)
    assert y.shape[0] == 1  # mono
    extra = y.shape[1] * SR / rate - N  # in input samples (opus decodes at 48 kHz)
    if fmt in LOSSLESS:
        assert rate == SR and extra == 0
        np.testing.assert_array_equal(y[0], to_int16(x))
    else:
        lo, hi = EXTRA_SAMPLES[fmt]
        assert lo <= extra <= hi, f"{fmt}: {extra * 1000 / SR:.1f} ms extra"
        snr, amp = sine_fit(y[0], rate)
        assert snr > MIN_SNR_DB, f"{fmt}: SNR {snr:.1f} dB"
        assert AMP_RANGE[0] < amp < AMP_RANGE[1], f"{fmt}: amplitude {amp:.3f}"


@pytest.mark.parametrize("fmt", [f for f in AUDIO_FORMATS if libsndfile_reads(f)])
def test_roundtrip_soundfile(fmt: str) -> None:
    x = sine()
    data, _ = feed(new_encoder(fmt), x)
    y = sf_read_int16(data)
    if fmt in LOSSLESS:
        np.testing.assert_array_equal(y, to_int16(x))
    else:
        if fmt == "opus":  # libsndfile applies pre-skip and end trimming too
            assert len(y) == N
        else:
            lo, hi = EXTRA_SAMPLES[fmt]
            assert lo <= len(y) - N <= hi
        snr, amp = sine_fit(y, SR)
        assert snr > MIN_SNR_DB and AMP_RANGE[0] < amp < AMP_RANGE[1], (snr, amp)


@pytest.mark.parametrize("fmt", FULL_RATE)
def test_whole_file_matches_stream_length(fmt: str) -> None:
    x = sine(SR // 2 + 37)
    y, rate = decode_av(whole(x, fmt), fmt)
    extra = y.shape[1] * SR / rate - len(x)
    lo, hi = EXTRA_SAMPLES.get(fmt, (0, 0))
    assert lo <= extra <= hi


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_empty_stream(fmt: str) -> None:
    enc = new_encoder(fmt)
    data = enc.write(np.zeros(0, np.float32)) + enc.close()
    if fmt in ("pcm", "ulaw", "alaw"):
        assert data == b""
    elif fmt == "wav":
        assert len(data) == 44
        assert decode_av(data, fmt)[0].size == 0
        assert len(sf_read_int16(data)) == 0


# --- sample conversion ---------------------------------------------------------


def test_pcm_is_s16le_of_input_with_clipping() -> None:
    x = np.array([-3.0, -1.0, -0.5, -1e-6, 0.0, 0.25, 0.5000153, 1.0, 1.5, np.nan], np.float32)
    expected = np.array([-32767, -32767, -16384, 0, 0, 8192, 16384, 32767, 32767, 0], "<i2")
    data = whole(x, "pcm")
    assert data == expected.tobytes()
    assert np.array_equal(np.frombuffer(data, "<i2"), expected)


def test_pcm_matches_input_samples() -> None:
    x = sine(1001)
    assert whole(x, "pcm") == np.rint(x * 32767).astype("<i2").tobytes()


def test_to_int16_shapes() -> None:
    assert to_int16(np.full((5, 1), 0.5)).shape == (5,)
    ints = np.array([1, -2, 3], np.int16)
    assert to_int16(ints) is ints  # int16 passes through
    with pytest.raises(ValueError):
        to_int16(np.zeros((5, 2), np.float32))


def test_wav_header_is_streamable() -> None:
    data = whole(sine(10), "wav")
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    assert data[44:] == whole(sine(10), "pcm")


# --- API ------------------------------------------------------------------------


def test_formats_and_content_types() -> None:
    # The API's formats (protocol.ResponseFormat), G.711 telephony ones among them.
    assert AUDIO_FORMATS == ("mp3", "opus", "aac", "flac", "wav", "pcm", "ulaw", "alaw")
    assert TELEPHONY_FORMATS == ("ulaw", "alaw")
    assert CONTENT_TYPES == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
        "ulaw": "audio/basic",
        "alaw": "audio/x-alaw-basic",
    }
    for fmt in AUDIO_FORMATS:
        enc = new_encoder(fmt)
        assert isinstance(enc, AudioEncoder)
        assert enc.format == fmt and enc.content_type == CONTENT_TYPES[fmt]
        assert enc.sample_rate == SR and enc.output_rate == format_sample_rate(fmt)
        enc.close()


def test_format_rates() -> None:
    assert {f: format_sample_rate(f) for f in AUDIO_FORMATS} == {
        "mp3": SR,
        "opus": SR,
        "aac": SR,
        "flac": SR,
        "wav": SR,
        "pcm": SR,
        "ulaw": 8000,
        "alaw": 8000,
    }
    assert {f: format_bytes_per_second(f) for f in AUDIO_FORMATS} == {
        "mp3": None,
        "opus": None,
        "aac": None,
        "flac": None,
        "wav": 2 * SR,
        "pcm": 2 * SR,
        "ulaw": 8000,
        "alaw": 8000,
    }
    for fn in (format_sample_rate, format_bytes_per_second):
        with pytest.raises(ValueError, match="unknown audio format"):
            fn("ogg")


@pytest.mark.parametrize("fmt", ["ogg", "MP3", "", "vorbis"])
def test_unknown_format(fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown audio format"):
        new_encoder(fmt)
    with pytest.raises(ValueError):
        whole(sine(10), fmt)


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_close_is_idempotent(fmt: str) -> None:
    with new_encoder(fmt) as enc:
        enc.write(sine(1000))
        enc.close()
        assert enc.close() == b""
        with pytest.raises(ValueError):
            enc.write(sine(10))
    assert enc.close() == b""


# --- streaming behaviour -----------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "ulaw", "alaw"])
def test_bytes_flow_before_close(fmt: str) -> None:
    """Bytes leave while audio is still being written. Measured first audio
    bytes (10 ms writes): mp3 80 ms, aac 90 ms, flac 100 ms, opus 120 ms
    (two 60 ms Ogg pages); with 0.1 s writes all but opus (0.2 s) emit on the
    first write."""
    enc = new_encoder(fmt)
    header = len(enc.write(np.zeros(0, np.float32)))  # Ogg/FLAC headers are ready at once
    x = sine(SR)
    piece = SR // 10
    sizes = [len(enc.write(x[i : i + piece])) for i in range(0, SR, piece)]
    tail = enc.close()
    assert header + sum(sizes) > 0 and tail
    first_audio = next(i for i, s in enumerate(sizes) if s)
    assert first_audio <= 2, sizes  # within 0.3 s of input
    assert sum(s > 0 for s in sizes) >= 8, sizes  # keeps flowing, not one burst


def test_no_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("encoders must not spawn processes")

    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr("os.system", forbidden)
    monkeypatch.setattr("os.posix_spawn", forbidden)
    for fmt in AUDIO_FORMATS:
        data, _ = feed(new_encoder(fmt), sine(SR // 2))
        assert data


def test_many_interleaved_mp3_streams() -> None:
    """20 live encoders in one process share nothing: each stream decodes to
    its own tone."""
    freqs = [200.0 + 50 * i for i in range(20)]
    signals = [sine(SR, f) for f in freqs]
    encs = [new_encoder("mp3") for _ in freqs]
    outs: list[list[bytes]] = [[] for _ in freqs]
    for pos in range(0, SR, 1000):  # interleave uneven-ish writes
        for k, enc in enumerate(encs):
            outs[k].append(enc.write(signals[k][pos : pos + 1000]))
    for k, enc in enumerate(encs):
        outs[k].append(enc.close())
        y, rate = decode_av(b"".join(outs[k]), "mp3")
        lo, hi = EXTRA_SAMPLES["mp3"]
        assert y.shape[0] == 1 and lo <= y.shape[1] - SR <= hi
        snr, amp = sine_fit(y[0], rate, freqs[k])
        assert snr > MIN_SNR_DB and AMP_RANGE[0] < amp < AMP_RANGE[1], (freqs[k], snr, amp)


# --- G.711 (ulaw / alaw, 8 kHz) ---------------------------------------------------

TEL = 8000


def g711_decode(data: bytes, fmt: str) -> np.ndarray:
    """G.711's expansion (ITU-T G.711 tables as the classic formulas), independent of
    ffmpeg's decoder: bytes -> 16-bit linear samples."""
    b = np.frombuffer(data, np.uint8).astype(np.int32)
    if fmt == "ulaw":
        u = ~b & 0xFF
        t = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
        return np.where(u & 0x80, 0x84 - t, t - 0x84).astype(np.int16)
    a = b ^ 0x55
    seg = (a & 0x70) >> 4
    q = 2 * (a & 0x0F) + 1
    t = np.where(seg > 0, (q + 32) << (seg + 2), q << 3)
    return np.where(a & 0x80, t, -t).astype(np.int16)


def reference_8k(x: np.ndarray) -> np.ndarray:
    """The input at 8 kHz through an independent anti-aliased resampler (scipy's polyphase)."""
    return resample_poly(to_int16(x).astype(np.float64), 1, 3)


def snr(y: np.ndarray, ref: np.ndarray, edge: int = 200) -> float:
    y, ref = y[edge:-edge].astype(np.float64), ref[edge:-edge]
    return float(10 * np.log10(np.sum(ref**2) / max(np.sum((y - ref) ** 2), 1e-20)))


def tone_level_db(y: np.ndarray, freq: float, amp: float, rate: int = TEL) -> float:
    """Level of a sine at freq in y (int16), in dB relative to amplitude amp."""
    y = as_float(y)[400:-400]
    t = np.arange(len(y)) / rate
    basis = np.stack([np.sin(2 * np.pi * freq * t), np.cos(2 * np.pi * freq * t)], axis=1)
    coef, *_ = np.linalg.lstsq(basis, y, rcond=None)
    return float(20 * np.log10(max(np.hypot(*coef), 1e-12) / amp))


# Measured SNR of the decoded bytes against reference_8k, 440 Hz tone: ulaw 37.5 dB (0.5),
# 38.2 dB (0.05); alaw 38.4 / 38.6 dB. G.711's 8-bit companding holds ~38 dB over that
# range; the two resamplers agree to ~58 dB, so the bound is the codec's.
G711_MIN_SNR_DB = 35.0


@pytest.mark.parametrize("fmt", TELEPHONY_FORMATS)
@pytest.mark.parametrize("amp", [0.5, 0.05])
def test_g711_roundtrip(fmt: str, amp: float) -> None:
    x = sine(amp=amp)
    data, _ = feed(new_encoder(fmt), x)
    y, rate = decode_av(data, fmt)
    assert rate == TEL and y.shape[0] == 1
    assert len(data) == y.shape[1] == N // 3  # one byte a sample, 2.0 s at 8 kHz
    assert len(data) / format_bytes_per_second(fmt) == N / SR
    np.testing.assert_array_equal(y[0], g711_decode(data, fmt))  # ffmpeg's decoder agrees
    got = snr(y[0], reference_8k(x))
    assert got > G711_MIN_SNR_DB, f"{fmt} at {amp}: SNR {got:.1f} dB"


@pytest.mark.parametrize("fmt,silence", [("ulaw", 0xFF), ("alaw", 0xD5)])
def test_g711_silence_bytes(fmt: str, silence: int) -> None:
    """Digital silence is G.711's idle code (what a telephony stack sends between words)."""
    assert whole(np.zeros(2400, np.float32), fmt) == bytes([silence]) * 800


@pytest.mark.parametrize("fmt", TELEPHONY_FORMATS)
def test_g711_chunking_changes_nothing(fmt: str) -> None:
    """The resampler's held-back delay is carried across writes: chunked == one shot, and
    the length is the input's at 8 kHz."""
    x = (0.3 * np.random.default_rng(5).standard_normal(N)).astype(np.float32)
    one_shot = whole(x, fmt)
    assert len(one_shot) == N // 3
    for schedule in (SCHEDULE, [1] * 50 + [2, 3, 5, 7, 11, 13], [4799] * 5):
        data, _ = feed(new_encoder(fmt), x, schedule)
        assert data == one_shot, schedule


@pytest.mark.parametrize("n", [1, 2, 3, 100, 1001, 24000, 24001, 24002, 37 * 480 + 1])
def test_g711_length(n: int) -> None:
    data, _ = feed(new_encoder("ulaw"), sine(n), [n // 3, 1, n // 5])
    assert abs(len(data) - round(n * TEL / SR)) <= 1, (n, len(data))


@pytest.mark.parametrize("fmt", TELEPHONY_FORMATS)
def test_g711_anti_aliasing(fmt: str) -> None:
    """Content above 4 kHz is filtered out before decimation, not folded back into the band
    (keeping every third sample would put a 6 kHz tone at 2 kHz at full level); the band
    stays flat. Measured: 1 kHz -0.0 dB, 3.4 kHz -0.1 dB, 4.5 kHz -> 3.5 kHz -61 dB, 6 kHz
    and up: nothing (under half an LSB)."""
    amp = 0.5
    y, _ = decode_av(whole(sine(freq=1000.0, amp=amp), fmt), fmt)
    assert abs(tone_level_db(y[0], 1000.0, amp)) < 0.3
    y, _ = decode_av(whole(sine(freq=3400.0, amp=amp), fmt), fmt)
    assert abs(tone_level_db(y[0], 3400.0, amp)) < 0.5
    for freq, alias in ((4500.0, 3500.0), (6000.0, 2000.0), (9000.0, 1000.0)):
        y, _ = decode_av(whole(sine(freq=freq, amp=amp), fmt), fmt)
        level = tone_level_db(y[0], alias, amp)
        assert level < -50.0, f"{freq} Hz folds to {alias} Hz at {level:.1f} dB"


def test_g711_from_other_rates() -> None:
    """The encoder takes PCM at any rate (the clips path decodes 16 or 48 kHz)."""
    for rate in (16000, 48000, 8000):
        x = (0.5 * np.sin(2 * np.pi * 440 * np.arange(rate) / rate)).astype(np.float32)
        enc = new_encoder("ulaw", sample_rate=rate)
        data = enc.write(x) + enc.close()
        assert abs(len(data) - TEL) <= 1, rate
        assert abs(tone_level_db(g711_decode(data, "ulaw"), 440.0, 0.5)) < 0.3


# --- pcm at other rates (pcm_<rate>: the ElevenLabs door's output formats) ---------------


def test_rate_formats() -> None:
    assert PCM_RATES == (8000, 16000, 22050, 32000, 44100, 48000)
    assert ENCODER_FORMATS == AUDIO_FORMATS + tuple(f"pcm_{r}" for r in PCM_RATES)
    assert not set(RATE_FORMATS) & set(AUDIO_FORMATS)  # not the API's response_format
    assert pcm_format(SR) == "pcm" and pcm_format(16000) == "pcm_16000"
    with pytest.raises(ValueError, match="no pcm at 11025"):
        pcm_format(11025)
    for fmt, rate in RATE_FORMATS.items():
        assert format_sample_rate(fmt) == rate and format_bytes_per_second(fmt) == 2 * rate
        assert content_type(fmt) == "audio/pcm" and new_encoder(fmt).content_type == "audio/pcm"
    assert [content_type(f) for f in AUDIO_FORMATS] == [CONTENT_TYPES[f] for f in AUDIO_FORMATS]
    # Estimates of where bytes lie in the audio: exact for raw formats, the nominal bit rate else.
    assert nominal_bytes_per_second("pcm_16000") == 32000 and nominal_bytes_per_second("ulaw") == 8000
    assert nominal_bytes_per_second("mp3") == 8000 and nominal_bytes_per_second("flac") is None


def reference_at(x: np.ndarray, rate: int) -> np.ndarray:
    """The input at ``rate`` through an independent anti-aliased resampler (scipy's polyphase)."""
    from math import gcd

    g = gcd(rate, SR)
    return resample_poly(to_int16(x).astype(np.float64), rate // g, SR // g)


@pytest.mark.parametrize("fmt", list(RATE_FORMATS))
def test_pcm_at_other_rates(fmt: str) -> None:
    """s16le at the format's rate: the input's length at that rate, the tone at its level, the
    same bytes however the input was cut (the resampler's delay is carried across writes), and
    close to an independent resampler (measured at 440 Hz: 59 dB at 8 kHz to 69 dB at 48 kHz)."""
    rate = RATE_FORMATS[fmt]
    x = sine(amp=0.5)
    one_shot = whole(x, fmt)
    y = np.frombuffer(one_shot, "<i2")
    assert len(y) == round(N * rate / SR)
    assert abs(tone_level_db(y, FREQ, 0.5, rate)) < 0.1
    assert snr(y, reference_at(x, rate), edge=rate // 50) > 45.0
    for schedule in (SCHEDULE, [1] * 50 + [2, 3, 5, 7, 11, 13], [4799] * 5):
        data, _ = feed(new_encoder(fmt), x, schedule)
        assert data == one_shot, schedule


def test_pcm_at_lower_rates_is_anti_aliased() -> None:
    """A tone above the new Nyquist frequency is filtered out, not folded back: 10 kHz at 16 kHz
    would alias to 6 kHz at full level."""
    y = np.frombuffer(whole(sine(freq=10000.0, amp=0.5), "pcm_16000"), "<i2")
    assert tone_level_db(y, 6000.0, 0.5, 16000) < -50.0


# --- volume gain ------------------------------------------------------------------------


def test_gain_scales_amplitude() -> None:
    x = sine(1000, amp=0.2)
    np.testing.assert_allclose(apply_gain(x, 20 * np.log10(2)), 2 * x, rtol=1e-6)
    np.testing.assert_allclose(apply_gain(x, 6.0), 1.9953 * x, rtol=1e-4)
    np.testing.assert_allclose(apply_gain(x, -20.0), 0.1 * x, rtol=1e-6)
    assert apply_gain(x, 6.0).dtype == np.float32


def test_zero_gain_is_identity() -> None:
    x = sine(1000)
    assert apply_gain(x, 0.0) is x
    ints = to_int16(x)
    np.testing.assert_array_equal(to_int16(apply_gain(ints, 0.0)), ints)
    for fmt in ("pcm", "wav", "ulaw", "flac"):
        assert whole(x, fmt, gain_db=0.0) == whole(x, fmt)


def test_gain_on_int16_input() -> None:
    ints = to_int16(sine(1000, amp=0.25))
    out = to_int16(apply_gain(ints, 20 * np.log10(2)))
    assert np.max(np.abs(out.astype(np.int32) - 2 * ints.astype(np.int32))) <= 1


def test_gain_clips_at_full_scale() -> None:
    """+20 dB on a half-scale tone: samples past full scale clip at +-32767 (to_int16),
    they never wrap around to the other sign."""
    x = sine(SR // 10, amp=0.5)
    out = np.frombuffer(whole(x, "pcm", gain_db=20.0), "<i2")
    assert out.max() == 32767 and out.min() == -32767
    assert np.all(np.sign(out) == np.sign(to_int16(x)))
    assert np.mean(np.abs(out) == 32767) > 0.8  # 5x full scale: mostly clipped


def test_gain_is_per_chunk() -> None:
    """Stateless: a stream cut into chunks gets the same samples as one write."""
    x = sine(amp=0.3)
    data, _ = feed(new_encoder("pcm", gain_db=-7.5), x)
    assert data == whole(x, "pcm", gain_db=-7.5)
    np.testing.assert_array_equal(np.frombuffer(data, "<i2"), to_int16(apply_gain(x, -7.5)))


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_gain_in_every_format(fmt: str) -> None:
    """+6.02 dB doubles the decoded amplitude in every format (lossy ones within 3%)."""
    x = sine(amp=0.2)
    amps = []
    for db in (0.0, 20 * np.log10(2)):
        data, _ = feed(new_encoder(fmt, gain_db=db), x)
        y, rate = decode_av(data, fmt)
        amps.append(sine_fit(y[0], rate)[1])
    assert amps[1] / amps[0] == pytest.approx(2.0, rel=0.03), amps


@pytest.mark.parametrize("db", [GAIN_DB_RANGE[0] - 0.1, GAIN_DB_RANGE[1] + 0.1, float("nan"), float("inf")])
def test_gain_range(db: float) -> None:
    assert GAIN_DB_RANGE == (-30.0, 20.0)
    with pytest.raises(ValueError, match="gain"):
        apply_gain(sine(10), db)
    with pytest.raises(ValueError, match="gain"):
        new_encoder("pcm", gain_db=db)
    apply_gain(sine(10), GAIN_DB_RANGE[0])  # the bounds themselves are accepted
    apply_gain(sine(10), GAIN_DB_RANGE[1])


def test_a_file_of_known_length_has_true_wav_sizes_from_its_first_bytes() -> None:
    """Pieces through one encoder: the WAV header of a file whose length is known says it at once
    (a job's file is written front to back), and the bytes are the pieces' PCM in order."""
    a, b = sine(7200), np.zeros(2400, np.float32)
    parts = list(encode_file([a, b], "wav", samples=len(a) + len(b)))
    data = b"".join(parts)
    assert sf.info(io.BytesIO(data)).frames == len(a) + len(b)
    assert data[44:] == whole(np.concatenate([a, b]), "pcm")
