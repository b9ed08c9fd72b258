"""The jobs API behind ``/v1/audio/jobs`` (the Ingress's routes call it; no torch here): long
texts spoken in the background (``deployments/job_runner.py``'s runner) into one file kept in the job store
(``storage/jobs/``).

``POST /v1/audio/jobs`` takes the text as JSON (``JobRequest``: ``input`` and the speech
options), as ``text/plain`` (the body is the text, the options are query parameters) or as a
multipart form (a ``file`` part, or an ``input`` field, and the options as fields). Everything is
checked before the job is stored, the cheap refusals first (a caller without a key, the owner's
active jobs and room, before the body is read; the model and the length, ``jobs.max_input_chars``);
then (``job_build.py``), off the event loop, the script is read (SSML, turns; each distinct voice
resolved once for the caller and kept with the job), cut into chunks, each with its seed, and every
chunk planned as the runner will plan it: the job reserves its planned audio
(``planning.py``), and answers 202 ``queued``.

Every job belongs to the caller that made it (``Caller.owner``): another key's id answers 404
exactly like a missing one, and an admin key sees every key's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from typing import Any, Callable, Optional

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ..callers import Caller
from ..engine.audio import CONTENT_TYPES
from ..engine.captions import CAPTION_TYPES
from ..engine.config import SegmentConfig
from ..engine.errors import JobError, JobNotReady, UnknownJobError
from ..errors import APIError, as_api_error
from ..protocol import (
    AudioJob,
    AudioJobDeleted,
    AudioJobList,
)
from ..settings import JobsConfig
from ..storage.jobs import (
    JOB_ID_RE,
    StoredJob,
    audio_file_name,
    captions_file_name,
    check_room,
    job_limits,
    make_job_store,
    new_job_id,
)
from ..storage.lexicons import LexiconBook
from ..storage.voices import ANONYMOUS, VoiceCatalog
from .build import BuiltJob, JobBuilder
from .cutting import chapter_first_chunks
from .planning import JobPlanner, reservation
from .request import read_job_request
from .script import CollectorDeferred, emptied
from .views import JOBS_PATH, file_response, job_view, not_found, store_call

log = logging.getLogger("ray.serve")

RUNNER_PING_S = 5.0  # how soon a restarted runner (or a new app version's settings) is told the settings
RUNNER_CALL_S = 5.0


class JobsService:
    """The store (read, listed and written here) and the application's runner (told of new
    jobs, of cancels, and every few seconds of the settings and stages it runs with).

    ``segments``: the TextNormalizer's limits (``args.segments``): a job is planned at
    submission with them, as the runner's chunks will be. ``runner``: the runner's handle
    (tests without Ray pass their own); else ``find_runner()`` finds or makes the application's
    (the Ray layer's ``job_runner``, bound to this app), again whenever it is unreachable."""

    def __init__(
        self,
        cfg: JobsConfig,
        normalizer: Any,
        vocoder: Any,
        voices: VoiceCatalog,
        segments: Optional[SegmentConfig] = None,
        runner: Any = None,
        find_runner: Optional[Callable[[], Any]] = None,
    ):
        self.cfg = cfg
        self.limits = job_limits(cfg)
        self.store = make_job_store(cfg)
        self.voices = voices
        self.builder = JobBuilder(cfg, self.limits, self.store, voices, JobPlanner(segments or SegmentConfig()))
        self._submitting: set[str] = set()  # owners with a submission being read and planned here
        self._runner_args = (cfg, normalizer, vocoder)
        self._find_runner = find_runner
        if runner is not None:
            self.runner, self._keeper = runner, None
        else:
            assert find_runner is not None, "the Ray layer passes how to find the job runner"
            self.runner = find_runner()
            self._keeper = asyncio.get_event_loop().create_task(self._keep_runner())

    @property
    def lexicons(self) -> Optional[LexiconBook]:
        """The Ingress's lexicon store (None: lexicons off), set once it has one."""
        return self.builder.admission.lexicons

    @lexicons.setter
    def lexicons(self, book: Optional[LexiconBook]) -> None:
        self.builder.admission.lexicons = book

    async def _keep_runner(self) -> None:
        """Tell the runner our settings and stages now and then: a runner that outlived an older
        app version gets this one's, and one that died for good is made again."""
        cfg, normalizer, vocoder = self._runner_args
        while True:
            try:
                await asyncio.wait_for(
                    self.runner.configure.remote(cfg.model_dump(), normalizer, vocoder), RUNNER_CALL_S
                )
            except Exception as exc:  # noqa: BLE001 - restarting, or gone: find (or make) it again
                log.warning("jobs: runner unreachable (%s); looking it up again", exc.__class__.__name__)
                try:
                    self.runner = self._find_runner()
                except Exception:  # noqa: BLE001 - the next round
                    log.exception("jobs: could not reach the job runner")
            await asyncio.sleep(RUNNER_PING_S)

    async def _store(self, fn: Any, *args: Any) -> Any:
        return await store_call(fn, *args)

    def _check_caller(self, caller: Caller) -> None:
        """Without a key every caller is the one owner ``anonymous``: each would see, fetch and
        delete the others' jobs. Refused unless ``jobs.allow_anonymous`` (an admin, such as an
        in-cluster handle caller, sees every owner's jobs anyway)."""
        if caller.owner == ANONYMOUS and not caller.admin and not self.cfg.allow_anonymous:
            raise APIError(
                403,
                "jobs need an API key: every caller without one would share one owner and see, "
                "fetch and delete the others' jobs (configure keys, security.api_keys_*, or set "
                "jobs.allow_anonymous: true)",
                type="permission_error",
                code="jobs_need_api_key",
            )

    # ------------------------------------------------------------------ routes

    async def create(self, request: Request, caller: Caller) -> JSONResponse:
        """The cheap refusals first, from the headers and the owner's state alone (no key, the
        owner's active jobs and room, a submission of its own under way, the replica's
        submissions at once), then the body; everything proportional to its size (JSON, turns,
        SSML, voices, cutting, the plan) off the event loop, a bounded piece at a time."""
        self._check_caller(caller)
        try:
            check_room(await self._store(self.store.usage, caller.owner), self.limits, 1)
        except JobError as exc:
            raise as_api_error(exc) from None
        if caller.owner in self._submitting:
            raise APIError(
                429,
                "a job submission of this key is still being read; send the next once it is answered",
                type="rate_limit_error",
                code="job_submission_in_progress",
                headers={"Retry-After": "2"},
            )
        if len(self._submitting) >= self.cfg.max_submissions_at_once:
            raise APIError(
                503,
                f"{len(self._submitting)} job submissions are being read (at most "
                f"{self.cfg.max_submissions_at_once} at once, jobs.max_submissions_at_once); retry shortly",
                type="server_error",
                code="job_submissions_busy",
                headers={"Retry-After": "2"},
            )
        self._submitting.add(caller.owner)
        CollectorDeferred.submission(True)
        try:
            with CollectorDeferred():
                built = await self.builder.build(await read_job_request(request, self.cfg.max_upload_bytes), caller)
                # The request, its turns and parts are gone now: what is planned is the chunks
                # alone, freed off the loop once the job is stored (or refused).
                try:
                    return await self._create(built, caller, request.scope.get("root_path", ""))
                finally:
                    await asyncio.to_thread(emptied, built.chunks)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - typed errors keep their status (voice, quota, empty input)
            raise as_api_error(exc, "job creation failed", "job_failed") from None
        finally:
            self._submitting.discard(caller.owner)
            CollectorDeferred.submission(False)

    async def _create(self, built: BuiltJob, caller: Caller, root: str) -> JSONResponse:
        """Plan the built job, reserve its planned audio, store it and tell the runner."""
        chunks, chapters, voice, script_voices, options = (
            built.chunks,
            built.chapters,
            built.voice,
            built.script_voices,
            built.options,
        )
        seconds = await self.builder.planned_seconds(
            chunks,
            options,
            voice,
            script_voices,
            caller.owner,
            bool(chapters),
            self.limits.max_bytes - built.used_bytes,
        )
        pcm_limit, reserved = reservation(seconds, bool(chapters), self.cfg.reservation_headroom)
        now = time.time()
        job = StoredJob(
            id=new_job_id(),
            owner=caller.owner,
            model=built.model,
            voice_name=built.voice_name,
            options=options.model_dump(),
            response_format=built.response_format,
            captions=built.captions,
            created_at=now,
            updated_at=now,
            chunks_total=len(chunks),
            chunk_samples=[-1] * len(chunks),
            chars_total=sum(len(c.text) for c in chunks),
            reserved_bytes=reserved,
            pcm_limit_bytes=pcm_limit,
            chapter_titles=[title for title, _ in chapters or []],
            chapter_first_chunks=chapter_first_chunks(chunks) if chapters else [],
        )
        await self._store(
            self.store.create,
            job,
            chunks,
            self.limits,
            dataclasses.asdict(voice),
            [dataclasses.asdict(v) for v in script_voices],
        )
        self.runner.notify.remote()  # fire and forget: the runner also finds it at its next scan
        log.info(
            json.dumps(
                {
                    "event": "job_created",
                    "id": job.id,
                    "owner": job.owner,
                    "chunks": len(chunks),
                    "chars": job.chars_total,
                    "format": job.response_format,
                    "planned_s": round(seconds, 1),
                    "reserved_bytes": reserved,
                }
            )
        )
        headers = {"Location": f"{root}{JOBS_PATH}/{job.id}", **built.headers}
        return JSONResponse(job_view(job, root).model_dump(), status_code=202, headers=headers)

    async def get(self, job_id: str, caller: Caller, root: str = "") -> AudioJob:
        return job_view(await self._job(job_id, caller), root)

    async def list(self, caller: Caller, root: str = "") -> AudioJobList:
        self._check_caller(caller)
        jobs = await self._store(self.store.list, caller.owner, caller.admin)
        return AudioJobList(data=[job_view(j, root) for j in jobs])

    async def audio(self, job_id: str, caller: Caller) -> Response:
        """The finished file, with Range requests (``file_response``)."""
        job = await self._job(job_id, caller)
        if job.status != "succeeded":
            raise as_api_error(JobNotReady(f"job {job.id} is {job.status}; its audio is there once it has succeeded"))
        return await file_response(
            self.store, job, audio_file_name(job), CONTENT_TYPES[job.response_format], f"{job.id}.{job.response_format}"
        )

    async def cancel(self, job_id: str, caller: Caller, root: str = "") -> AudioJob:
        """Stop a queued or running job and keep it, ``cancelled`` (its rows leave the engine at
        its next step, its stored chunks go); a finished job is answered as it is."""
        job = await self._job(job_id, caller)
        if job.active:
            try:
                await asyncio.wait_for(self.runner.cancel.remote(job.id, True), RUNNER_CALL_S)
            except Exception as exc:  # noqa: BLE001 - the runner is restarting: the caller may retry
                log.warning("jobs: cancel of %s not delivered (%s)", job.id, exc.__class__.__name__)
                raise APIError(
                    503,
                    "the job runner is unavailable; retry shortly",
                    type="server_error",
                    code="job_runner_unavailable",
                    headers={"Retry-After": "2"},
                ) from None
            job = await self._job(job_id, caller)
        return job_view(job, root)

    async def captions(self, job_id: str, caller: Caller) -> Response:
        """The captions of the finished file (a job made with ``captions``)."""
        job = await self._succeeded(job_id, caller, "captions", captioned=True)
        return await file_response(
            self.store, job, captions_file_name(job), CAPTION_TYPES[job.captions], f"{job.id}.{job.captions}"
        )

    async def chapter_audio(self, job_id: str, chapter: int, caller: Caller) -> Response:
        """One chapter's file (a job made with ``chapters``), with Range requests."""
        job = await self._succeeded(job_id, caller, "chapters", chapter=chapter)
        return await file_response(
            self.store,
            job,
            audio_file_name(job, chapter),
            CONTENT_TYPES[job.response_format],
            f"{job.id}-{chapter}.{job.response_format}",
        )

    async def chapter_captions(self, job_id: str, chapter: int, caller: Caller) -> Response:
        """One chapter's captions, timed on its own file (a job made with ``chapters`` and ``captions``)."""
        job = await self._succeeded(job_id, caller, "captions", chapter=chapter, captioned=True)
        return await file_response(
            self.store,
            job,
            captions_file_name(job, chapter),
            CAPTION_TYPES[job.captions],
            f"{job.id}-{chapter}.{job.captions}",
        )

    async def _succeeded(
        self, job_id: str, caller: Caller, what: str, chapter: Optional[int] = None, captioned: bool = False
    ) -> StoredJob:
        """The caller's job, when it has ``what`` (its chapter ``chapter``, its captions) and has succeeded."""
        job = await self._job(job_id, caller)
        if chapter is not None and not 0 <= chapter < len(job.chapter_titles):
            raise as_api_error(
                UnknownJobError(
                    f"job {job.id} has no chapter {chapter}"
                    + ("" if job.chapter_titles else " (it was made without chapters)")
                )
            )
        if captioned and not job.captions:
            raise as_api_error(UnknownJobError(f"job {job.id} has no captions (it was made without captions)"))
        if job.status != "succeeded":
            raise as_api_error(JobNotReady(f"job {job.id} is {job.status}; its {what} are there once it has succeeded"))
        return job

    async def delete(self, job_id: str, caller: Caller) -> AudioJobDeleted:
        """Delete the job at once (its state first: the runner's next write of it fails), then
        have the runner cancel its running chunks, whose rows leave the engine at its next step."""
        self._check_caller(caller)
        job = (
            await self._store(self.store.delete, job_id, caller.owner, caller.admin)
            if JOB_ID_RE.fullmatch(job_id)
            else None
        )
        if job is None:
            raise as_api_error(not_found(job_id))
        if job.active:
            try:
                await asyncio.wait_for(self.runner.cancel.remote(job.id), RUNNER_CALL_S)
            except Exception as exc:  # noqa: BLE001 - it finds the job gone at its next write or scan
                log.warning("jobs: cancel of %s not delivered (%s)", job.id, exc.__class__.__name__)
        log.info(
            json.dumps(
                {"event": "job_deleted", "id": job.id, "status": job.status, "owner": job.owner, "by": caller.owner}
            )
        )
        return AudioJobDeleted(id=job.id)

    async def _job(self, job_id: str, caller: Caller) -> StoredJob:
        self._check_caller(caller)
        job = (
            await self._store(self.store.get, job_id, caller.owner, caller.admin)
            if JOB_ID_RE.fullmatch(job_id)
            else None
        )
        if job is None:
            raise as_api_error(not_found(job_id))
        return job
