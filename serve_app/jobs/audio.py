"""A finished job's files: its chunks' PCM in order with their pauses, encoded once into the whole
file (and, made with chapters, each chapter's), with captions moved to where each chunk lies.
Run by the job runner off its event loop, once every chunk is stored."""

from __future__ import annotations

from typing import Any, Iterator

from ..engine.audio import SAMPLE_RATE
from ..storage.jobs import JobChunk, StoredJob

SAMPLE_BYTES = 2


def write_audio(store: Any, job: StoredJob, chunks: list[JobChunk]) -> int:
    """The whole file, then (made with chapters) each chapter's, and where each chapter lies in
    the whole file (``job.chapter_times``); made with captions, each file's captions too. The
    bytes written."""
    size = store.put_audio(job, _encoded(store, job, chunks, 0, len(chunks)))
    if job.captions:
        size += store.put_captions(job, _captions(store, job, chunks, 0, len(chunks)))
    times = []
    at = 0
    for n, (first, end) in enumerate(job.chapter_spans() if job.chapter_titles else []):
        size += store.put_audio(job, _encoded(store, job, chunks, first, end, trailing_pause=False), chapter=n)
        if job.captions:
            size += store.put_captions(job, _captions(store, job, chunks, first, end), chapter=n)
        own = sum(max(0, job.chunk_samples[k]) for k in range(first, end)) + sum(_pauses(chunks, first, end, False))
        times.append((round(at / SAMPLE_RATE, 6), round(own / SAMPLE_RATE, 6)))
        at += own + _pause_samples(chunks[end - 1])
    job.chapter_times = times
    return size


def _captions(store: Any, job: StoredJob, chunks: list[JobChunk], first: int, end: int) -> str:
    """Captions of the file made from chunks [first, end): each chunk's segments moved to where
    the chunk starts in that file (the chunks before it and their pauses)."""
    from ..engine.captions import TimedText, caption_file

    items: list[TimedText] = []
    at = 0
    for k, pause in zip(range(first, end), _pauses(chunks, first, end, True)):
        for start, stop, text, *speaker in store.read_timing(job, k):
            items.append(TimedText((at + start) / SAMPLE_RATE, (at + stop) / SAMPLE_RATE, text, *speaker))
        at += max(0, job.chunk_samples[k]) + pause
    return caption_file(items, job.captions)


def _pause_samples(chunk: JobChunk) -> int:
    return int(round(chunk.pause_after * SAMPLE_RATE))


def _pauses(chunks: list[JobChunk], first: int, end: int, trailing_pause: bool) -> list[int]:
    pauses = [_pause_samples(chunks[k]) for k in range(first, end)]
    if not trailing_pause and pauses:
        pauses[-1] = 0
    return pauses


def _encoded(
    store: Any, job: StoredJob, chunks: list[JobChunk], first: int, end: int, trailing_pause: bool = True
) -> Iterator[bytes]:
    """A file's bytes from chunks [first, end): their PCM in order with their pauses (the last
    one's only with ``trailing_pause``), one chunk in memory at a time, through the engine's
    encoder (``encode_file``: a WAV's header carries its true size at once)."""
    import numpy as np

    from ..engine.audio import encode_file

    pauses = _pauses(chunks, first, end, trailing_pause)
    total = sum(max(0, job.chunk_samples[k]) for k in range(first, end)) + sum(pauses)

    def pieces() -> Iterator[np.ndarray]:
        for k, pause in zip(range(first, end), pauses):
            yield np.frombuffer(store.read_chunk(job, k), dtype="<i2")
            yield np.zeros(pause, dtype=np.int16)

    return encode_file(pieces(), job.response_format, samples=total)
