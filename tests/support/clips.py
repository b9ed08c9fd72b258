"""Reference clips for the voice tests: a voiced, syllable-like signal (not silence, not a pure
tone), encoded in any container PyAV writes."""

from __future__ import annotations

import io

import av
import numpy as np

SR = 24000


def speechlike(seconds: float, sr: int = SR, f0: float = 140.0, seed: int = 0) -> np.ndarray:
    """Harmonics of a gliding pitch, gated into ~4 syllables a second, plus a little noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sr)) / sr
    pitch = f0 * (1 + 0.1 * np.sin(2 * np.pi * 0.7 * t))
    phase = 2 * np.pi * np.cumsum(pitch) / sr
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8))
    gate = np.clip(np.sin(2 * np.pi * 4 * t), 0, None) ** 0.5
    return (0.2 * voiced * gate + 0.003 * rng.standard_normal(len(t))).astype(np.float32)


# PyAV container format and codec per file kind.
_CODECS = {
    "wav": ("wav", "pcm_s16le"),
    "mp3": ("mp3", "libmp3lame"),
    "flac": ("flac", "flac"),
    "ogg": ("ogg", "libopus"),
    "m4a": ("ipod", "aac"),
}


def encode(pcm: np.ndarray, kind: str, rate: int = SR, channels: int = 1) -> bytes:
    """``pcm`` (mono float32 at 24 kHz) as a file of ``kind`` (wav, mp3, flac, ogg, m4a) at
    ``rate`` Hz (Opus: always 48 kHz) with ``channels`` channels (the same signal in each)."""
    fmt, codec = _CODECS[kind]
    rate = 48000 if codec == "libopus" else rate
    if rate != SR:
        pcm = np.interp(np.arange(int(len(pcm) * rate / SR)) * SR / rate, np.arange(len(pcm)), pcm).astype(np.float32)
    buf = io.BytesIO()
    layout = "mono" if channels == 1 else "stereo"
    with av.open(buf, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        planar = np.tile(pcm, (channels, 1)).astype(np.float32)
        frame_size = stream.codec_context.frame_size or 1024
        src_fmt = "fltp"
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout=layout, rate=rate)
        pts = 0
        for start in range(0, planar.shape[1], frame_size):
            part = np.ascontiguousarray(planar[:, start : start + frame_size])
            frame = av.AudioFrame.from_ndarray(part, format=src_fmt, layout=layout)
            frame.sample_rate = rate
            frame.pts = pts
            pts += part.shape[1]
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


# What the reference clips of the voice tests say (their transcript).
TRANSCRIPT = "这是一段参考音频，用来克隆声音。"
