"""Hostile inputs built by hand (where no encoder would write them): speaker strings that inflate
far beyond a speaker, and clips that would inflate when decoded."""

from __future__ import annotations

import functools
import lzma
import struct

import numpy as np
import pybase16384 as b14

MiB = 1 << 20

FAST = [{"id": lzma.FILTER_LZMA2, "preset": 1}]  # any LZMA2 encoder's stream decodes alike; preset 1 is quick
CHATTTS = [{"id": lzma.FILTER_LZMA2, "preset": 9 | lzma.PRESET_EXTREME}]  # what ChatTTS's own encoder uses


def raw_lzma(data: bytes, filters=FAST) -> bytes:
    return lzma.compress(data, format=lzma.FORMAT_RAW, filters=filters)


def speaker_vec(seed: int = 0, scale: float = 1.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(768) * scale).astype(np.float16)


@functools.lru_cache(maxsize=None)
def speaker_bombs() -> dict[str, str]:
    """Speaker strings that inflate far beyond a speaker, each shape under the length bound."""
    real = speaker_vec(7).tobytes()
    ok = raw_lzma(real, CHATTTS)
    return {
        "zeros 8 MiB": b14.encode_to_string(raw_lzma(b"\0" * 8 * MiB)),
        "zeros 11 MiB": b14.encode_to_string(raw_lzma(b"\0" * 11 * MiB)),
        "a real speaker, then 1 MiB more in its stream": b14.encode_to_string(raw_lzma(real + b"\0" * MiB)),
        "a real speaker, then a bomb stream": b14.encode_to_string(ok + raw_lzma(b"\0" * MiB)),
        "a real speaker, then an empty stream": b14.encode_to_string(ok + b"\x00"),
        "two half speakers": b14.encode_to_string(raw_lzma(real[:768]) + raw_lzma(real[768:])),
        "one byte short": b14.encode_to_string(raw_lzma(real[:-1])),
        "one byte long": b14.encode_to_string(raw_lzma(real + b"\0")),
        "two speakers": b14.encode_to_string(raw_lzma(real * 2)),
    }


def ima_adpcm_wav(rate: int, channels: int = 1, block_align: int = 2048, blocks: int = 4) -> bytes:
    """IMA-ADPCM WAV (format 0x11) declaring ``rate``: each block is one frame of
    (block_align - 4 ch) * 2 / ch + 1 samples (4089 for 2048 mono)."""
    spb = (block_align - 4 * channels) * 2 // channels + 1
    fmt = struct.pack("<HHIIHHHH", 0x11, channels, rate, max(1, rate * block_align // spb), block_align, 4, 2, spb)
    rng = np.random.default_rng(0)
    data = b"".join(
        b"\0\0\0\0" * channels + rng.integers(0, 256, block_align - 4 * channels, np.uint8).tobytes()
        for _ in range(blocks)
    )
    body = (
        b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt))
        + fmt
        + b"fact"
        + struct.pack("<II", 4, spb * blocks)
        + b"data"
        + struct.pack("<I", len(data))
        + data
    )
    return b"RIFF" + struct.pack("<I", len(body)) + body
