"""What a job will cost, from its normalised plan: every chunk planned at submission as the runner
will plan it (``Planner.plan`` / ``plan_script``, the TextNormalizer's limits), so the written
text never stands in for the audio (12-digit numbers read out are ~10x longer in English), and a
chunk the planner would refuse mid-job (``RequestTooLarge``: segments, speech or silence past the
per-request caps) is refused before the job is stored.

A job is charged as a whole (``JobCost``): what a lexicon adds to its text, across all its chunks,
is bounded by ``jobs.max_input_chars`` (each chunk's by the request's budget as well), and a job
none of whose chunks says anything is refused.

Plain Python, no torch; blocking: the Ingress calls ``JobPlanner.count`` in a thread, a bounded
piece of chunks at a time (``pieces``).
"""

from __future__ import annotations

import math
import threading
from typing import Callable, Iterator, Optional

from ..engine.audio import SAMPLE_RATE
from ..engine.config import SegmentConfig
from ..engine.errors import EmptyInputError, RequestTooLarge
from ..engine.planner import Planner, plan_seconds
from ..engine.text.lexicon import LexiconBudget
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


class JobCost:
    """A job's plan counted across its chunks, a piece at a time: its audio (``seconds``), the
    chunks that say something (``spoken``: none, and the job is refused before it is stored), and
    what a lexicon adds to all of them together (``lexicon``): at most ``growth_chars``, the job's
    own input limit, so a job read through a lexicon plans at most twice its largest text, as a
    request does (each chunk's growth is also bounded as a request's, as the runner plans it)."""

    def __init__(self, growth_chars: int):
        self.seconds = 0.0
        self.spoken = 0
        self.lexicon = LexiconBudget(growth_chars, setting="jobs.max_input_chars", what="the job's text")
        # A plain chunk's text -> (its seconds, what the lexicon added to it, whether it speaks):
        # a run of one character is many equal chunks, planned once and counted each time.
        self.seen: dict[str, tuple[float, int, bool]] = {}


class JobPlanner:
    """The engine's planner with the TextNormalizer's limits: one per thread (the text front end
    keeps state), made on its first use there (its rule tables load once per thread), so the
    submissions of different keys never queue on one planner."""

    def __init__(self, limits: SegmentConfig):
        self.limits = limits
        self._local = threading.local()

    def _planner(self) -> Planner:
        planner = getattr(self._local, "planner", None)
        if planner is None:
            planner = Planner(self.limits)
            planner.warmup()
            self._local.planner = planner
        return planner

    def count(
        self,
        chunks: list[JobChunk],
        start: int,
        end: int,
        options: SynthesisOptions,
        voice: Optional[Voice],
        voices: list[Voice],
        client: str,
        cost: JobCost,
        check: Callable[[], None] = lambda: None,
    ) -> None:
        """Count chunks [start, end) into ``cost``: their planned audio (speech, the plan's silence
        and the pause after each) and their lexicon growth; ``RequestTooLarge`` naming the first
        chunk the planner refuses, ``InputTooLong`` once the job's growth passes its budget.
        ``check``: called before each chunk (it raises to stop: the submission was cancelled)."""
        planner = self._planner()
        for k in range(start, end):
            check()
            self._one(planner, k, chunks[k], options, voice, voices, client, cost)

    def _one(
        self,
        planner: Planner,
        k: int,
        chunk: JobChunk,
        options: SynthesisOptions,
        voice: Optional[Voice],
        voices: list[Voice],
        client: str,
        cost: JobCost,
    ) -> None:
        known = cost.seen.get(chunk.text) if chunk.parts is None else None
        if known is not None:
            own, grown, speaks = known
            cost.lexicon.charge(grown)
        else:
            opts = options.model_copy(update={"seed": chunk.seed})
            before = cost.lexicon.left
            speaks = True
            try:
                if chunk.parts is not None:
                    plan = planner.plan_script(script_parts(chunk, voices), opts, client=client, growth=cost.lexicon)
                else:
                    plan = planner.plan(chunk.text, opts, voice, client=client, growth=cost.lexicon)
                own = plan_seconds(plan)
            except EmptyInputError:
                own, speaks = 0.0, False  # the runner makes it an empty chunk
            except RequestTooLarge as exc:
                if cost.lexicon.exhausted:
                    raise  # the job's own budget, not this chunk's
                raise type(exc)(
                    f"chunk {k} of the job (from {chunk.text[:40]!r}) is too large for one synthesis: {exc}"
                ) from None
            grown = before - cost.lexicon.left
            if chunk.parts is None:
                cost.seen[chunk.text] = (own, grown, speaks)
        cost.seconds += own + chunk.pause_after
        cost.spoken += speaks
