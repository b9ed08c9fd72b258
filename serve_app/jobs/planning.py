"""What a job will cost, from its normalised plan: every chunk planned at submission as the runner
will plan it (``Planner.plan`` / ``plan_script``, the TextNormalizer's limits), so the written
text never stands in for the audio (12-digit numbers read out are ~10x longer in English), and a
chunk the planner would refuse mid-job (``RequestTooLarge``: segments, speech or silence past the
per-request caps) is refused before the job is stored.

Plain Python, no torch; blocking: the Ingress calls ``JobPlanner.seconds`` in a thread, a
bounded piece of chunks at a time (``pieces``).
"""

from __future__ import annotations

import math
import threading
from typing import Iterator, Optional

from ..engine.audio import SAMPLE_RATE
from ..engine.config import SegmentConfig
from ..engine.errors import EmptyInputError, RequestTooLarge
from ..engine.planner import Planner, plan_seconds
from ..engine.types import ScriptPart, SynthesisOptions, Voice
from ..storage.jobs.model import PCM_BYTES_PER_SAMPLE, JobChunk

PIECE_CHARS = 20_000  # text planned per thread call: ~0.1-0.6 s of CPU, so a stop or a refusal comes soon


def script_parts(chunk: JobChunk, voices: list[Voice]) -> list[ScriptPart]:
    """A script chunk's parts as the planner takes them (``voices``: the job's, by index)."""
    return [
        ScriptPart(
            p.text,
            voices[p.voice],
            speed=p.speed,
            prompt=p.prompt,
            offset=p.offset,
            span=p.span,
            pause_before=p.pause_before,
            speaker=p.speaker,
            turn=p.turn,
        )
        for p in chunk.parts or []
    ]


def pieces(chunks: list[JobChunk], max_chars: int = PIECE_CHARS) -> Iterator[tuple[int, int]]:
    """[start, end) ranges of ``chunks`` of about ``max_chars`` characters each."""
    start, size = 0, 0
    for k, chunk in enumerate(chunks):
        size += len(chunk.text) + 1
        if size >= max_chars:
            yield start, k + 1
            start, size = k + 1, 0
    if start < len(chunks):
        yield start, len(chunks)


def reservation(seconds: float, chapters: bool, headroom: float) -> tuple[int, int]:
    """(the chunks' PCM at most, the bytes the job reserves): the planned audio with ``headroom``
    (real weights end near the planned length, not on it), twice over with chapters (each
    chapter's file is a second copy of the audio)."""
    pcm = PCM_BYTES_PER_SAMPLE * math.ceil(seconds * (1.0 + headroom) * SAMPLE_RATE)
    return pcm, pcm * (2 if chapters else 1)


class JobPlanner:
    """The engine's planner with the TextNormalizer's limits, made on first use (its rule tables
    load once), one thread at a time (the text front end keeps state)."""

    def __init__(self, limits: SegmentConfig):
        self.limits = limits
        self._planner: Optional[Planner] = None
        self._lock = threading.Lock()

    def seconds(
        self,
        chunks: list[JobChunk],
        start: int,
        end: int,
        options: SynthesisOptions,
        voice: Optional[Voice],
        voices: list[Voice],
        client: str,
        seen: Optional[dict[str, float]] = None,
    ) -> list[float]:
        """Chunks [start, end)'s planned audio (speech, the plan's silence and the pause after
        each), seconds; ``RequestTooLarge`` naming the first chunk the planner refuses. ``seen``:
        a plain chunk's text -> its seconds (a run of one character is many equal chunks)."""
        with self._lock:
            if self._planner is None:
                planner = Planner(self.limits)
                planner.warmup()
                self._planner = planner
            return [self._one(k, chunks[k], options, voice, voices, client, seen) for k in range(start, end)]

    def _one(
        self,
        k: int,
        chunk: JobChunk,
        options: SynthesisOptions,
        voice: Optional[Voice],
        voices: list[Voice],
        client: str,
        seen: Optional[dict[str, float]],
    ) -> float:
        assert self._planner is not None
        if chunk.parts is None and seen is not None and chunk.text in seen:
            return seen[chunk.text] + chunk.pause_after
        opts = options.model_copy(update={"seed": chunk.seed})
        try:
            if chunk.parts is not None:
                plan = self._planner.plan_script(script_parts(chunk, voices), opts, client=client)
            else:
                plan = self._planner.plan(chunk.text, opts, voice, client=client)
            own = plan_seconds(plan)
        except EmptyInputError:
            own = 0.0  # the runner makes it an empty chunk
        except RequestTooLarge as exc:
            raise RequestTooLarge(
                f"chunk {k} of the job (from {chunk.text[:40]!r}) is too large for one synthesis: {exc}"
            ) from None
        if chunk.parts is None and seen is not None:
            seen[chunk.text] = own
        return own + chunk.pause_after
