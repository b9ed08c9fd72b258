"""RIFF/WAVE headers of 16-bit mono PCM (standard library only: the client uses it too).

A streamed WAV starts before its length is known, so its sizes say "unknown" (0xFFFFFFFF:
ffmpeg and libsndfile read the data to EOF); a whole answer (a file, a handle's bytes, a cached
response) carries its true sizes (``with_true_length``), which every reader needs.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

HEADER_BYTES = 44
UNKNOWN_SIZE = 0xFFFFFFFF


def wav_header(sample_rate: int, data_bytes: int = UNKNOWN_SIZE) -> bytes:
    fmt_chunk = struct.pack("<HHIIHH", 1, 1, sample_rate, sample_rate * 2, 2, 16)
    riff = UNKNOWN_SIZE if data_bytes == UNKNOWN_SIZE else HEADER_BYTES - 8 + data_bytes
    return (
        b"RIFF"
        + struct.pack("<I", riff)
        + b"WAVE"
        + b"fmt "
        + struct.pack("<I", len(fmt_chunk))
        + fmt_chunk
        + b"data"
        + struct.pack("<I", data_bytes)
    )


def is_wav(data: bytes) -> bool:
    return len(data) >= HEADER_BYTES and data[:4] == b"RIFF" and data[8:12] == b"WAVE" and data[36:40] == b"data"


def true_header(header: bytes, total_bytes: int) -> bytes:
    """The header of a WAV of ``total_bytes`` bytes (header included), its sizes made true."""
    body = total_bytes - HEADER_BYTES
    return header[:4] + struct.pack("<I", HEADER_BYTES - 8 + body) + header[8:40] + struct.pack("<I", body)


def finish_file(f: BinaryIO, total_bytes: int) -> None:
    """A streamed WAV written whole to the seekable ``f`` (``w+b``): its header's sizes made true."""
    f.seek(0)
    header = f.read(HEADER_BYTES)
    if is_wav(header):
        f.seek(0)
        f.write(true_header(header, total_bytes))
    f.seek(0, 2)


def with_true_length(data: bytes) -> bytes:
    """A whole WAV answer with its true sizes; anything that is not our WAV as it is."""
    if not is_wav(data):
        return data
    return true_header(data[:HEADER_BYTES], len(data)) + data[HEADER_BYTES:]
