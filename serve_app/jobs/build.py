"""A job request read into what a job is made of (``service.py`` stores it): admitted (model,
length, voice, lexicon), its script read (SSML, turns: each distinct voice resolved once for the
caller), cut into chunks with their seeds, and every chunk planned as the runner will plan it to
size the job's reservation. Everything proportional to the input's size runs off the event loop."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..callers import Caller
from ..engine.errors import EmptyInputError, JobQuotaExceeded
from ..engine.types import ScriptPart, Voice
from ..engine.voices import effective_seed
from ..pipeline.admission import Admission
from ..pipeline.prepare import Preparation
from ..protocol import JobRequest
from ..settings import JobsConfig
from ..storage.jobs import JobLimits, JobStore, check_room
from ..storage.voices import VoiceCatalog
from .cutting import cut_script, cut_text, split_chapters
from .planning import JobCost, JobPlanner, pieces, reservation
from .script import emptied, job_parts
from .views import store_call
from .work import SubmissionWork


@dataclasses.dataclass
class BuiltJob:
    """A job request read, checked and cut, before it is planned and stored."""

    model: str
    response_format: str
    captions: Optional[str]
    options: Any  # SynthesisOptions, the seed the effective one
    headers: dict[str, str]
    voice: Voice
    voice_name: str
    script_voices: list[Voice]
    chunks: list
    chapters: Optional[list]
    used_bytes: int  # the owner's jobs' bytes when it was checked


def _turn_voices(turns: list) -> str:
    """A dialogue job's voice name: its turns' voices, each once, in order."""
    return "+".join(dict.fromkeys(t.voice for t in turns))[:200]


class JobBuilder:
    """``planner``: the job planner with the TextNormalizer's limits (``args.segments``), which
    the runner's chunks are planned with too. ``admission``: no busy switch, no stream slot (the
    runner paces the chunks)."""

    def __init__(self, cfg: JobsConfig, limits: JobLimits, store: JobStore, voices: VoiceCatalog, planner: JobPlanner):
        self.cfg = cfg
        self.limits = limits
        self.store = store
        self.voices = voices
        self.planner = planner
        self.admission = Admission(voices)
        self.preparation = Preparation(self.admission, cfg.max_input_chars)

    async def build(self, req: JobRequest, caller: Caller, work: SubmissionWork) -> BuiltJob:
        """The request read into the job's chunks (and its voices), every piece of it checked;
        its work off the loop through ``work``."""
        # Prepared as every door prepares a request: model, length, voice (the caller's own),
        # lexicon (its entries go into the job's options: a later edit does not change it), then
        # its script (instructions, SSML, turns: a malformed document is a 400 before anything is
        # stored), read off the loop, each distinct voice resolved once. A job's priority is the
        # service's (jobs.priority), not the request's.
        prepared = await self.preparation.prepare(req, caller, priority=False, off_loop=work.run)
        used = await store_call(self.store.usage, caller.owner)
        check_room(used, self.limits, 1)  # again: the body took a while
        script, voice = prepared.script, prepared.voice
        options, headers, chapters = script.options, script.headers, None
        seed = effective_seed(voice, options.seed)  # fixed now: every chunk's seed follows from it
        script_voices: list[Voice] = []
        voice_name = voice.name
        if script.parts is not None:
            silence = self.planner.limits.max_silence_seconds
            script_voices, chunks = await work.run(self._cut_script, script.parts, seed, silence)
            if req.turns is not None:
                voice_name = await work.run(_turn_voices, req.turns)
            # The turns and parts are cut into the chunks now: freed off the loop, an item at a time.
            await work.run(emptied, req.turns or [], script.parts)
        else:
            chunks, chapters = await work.run(self._cut, req, seed)
        options = options.model_copy(update={"seed": seed, "priority": self.cfg.priority})
        if not chunks:
            raise EmptyInputError("input has nothing to speak (only punctuation, symbols or whitespace)")
        return BuiltJob(
            req.model,
            req.response_format,
            req.captions,
            options,
            headers,
            voice,
            voice_name,
            script_voices,
            chunks,
            chapters,
            used.bytes,
        )

    def _cut_script(self, parts: list[ScriptPart], seed: int, max_silence_s: float) -> tuple[list[Voice], list]:
        voices, job_parts_ = job_parts(parts)
        return voices, cut_script(job_parts_, seed, self.cfg.chunk_chars, max_silence_s)

    async def planned_seconds(
        self,
        chunks: list,
        options: Any,
        voice: Voice,
        script_voices: list[Voice],
        owner: str,
        chapters: bool,
        room: int,
        work: SubmissionWork,
    ) -> float:
        """The job's planned audio (``JobPlanner``), a piece of chunks per thread call, charged as
        a whole (``JobCost``): a chunk the runner's planner would refuse is a 413 now, so is a
        lexicon that grows the whole job past ``jobs.max_input_chars``; planning stops with a 409 as
        soon as the reservation passes the owner's room; a job with nothing to say is a 400."""
        cost = JobCost(self.cfg.max_input_chars)
        for start, end in pieces(chunks):
            await work.run(
                self.planner.count, chunks, start, end, options, voice, script_voices, owner, cost, work.check
            )
            needed = reservation(cost.seconds, chapters, self.cfg.reservation_headroom)[1]
            if needed > room:
                raise JobQuotaExceeded(
                    f"this job needs {'at least ' if end < len(chunks) else ''}{needed} bytes (its normalised plan: "
                    f"{cost.seconds:.0f} s of audio so far{', twice with chapters' if chapters else ''}, with "
                    f"jobs.reservation_headroom); your jobs have {max(0, room)} bytes of room "
                    "(jobs.max_bytes_per_key): delete finished ones or send less text"
                )
        if not cost.spoken:
            raise EmptyInputError("input has nothing to speak: every chunk of it plans to silence or nothing")
        return cost.seconds

    def _cut(self, req: JobRequest, seed: int) -> tuple[list, Optional[list]]:
        """The job's chunks, and its chapters when asked for (``split_chapters``)."""
        chapters = split_chapters(req.input) if req.chapters else None
        chunks = cut_text(
            req.input,
            seed,
            self.cfg.chunk_chars,
            self.cfg.paragraph_pause_s,
            chapters,
            self.cfg.chapter_pause_s if chapters else 0.0,
        )
        return chunks, chapters
