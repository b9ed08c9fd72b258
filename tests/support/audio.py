"""Audio in tests: decoding what the service answers (PyAV for every format, libsndfile for WAV)
and comparing it (lengths to the sample, SNR)."""

from __future__ import annotations

import io

import numpy as np

from serve_app.engine.audio import SAMPLE_RATE

SR = SAMPLE_RATE  # 24 kHz mono everywhere except Opus, which always decodes at 48 kHz
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
RAW_RATES = {"pcm": SR, "ulaw": 8000, "alaw": 8000}  # headerless formats: the demuxer is told the rate
LOSSY = ("mp3", "opus", "aac")


def decode_av(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decode a whole answer with PyAV (ffmpeg); (samples as [channels, n], sample rate). Mono
    only; ``pcm`` is raw s16le at 24 kHz, ``ulaw`` / ``alaw`` raw G.711 at 8 kHz."""
    import av

    opts = {"sample_rate": str(RAW_RATES[fmt]), "ch_layout": "mono"} if fmt in RAW_RATES else {}
    with av.open(io.BytesIO(data), format=DEMUXERS[fmt], options=opts) as c:
        stream = c.streams.audio[0]
        assert stream.codec_context.channels == 1, f"{fmt}: expected mono"
        frames = [f.to_ndarray().reshape(f.layout.nb_channels, -1) for f in c.decode(stream)]
        rate = stream.codec_context.sample_rate
    return (np.concatenate(frames, axis=1) if frames else np.zeros((1, 0), np.int16)), rate


def assert_duration(data: bytes, fmt: str, expected: int) -> float:
    """The answer decodes to ``expected`` samples (24 kHz): exactly where the format can say its
    length, within the encoder's priming and padding for mp3 (48-72 ms), aac (43-85 ms) and opus
    (trimmed exactly, but at 48 kHz). Returns its seconds."""
    if fmt == "pcm":
        assert len(data) % 2 == 0, "pcm must be whole 16-bit samples"
    samples, rate = decode_av(data, fmt)
    samples = samples.shape[1]
    assert samples > 0, f"{fmt}: nothing decoded"
    assert rate == {"opus": 48000, "ulaw": 8000, "alaw": 8000}.get(fmt, SR), f"{fmt}: sample rate {rate}"
    got, want = samples / rate, expected / SR
    if fmt in ("ulaw", "alaw"):  # resampled to 8 kHz: a third of the samples, within the resampler's rounding
        assert abs(samples - expected / 3) <= 2, f"{fmt}: {samples} samples at 8 kHz for {expected} at 24 kHz"
    elif fmt in LOSSY:
        assert want - 0.005 <= got <= want + 0.1, f"{fmt}: {got:.4f} s, expected {want:.4f} s (+<=0.1)"
    else:
        assert samples == expected, f"{fmt}: {samples} samples, expected {expected}"
    return got


def read_wav(data: bytes) -> np.ndarray:
    """A 24 kHz mono WAV's samples (int16), through libsndfile."""
    import soundfile as sf

    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:16]
    pcm, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == SR and pcm.ndim == 1
    return pcm


def snr_db(ref: np.ndarray, y: np.ndarray) -> float:
    err = np.sum((ref.astype(np.float64) - y) ** 2)
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(err, 1e-30)))
