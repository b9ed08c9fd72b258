"""A job the runner holds (``runner.py``): its state, its chunks, what is
left and what runs, and how much PCM its running chunks may still make (its reservation)."""

from __future__ import annotations

import asyncio
import time

from ..engine.types import ScriptPart, Voice
from ..storage.jobs import JobChunk, StoredJob
from ..storage.jobs.model import JobScript
from .audio import SAMPLE_BYTES
from .planning import script_parts


class ReservationExceeded(Exception):
    """The job's audio outgrew what it reserved of its owner's quota."""


class RunningJob:
    """A job the runner holds: its state, its chunks, what is left and what runs."""

    def __init__(self, job: StoredJob, script: JobScript, done: dict[int, int]):
        chunks = script.chunks
        self.job = job
        self.chunks = chunks
        job.chunks_total = len(chunks)
        job.chunk_samples = [done.get(k, -1) for k in range(len(chunks))]
        job.chars_done = sum(len(c.text) for k, c in enumerate(chunks) if k in done)
        job.bytes = job.input_bytes + SAMPLE_BYTES * job.audio_samples
        self.pending = [k for k in range(len(chunks)) if k not in done]  # in order
        self.tasks: dict[int, asyncio.Task] = {}
        self.options = job.synthesis_options()
        self.voice = Voice(**script.voice)
        self.script_voices = [Voice(**v) for v in script.script_voices]  # an SSML or dialogue job's
        self.streaming: dict[int, int] = {}  # chunk -> PCM bytes it has streamed so far (not stored yet)
        self.save_lock = asyncio.Lock()
        job.run_started_at, job.run_chars_start = time.time(), job.chars_done
        self.stopped = False
        self.finishing = False

    def script_parts(self, chunk: JobChunk) -> list[ScriptPart]:
        return script_parts(chunk, self.script_voices)

    def check_room(self, k: int, more: int) -> None:
        """``ReservationExceeded`` when chunk ``k``'s ``more`` bytes take the job's PCM (stored,
        and streaming in its other chunks) past its limit (0: a job made before limits)."""
        limit = self.job.pcm_limit_bytes
        if not limit:
            return
        self.streaming[k] = more
        pcm = SAMPLE_BYTES * self.job.audio_samples + sum(self.streaming.values())
        if pcm > limit:
            raise ReservationExceeded(
                f"the job's audio passed its reservation at chunk {k}: {pcm} bytes of PCM, {limit} reserved "
                "(its normalised plan with jobs.reservation_headroom)"
            )

    @property
    def complete(self) -> bool:
        return self.job.chunks_done == len(self.chunks)
