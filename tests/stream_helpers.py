"""Helpers shared by the WebSocket session tests (test_realtime.py in-process, test_serve_ws.py
through Serve): text cut as an LLM streams it, and comparing session audio with one request's."""

from __future__ import annotations

import random

import numpy as np


def deltas(text: str, seed: int = 0) -> list[str]:
    """The text in pieces of 1-6 characters: cuts fall mid-word and mid-sentence, as LLM tokens do."""
    rng = random.Random(seed)
    out, pos = [], 0
    while pos < len(text):
        n = rng.randint(1, 6)
        out.append(text[pos:pos + n])
        pos += n
    return out


def assert_same_audio(pcm: bytes, reference: bytes) -> None:
    """The same tokens, decoded the same way: sample for sample, within the rounding of float
    matmuls over batches of other sizes (a session's rows share decode steps with other rows than
    one request's do), which moves a few int16 samples by one."""
    a = np.frombuffer(pcm, "<i2").astype(np.int32)
    b = np.frombuffer(reference, "<i2").astype(np.int32)
    assert len(a) == len(b)
    diff = np.abs(a - b)
    assert diff.max() <= 2 and (diff > 0).mean() < 0.01, (int(diff.max()), float((diff > 0).mean()))
