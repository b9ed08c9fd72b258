"""The jobs API behind ``/v1/audio/jobs`` (the Ingress's routes call it; no torch here): long
texts spoken in the background (``serving/jobs.py``'s runner) into one file kept in the job store
(``storage/jobs/``).

``POST /v1/audio/jobs`` takes the text as JSON (``JobRequest``: ``input`` and the speech
options), as ``text/plain`` (the body is the text, the options are query parameters) or as a
multipart form (a ``file`` part, or an ``input`` field, and the options as fields). Everything is
checked before the job is stored: the model, the length (``jobs.max_input_chars``), the voice
(resolved now for the caller and kept with the job), the caller's quota; then the text is cut
into chunks, each with its seed, and the job answers 202 ``queued``.

Every job belongs to the caller that made it (``Caller.owner``): another key's id answers 404
exactly like a missing one, and an admin key sees every key's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import time
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import ValidationError

from ..engine.audio import CONTENT_TYPES, SAMPLE_RATE
from ..engine.captions import CAPTION_TYPES
from ..engine.errors import EmptyInputError, JobError, JobNotReady, UnknownJobError
from ..engine.types import ScriptPart
from ..engine.voices import effective_seed
from ..errors import APIError, as_api_error, invalid_value
from ..protocol import AudioJob, AudioJobDeleted, AudioJobList, JobChapter, JobFailure, JobProgress, JobRequest
from ..serving.jobs import job_runner
from ..settings import JobsSettings
from ..storage.jobs import (
    JOB_ID_RE,
    JobPart,
    JobStore,
    StoredJob,
    audio_file_name,
    captions_file_name,
    chapter_first_chunks,
    check_room,
    cut_script,
    cut_text,
    estimated_pcm_bytes,
    job_limits,
    make_job_store,
    new_job_id,
    split_chapters,
)
from ..storage.voices import VoiceCatalog
from .errors import read_form
from .ranged import RangedResponse
from .script import dialogue_script, speech_script, style_headers, styled
from .security import Caller
from .speech import check_model

log = logging.getLogger("ray.serve")

JOBS_PATH = "/v1/audio/jobs"
RUNNER_PING_S = 5.0  # how soon a restarted runner (or a new app version's settings) is told the settings
RUNNER_CALL_S = 5.0
_FORM_FIELDS = set(JobRequest.model_fields) | {"file"}



def _inlined(schema: dict) -> dict:
    """A pydantic JSON schema with its ``$defs`` written in place: refs to ``#/$defs/...`` mean
    nothing inside the OpenAPI document it goes into."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(defs[ref.rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in node.items()}
        return [walk(x) for x in node] if isinstance(node, list) else node

    return walk(schema)


# The create route reads its body itself (JSON, text or a form), so FastAPI cannot infer this.
CREATE_JOB_OPENAPI = {"requestBody": {"content": {
    "application/json": {"schema": _inlined(JobRequest.model_json_schema())},
    "text/plain": {"schema": {"type": "string", "description": "The text; the options as query parameters."}},
    "multipart/form-data": {"schema": {"type": "object", "properties": {
        "file": {"type": "string", "format": "binary", "description": "The text, UTF-8."},
        "voice": {"type": "string"}, "response_format": {"type": "string"}, "seed": {"type": "integer"},
        "speed": {"type": "number"}}}},
}}}


def _bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _validated(fields: dict[str, Any]) -> JobRequest:
    try:
        return JobRequest.model_validate(fields)
    except ValidationError as exc:
        raise invalid_value(exc.errors()) from None


def _text(raw: bytes, param: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise _bad("the text must be UTF-8", param=param, code="invalid_text") from None


def _not_found(job_id: str) -> UnknownJobError:
    return UnknownJobError(f"no job with id {job_id[:64]!r}")


async def store_call(fn: Any, *args: Any) -> Any:
    """A store call, off the event loop; a disk or network failure is a 503, a refusal its own status."""
    try:
        return await asyncio.to_thread(fn, *args)
    except (APIError, JobError):
        raise
    except Exception as exc:  # noqa: BLE001
        log.warning("jobs: store failed: %s: %s", exc.__class__.__name__, exc)
        raise APIError(503, "job store unavailable; retry shortly", type="server_error",
                       code="job_store_unavailable", headers={"Retry-After": "2"}) from None


async def file_response(store: JobStore, job: StoredJob, name: str, media_type: str, filename: str) -> Response:
    """One of ``job``'s stored files (``name``: the store's own name for it, never user text),
    with Range requests. A local file (the directory backend, ``file://``) is Starlette's
    ``FileResponse``: one range 206 with Content-Range, several a multipart/byteranges 206, a
    start past the end 416 with ``Content-Range: bytes */<size>``, ``If-Range`` with its ETag or
    Last-Modified. A file in an object store is a ``RangedResponse``: the same for one range
    (several get the whole file), streamed by ranged reads from the store."""
    headers = {"Cache-Control": "private, max-age=0"}
    path = await store_call(store.local_path, job, name)
    if path is not None:
        return FileResponse(path, media_type=media_type, filename=filename, content_disposition_type="inline",
                            headers=headers)
    stat = await store_call(store.stat, job, name)
    if stat is None:
        raise as_api_error(_not_found(job.id))
    return RangedResponse(stat, functools.partial(store.read_range, job, name), media_type=media_type,
                          filename=filename, content_disposition_type="inline", headers=headers)


def job_parts(parts: list[ScriptPart]) -> tuple[list[dict[str, Any]], list[JobPart]]:
    """A script's parts as a job stores them: each distinct voice once (the job's
    ``script_voices``), each part naming its voice by index there."""
    voices: dict[str, int] = {}
    table: list[dict[str, Any]] = []
    out: list[JobPart] = []
    for part in parts:
        fields = dataclasses.asdict(part.voice)
        key = json.dumps(fields, sort_keys=True, default=str)
        if key not in voices:
            voices[key] = len(table)
            table.append(fields)
        out.append(JobPart(text=part.text, voice=voices[key], speed=part.speed, prompt=part.prompt, offset=part.offset,
                           span=part.span, pause_before=part.pause_before, speaker=part.speaker, turn=part.turn))
    return table, out


class JobsService:
    """The store (read, listed and written here) and the application's runner (told of new
    jobs, of cancels, and every few seconds of the settings and stages it runs with)."""

    def __init__(self, cfg: JobsSettings, normalizer: Any, vocoder: Any, voices: VoiceCatalog, app_name: str):
        self.cfg = cfg
        self.limits = job_limits(cfg)
        self.store = make_job_store(cfg)
        self.voices = voices
        self._runner_args = (app_name, cfg, normalizer, vocoder)
        self.runner = job_runner(*self._runner_args)
        self._keeper = asyncio.get_event_loop().create_task(self._keep_runner())

    async def _keep_runner(self) -> None:
        """Tell the runner our settings and stages now and then: a runner that outlived an older
        app version gets this one's, and one that died for good is made again."""
        _, cfg, normalizer, vocoder = self._runner_args
        while True:
            try:
                await asyncio.wait_for(self.runner.configure.remote(cfg.model_dump(), normalizer, vocoder), RUNNER_CALL_S)
            except Exception as exc:  # noqa: BLE001 - restarting, or gone: find (or make) it again
                log.warning("jobs: runner unreachable (%s); looking it up again", exc.__class__.__name__)
                try:
                    self.runner = job_runner(*self._runner_args)
                except Exception:  # noqa: BLE001 - the next round
                    log.exception("jobs: could not reach the job runner")
            await asyncio.sleep(RUNNER_PING_S)

    async def _store(self, fn: Any, *args: Any) -> Any:
        return await store_call(fn, *args)

    # ------------------------------------------------------------------ routes

    async def create(self, request: Request, caller: Caller) -> JSONResponse:
        try:
            req = await self._request_of(request)
            return await self._create(req, caller, request.scope.get("root_path", ""))
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - typed errors keep their status (voice, quota, empty input)
            raise as_api_error(exc, "job creation failed", "job_failed") from None

    async def _create(self, req: JobRequest, caller: Caller, root: str) -> JSONResponse:
        check_model(req.model)
        if req.script_chars > self.cfg.max_input_chars:
            raise APIError(413, f"input is {req.script_chars} characters; the limit is {self.cfg.max_input_chars}",
                           param="turns" if req.turns is not None else "input", code="input_too_long")
        voice = await self.voices.resolve(req.voice, caller.owner, admin=caller.admin)  # the caller's own
        # The owner's room before the text is parsed and cut (a million characters take a
        # moment); the store checks again, atomically with the write.
        check_room(await self._store(self.store.usage, caller.owner), self.limits)
        if req.turns is not None or req.is_ssml:
            # Parsed and every voice resolved now (a malformed document is a 400 before anything
            # is stored); the chunks keep the script's parts, the job its voices.
            script = await (dialogue_script(req, self.voices, caller, self.cfg.max_input_chars) if req.turns is not None
                            else speech_script(req, voice, self.voices, caller, self.cfg.max_input_chars))
            options, headers, chapters = script.options, script.headers, None
            seed = effective_seed(voice, options.seed)
            script_voices, parts = job_parts(script.parts or [])
            chunks = await asyncio.to_thread(cut_script, parts, seed, self.cfg.chunk_chars)
            voice_name = voice.name if req.turns is None else "+".join(dict.fromkeys(t.voice for t in req.turns))[:200]
        else:
            options, style = styled(req.to_options(), req.instructions)
            headers, script_voices, voice_name = style_headers([style]), [], voice.name
            seed = effective_seed(voice, options.seed)  # fixed now: every chunk's seed follows from it
            chunks, chapters = await asyncio.to_thread(self._cut, req, seed)
        options = options.model_copy(update={"seed": seed, "priority": self.cfg.priority})
        if not chunks:
            raise EmptyInputError("input has nothing to speak (only punctuation, symbols or whitespace)")
        now = time.time()
        job = StoredJob(id=new_job_id(), owner=caller.owner, model=req.model, voice_name=voice_name,
                        voice=dataclasses.asdict(voice), script_voices=script_voices, options=options.model_dump(),
                        response_format=req.response_format, captions=req.captions, created_at=now, updated_at=now,
                        chunks_total=len(chunks), chunk_samples=[-1] * len(chunks),
                        chars_total=sum(len(c.text) for c in chunks),
                        reserved_bytes=estimated_pcm_bytes(chunks, options.speed),
                        chapter_titles=[title for title, _ in chapters or []],
                        chapter_first_chunks=chapter_first_chunks(chunks) if chapters else [])
        await self._store(self.store.create, job, chunks, self.limits)
        self.runner.notify.remote()  # fire and forget: the runner also finds it at its next scan
        log.info(json.dumps({"event": "job_created", "id": job.id, "owner": job.owner, "chunks": len(chunks),
                             "chars": job.chars_total, "format": job.response_format}))
        headers = {"Location": f"{root}{JOBS_PATH}/{job.id}", **headers}
        return JSONResponse(self.view(job, root).model_dump(), status_code=202, headers=headers)

    def _cut(self, req: JobRequest, seed: int) -> tuple[list, Optional[list]]:
        """The job's chunks, and its chapters when asked for (``split_chapters``)."""
        chapters = split_chapters(req.input) if req.chapters else None
        chunks = cut_text(req.input, seed, self.cfg.chunk_chars, self.cfg.paragraph_pause_s, chapters,
                          self.cfg.chapter_pause_s if chapters else 0.0)
        return chunks, chapters

    async def get(self, job_id: str, caller: Caller, root: str = "") -> AudioJob:
        return self.view(await self._job(job_id, caller), root)

    async def list(self, caller: Caller, root: str = "") -> AudioJobList:
        jobs = await self._store(self.store.list, caller.owner, caller.admin)
        return AudioJobList(data=[self.view(j, root) for j in jobs])

    async def audio(self, job_id: str, caller: Caller) -> Response:
        """The finished file, with Range requests (``file_response``)."""
        job = await self._job(job_id, caller)
        if job.status != "succeeded":
            raise as_api_error(JobNotReady(f"job {job.id} is {job.status}; its audio is there once it has succeeded"))
        return await file_response(self.store, job, audio_file_name(job), CONTENT_TYPES[job.response_format],
                                   f"{job.id}.{job.response_format}")

    async def cancel(self, job_id: str, caller: Caller, root: str = "") -> AudioJob:
        """Stop a queued or running job and keep it, ``cancelled`` (its rows leave the engine at
        its next step, its stored chunks go); a finished job is answered as it is."""
        job = await self._job(job_id, caller)
        if job.active:
            try:
                await asyncio.wait_for(self.runner.cancel.remote(job.id, True), RUNNER_CALL_S)
            except Exception as exc:  # noqa: BLE001 - the runner is restarting: the caller may retry
                log.warning("jobs: cancel of %s not delivered (%s)", job.id, exc.__class__.__name__)
                raise APIError(503, "the job runner is unavailable; retry shortly", type="server_error",
                               code="job_runner_unavailable", headers={"Retry-After": "2"}) from None
            job = await self._job(job_id, caller)
        return self.view(job, root)

    async def captions(self, job_id: str, caller: Caller) -> Response:
        """The captions of the finished file (a job made with ``captions``)."""
        job = await self._succeeded(job_id, caller, "captions", captioned=True)
        return await file_response(self.store, job, captions_file_name(job), CAPTION_TYPES[job.captions],
                                   f"{job.id}.{job.captions}")

    async def chapter_audio(self, job_id: str, chapter: int, caller: Caller) -> Response:
        """One chapter's file (a job made with ``chapters``), with Range requests."""
        job = await self._succeeded(job_id, caller, "chapters", chapter=chapter)
        return await file_response(self.store, job, audio_file_name(job, chapter), CONTENT_TYPES[job.response_format],
                                   f"{job.id}-{chapter}.{job.response_format}")

    async def chapter_captions(self, job_id: str, chapter: int, caller: Caller) -> Response:
        """One chapter's captions, timed on its own file (a job made with ``chapters`` and ``captions``)."""
        job = await self._succeeded(job_id, caller, "captions", chapter=chapter, captioned=True)
        return await file_response(self.store, job, captions_file_name(job, chapter), CAPTION_TYPES[job.captions],
                                   f"{job.id}-{chapter}.{job.captions}")

    async def _succeeded(self, job_id: str, caller: Caller, what: str, chapter: Optional[int] = None,
                         captioned: bool = False) -> StoredJob:
        """The caller's job, when it has ``what`` (its chapter ``chapter``, its captions) and has succeeded."""
        job = await self._job(job_id, caller)
        if chapter is not None and not 0 <= chapter < len(job.chapter_titles):
            raise as_api_error(UnknownJobError(f"job {job.id} has no chapter {chapter}"
                                               + ("" if job.chapter_titles else " (it was made without chapters)")))
        if captioned and not job.captions:
            raise as_api_error(UnknownJobError(f"job {job.id} has no captions (it was made without captions)"))
        if job.status != "succeeded":
            raise as_api_error(JobNotReady(f"job {job.id} is {job.status}; its {what} are there once it has succeeded"))
        return job

    async def delete(self, job_id: str, caller: Caller) -> AudioJobDeleted:
        """Delete the job at once (its state first: the runner's next write of it fails), then
        have the runner cancel its running chunks, whose rows leave the engine at its next step."""
        job = await self._store(self.store.delete, job_id, caller.owner, caller.admin) if JOB_ID_RE.match(job_id) else None
        if job is None:
            raise as_api_error(_not_found(job_id))
        if job.active:
            try:
                await asyncio.wait_for(self.runner.cancel.remote(job.id), RUNNER_CALL_S)
            except Exception as exc:  # noqa: BLE001 - it finds the job gone at its next write or scan
                log.warning("jobs: cancel of %s not delivered (%s)", job.id, exc.__class__.__name__)
        log.info(json.dumps({"event": "job_deleted", "id": job.id, "status": job.status, "owner": job.owner,
                             "by": caller.owner}))
        return AudioJobDeleted(id=job.id)

    async def _job(self, job_id: str, caller: Caller) -> StoredJob:
        job = await self._store(self.store.get, job_id, caller.owner, caller.admin) if JOB_ID_RE.match(job_id) else None
        if job is None:
            raise as_api_error(_not_found(job_id))
        return job

    # ------------------------------------------------------------------ shapes

    @staticmethod
    def view(job: StoredJob, root: str = "") -> AudioJob:
        eta = None
        made = job.chars_done - job.run_chars_start
        if job.active and job.run_started_at is not None and made > 0:
            # The rate of the runner's current run, up to now: it falls while a chunk takes long.
            rate = made / max(1e-3, time.time() - job.run_started_at)
            eta = round((job.chars_total - job.chars_done) / rate, 1)
        elif job.status == "succeeded":
            eta = 0.0
        progress = JobProgress(chunks_done=job.chunks_done, chunks_total=job.chunks_total,
                               characters_done=job.chars_done, characters_total=job.chars_total,
                               audio_seconds=round(job.audio_samples / SAMPLE_RATE, 3), eta_seconds=eta)
        stamp = lambda t: int(t) if t is not None else None  # noqa: E731
        chapters = None
        if job.chapter_titles:
            done = job.status == "succeeded" and len(job.chapter_times) == len(job.chapter_titles)
            chapters = [JobChapter(index=n, title=title, chunks_total=end - first,
                                   chunks_done=sum(1 for k in range(first, end) if job.chunk_samples[k] >= 0),
                                   start_seconds=job.chapter_times[n][0] if done else None,
                                   duration_seconds=job.chapter_times[n][1] if done else None,
                                   audio_url=f"{root}{JOBS_PATH}/{job.id}/chapters/{n}/audio" if done else None,
                                   captions_url=f"{root}{JOBS_PATH}/{job.id}/chapters/{n}/captions"
                                   if done and job.captions else None)
                        for n, (title, (first, end)) in enumerate(zip(job.chapter_titles, job.chapter_spans()))]
        return AudioJob(id=job.id, status=job.status, created_at=int(job.created_at), started_at=stamp(job.started_at),
                        finished_at=stamp(job.finished_at), expires_at=stamp(job.expires_at), model=job.model,
                        voice=job.voice_name, response_format=job.response_format, progress=progress, bytes=job.bytes,
                        error=JobFailure(**job.error) if job.error else None, owner=job.owner,
                        audio_url=f"{root}{JOBS_PATH}/{job.id}/audio" if job.status == "succeeded" else None,
                        captions_url=f"{root}{JOBS_PATH}/{job.id}/captions"
                        if job.status == "succeeded" and job.captions else None,
                        chapters=chapters)

    async def _request_of(self, request: Request) -> JobRequest:
        """The job's text and options from JSON, a text body (options in the query) or a form."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype in ("application/json", ""):
            try:
                body = json.loads(await request.body() or b"null")
            except ValueError:
                raise _bad("request body is not valid JSON", code="invalid_json") from None
            if not isinstance(body, dict):
                raise _bad("send a JSON object with 'input' and the speech options, text/plain, or a multipart form "
                           "with a 'file' part")
            return _validated(body)
        if ctype == "text/plain":
            params = dict(request.query_params)
            if "input" in params:
                raise _bad("with text/plain the body is the input", param="input")
            return _validated({**params, "input": _text(await request.body(), "input")})
        if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
            return _validated(await self._form(request))
        raise APIError(415, f"unsupported content type {ctype!r}: use application/json, text/plain or multipart/form-data",
                       code="unsupported_media_type")

    async def _form(self, request: Request) -> dict[str, Any]:
        form = await read_form(request, "jobs", len(_FORM_FIELDS), self.cfg.max_upload_bytes)
        try:
            fields: dict[str, Any] = {}
            for key, value in form.multi_items():
                if key not in _FORM_FIELDS:
                    raise _bad(f"unknown field {key[:40]!r}", param=key[:40])
                if key in fields:
                    raise _bad(f"field {key!r} given twice", param=key)
                if key == "file":
                    if isinstance(value, str):
                        raise _bad("'file' must be a file part", param="file")
                    fields["input"] = _text(await value.read(), "file")
                elif isinstance(value, str):
                    fields[key] = value
                else:
                    raise _bad(f"'{key}' must be a text field", param=key)
            if "file" in form and "input" in {k for k, _ in form.multi_items()}:
                raise _bad("give the text once: a 'file' part or an 'input' field", param="input")
            return fields
        finally:
            await form.close()
