"""Tests for serve_app.engine.audio: streaming encoders round-trip through
PyAV (ffmpeg) and libsndfile decoders."""

from __future__ import annotations

import io
import subprocess

import av
import numpy as np
import pytest
import soundfile as sf

from serve_app.engine.audio import (
    AUDIO_FORMATS,
    CONTENT_TYPES,
    SAMPLE_RATE,
    AudioEncoder,
    encode_all,
    new_encoder,
    to_int16,
)

SR = SAMPLE_RATE
N = 2 * SR  # 2.0 s test signal
FREQ = 440.0
LOSSY = ("mp3", "opus", "aac")
LOSSLESS = ("flac", "wav", "pcm")

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

DEMUXERS = {"mp3": "mp3", "opus": "ogg", "aac": "aac", "flac": "flac", "wav": "wav", "pcm": "s16le"}


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
    opts = {"sample_rate": str(SR), "ch_layout": "mono"} if fmt == "pcm" else {}
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


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
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


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_encode_all_matches_stream_length(fmt: str) -> None:
    x = sine(SR // 2 + 37)
    y, rate = decode_av(encode_all(x, fmt), fmt)
    extra = y.shape[1] * SR / rate - len(x)
    lo, hi = EXTRA_SAMPLES.get(fmt, (0, 0))
    assert lo <= extra <= hi


@pytest.mark.parametrize("fmt", AUDIO_FORMATS)
def test_empty_stream(fmt: str) -> None:
    enc = new_encoder(fmt)
    data = enc.write(np.zeros(0, np.float32)) + enc.close()
    if fmt == "pcm":
        assert data == b""
    elif fmt == "wav":
        assert len(data) == 44
        assert decode_av(data, fmt)[0].size == 0
        assert len(sf_read_int16(data)) == 0


# --- sample conversion ---------------------------------------------------------


def test_pcm_is_s16le_of_input_with_clipping() -> None:
    x = np.array([-3.0, -1.0, -0.5, -1e-6, 0.0, 0.25, 0.5000153, 1.0, 1.5, np.nan], np.float32)
    expected = np.array([-32767, -32767, -16384, 0, 0, 8192, 16384, 32767, 32767, 0], "<i2")
    data = encode_all(x, "pcm")
    assert data == expected.tobytes()
    assert np.array_equal(np.frombuffer(data, "<i2"), expected)


def test_pcm_matches_input_samples() -> None:
    x = sine(1001)
    assert encode_all(x, "pcm") == np.rint(x * 32767).astype("<i2").tobytes()


def test_to_int16_shapes() -> None:
    assert to_int16(np.full((5, 1), 0.5)).shape == (5,)
    ints = np.array([1, -2, 3], np.int16)
    assert to_int16(ints) is ints  # int16 passes through
    with pytest.raises(ValueError):
        to_int16(np.zeros((5, 2), np.float32))


def test_wav_header_is_streamable() -> None:
    data = encode_all(sine(10), "wav")
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
    assert data[4:8] == b"\xff\xff\xff\xff" and data[40:44] == b"\xff\xff\xff\xff"
    assert data[44:] == encode_all(sine(10), "pcm")


# --- API ------------------------------------------------------------------------


def test_formats_and_content_types() -> None:
    assert AUDIO_FORMATS == ("mp3", "opus", "aac", "flac", "wav", "pcm")
    assert CONTENT_TYPES == {
        "mp3": "audio/mpeg",
        "opus": "audio/ogg",
        "aac": "audio/aac",
        "flac": "audio/flac",
        "wav": "audio/wav",
        "pcm": "audio/pcm",
    }
    for fmt in AUDIO_FORMATS:
        enc = new_encoder(fmt)
        assert isinstance(enc, AudioEncoder)
        assert enc.format == fmt and enc.content_type == CONTENT_TYPES[fmt]
        enc.close()


@pytest.mark.parametrize("fmt", ["ogg", "MP3", "", "vorbis"])
def test_unknown_format(fmt: str) -> None:
    with pytest.raises(ValueError, match="unknown audio format"):
        new_encoder(fmt)
    with pytest.raises(ValueError):
        encode_all(sine(10), fmt)


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


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac"])
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
