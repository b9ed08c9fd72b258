"""ChatTTS speaker strings made from vectors in tests: ``engine/voices.py``'s ``decode_speaker``
the other way (``Speaker._encode`` without torch)."""

from __future__ import annotations

import lzma

import numpy as np

from serve_app.engine.voices import SPEAKER_LZMA_FILTERS


def encode_speaker(vec: np.ndarray) -> str:
    """A speaker vector -> ChatTTS's speaker string."""
    import pybase16384 as b14

    raw = np.asarray(vec, dtype=np.float16).tobytes()
    return b14.encode_to_string(lzma.compress(raw, format=lzma.FORMAT_RAW, filters=SPEAKER_LZMA_FILTERS))
