"""The jobs API behind ``/v1/audio/jobs`` (the Ingress's routes call it; no torch here): long
texts spoken in the background (``serving/jobs.py``'s runner) into one file kept in the job store
(``storage/jobs/``).

``POST /v1/audio/jobs`` takes the text as JSON (``JobRequest``: ``input`` and the speech
options), as ``text/plain`` (the body is the text, the options are query parameters) or as a
multipart form (a ``file`` part, or an ``input`` field, and the options as fields). Everything is
checked before the job is stored, the cheap refusals first (a caller without a key, the owner's
active jobs and room, before the body is read; the model and the length, ``jobs.max_input_chars``);
then, off the event loop, the script is read (SSML, turns; each distinct voice resolved once for
the caller and kept with the job), cut into chunks, each with its seed, and every chunk planned as
the runner will plan it: the job reserves its planned audio (``storage/jobs/planning.py``), and
answers 202 ``queued``.

Every job belongs to the caller that made it (``Caller.owner``): another key's id answers 404
exactly like a missing one, and an admin key sees every key's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import gc
import json
import logging
import re
import time
from typing import Any, Optional

from fastapi import Request
from fastapi.responses import FileResponse, JSONResponse, Response
from pydantic import TypeAdapter, ValidationError

from ..engine.audio import CONTENT_TYPES, SAMPLE_RATE
from ..engine.captions import CAPTION_TYPES
from ..engine.config import SegmentLimits
from ..engine.errors import EmptyInputError, JobError, JobNotReady, JobQuotaExceeded, UnknownJobError
from ..engine.types import ScriptPart, Voice
from ..engine.voices import effective_seed
from ..errors import APIError, as_api_error, invalid_value
from ..protocol import (
    MAX_JOB_TURNS,
    AudioJob,
    AudioJobDeleted,
    AudioJobList,
    DialogueTurn,
    JobChapter,
    JobFailure,
    JobProgress,
    JobRequest,
)
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
    job_limits,
    make_job_store,
    new_job_id,
    split_chapters,
)
from ..storage.jobs.planning import JobPlanner, pieces, reservation
from ..storage.voices import VoiceCatalog
from .errors import read_form
from .ranged import RangedResponse
from .script import dialogue_script, speech_script, style_headers, styled
from .security import ANONYMOUS, Caller
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
CREATE_JOB_OPENAPI = {
    "requestBody": {
        "content": {
            "application/json": {"schema": _inlined(JobRequest.model_json_schema())},
            "text/plain": {"schema": {"type": "string", "description": "The text; the options as query parameters."}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "The text, UTF-8."},
                        "voice": {"type": "string"},
                        "response_format": {"type": "string"},
                        "seed": {"type": "integer"},
                        "speed": {"type": "number"},
                    },
                }
            },
        }
    }
}


def _bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _validated(fields: dict[str, Any]) -> JobRequest:
    try:
        return JobRequest.model_validate(fields)
    except ValidationError as exc:
        raise invalid_value(exc.errors()) from None


SMALL_BODY = 64 * 1024  # parsed in one call (a few ms at most)
TURNS_PER_PIECE = 1000  # turns validated per pydantic call (~20 ms, the GIL held throughout)
_TURNS = TypeAdapter(list[DialogueTurn])


def _validated_in_pieces(fields: dict[str, Any]) -> JobRequest:
    """``_validated``, a long dialogue's turns a piece at a time: one call over 100,000 turns holds
    the GIL (and so the Ingress's loop, even from a thread) for seconds. Blocking: in a thread."""
    turns = fields.get("turns")
    if not isinstance(turns, list) or len(turns) <= TURNS_PER_PIECE:
        return _validated(fields)
    if len(turns) > MAX_JOB_TURNS:  # counted before any is read
        raise APIError(
            400,
            f"a job has at most {MAX_JOB_TURNS} turns; this one has {len(turns)}",
            param="turns",
            code="invalid_value",
        )
    req = _validated({**fields, "turns": turns[:1]})
    out: list[DialogueTurn] = []
    for start in range(0, len(turns), TURNS_PER_PIECE):
        try:
            out += _TURNS.validate_python(turns[start : start + TURNS_PER_PIECE])
        except ValidationError as exc:
            errors = [{**e, "loc": ("turns", start + e["loc"][0], *e["loc"][1:])} for e in exc.errors()]
            raise invalid_value(errors) from None
    req.turns = out
    return req


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def loads_object(text: str) -> dict[str, Any]:
    """``json.loads`` of a JSON object, its arrays read element by element: one ``json.loads`` of
    a body of 100,000 turns holds the GIL for half a second (the C scanner never lets go), from
    any thread. Each call here reads one value (one turn, one string), then lets the GIL go
    round. ``ValueError`` for what is not a JSON object. Blocking: in a thread."""
    i = _ws(text, 0)
    if not text.startswith("{", i):
        raise ValueError("not an object")
    out: dict[str, Any] = {}
    i = _ws(text, i + 1)
    if text.startswith("}", i):
        i += 1
    else:
        while True:
            if not text.startswith('"', i):
                raise ValueError("expected a key")
            key, i = _DECODER.raw_decode(text, i)
            i = _ws(text, i)
            if not text.startswith(":", i):
                raise ValueError("expected ':'")
            i = _ws(text, i + 1)
            if text.startswith("[", i):
                items: list[Any] = []
                i = _ws(text, i + 1)
                if text.startswith("]", i):
                    i += 1
                else:
                    while True:
                        value, i = _DECODER.raw_decode(text, i)
                        items.append(value)
                        i = _ws(text, i)
                        if text.startswith(",", i):
                            i = _ws(text, i + 1)
                        elif text.startswith("]", i):
                            i += 1
                            break
                        else:
                            raise ValueError("expected ',' or ']'")
                out[key] = items
            else:
                out[key], i = _DECODER.raw_decode(text, i)
            i = _ws(text, i)
            if text.startswith(",", i):
                i = _ws(text, i + 1)
            elif text.startswith("}", i):
                i += 1
                break
            else:
                raise ValueError("expected ',' or '}'")
    if _ws(text, i) != len(text):
        raise ValueError("extra data")
    return out


def _parse_body(raw: bytes) -> JobRequest:
    """A JSON body as a ``JobRequest`` (blocking: in a thread)."""
    body: Any = None
    try:
        if raw.lstrip()[:1] == b"{":
            body = loads_object(raw.decode("utf-8"))
        elif raw.strip() and len(raw) <= SMALL_BODY:  # not an object: is it JSON at all?
            body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, IndexError):
        raise _bad("request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad(
            "send a JSON object with 'input' and the speech options, text/plain, or a multipart form with a 'file' part"
        )
    return _validated_in_pieces(body)


class _CollectorDeferred:
    """The cyclic garbage collector held off while a submission builds its script: a full
    collection walks every live object with the GIL held (100,000 turns in models, parts and
    chunks are millions: 50-100 ms a walk, several walks as they are made) and so stalls the
    loop from any thread. What a build leaves is frozen when the last build ends (``gc.freeze``
    moves it out of the collector's walks at no cost: the first young collection after would
    otherwise walk it all at once) and unfrozen when the last submission is answered, by when
    reference counting has freed it. Nested: counts of the builds and submissions inside."""

    building = 0
    submitting = 0
    disabled_here = False
    frozen_here = False

    def __enter__(self) -> None:
        cls = type(self)
        if cls.building == 0 and gc.isenabled():
            gc.disable()
            cls.disabled_here = True
        cls.building += 1

    def __exit__(self, *exc: Any) -> None:
        cls = type(self)
        cls.building -= 1
        if cls.building == 0 and cls.disabled_here:
            cls.disabled_here = False
            gc.freeze()
            cls.frozen_here = True
            gc.enable()

    @classmethod
    def submission(cls, start: bool) -> None:
        """A submission begins (``start``) or is answered."""
        cls.submitting += 1 if start else -1
        if cls.submitting == 0 and cls.frozen_here:
            cls.frozen_here = False
            gc.unfreeze()


class _ThreadVoices:
    """The voice catalog as a script builder running on a worker thread's own loop sees it: each
    distinct (name, owner) resolved once, on the Ingress's loop (where the voice store's clients
    live), and the same ``Voice`` object handed back every time after (so a job keeps each voice
    once, found by identity, never re-serialised per part)."""

    def __init__(self, catalog: VoiceCatalog, loop: asyncio.AbstractEventLoop):
        self.catalog = catalog
        self.loop = loop
        self.known: dict[tuple[str, str, bool], Voice] = {}

    async def resolve(self, voice: Optional[str], owner: str, admin: bool = False) -> Voice:
        key = (voice or "", owner, admin)
        if key not in self.known:
            fut = asyncio.run_coroutine_threadsafe(self.catalog.resolve(voice, owner, admin=admin), self.loop)
            self.known[key] = await asyncio.wrap_future(fut)
        return self.known[key]


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
        raise APIError(
            503,
            "job store unavailable; retry shortly",
            type="server_error",
            code="job_store_unavailable",
            headers={"Retry-After": "2"},
        ) from None


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
        return FileResponse(
            path, media_type=media_type, filename=filename, content_disposition_type="inline", headers=headers
        )
    stat = await store_call(store.stat, job, name)
    if stat is None:
        raise as_api_error(_not_found(job.id))
    return RangedResponse(
        stat,
        functools.partial(store.read_range, job, name),
        media_type=media_type,
        filename=filename,
        content_disposition_type="inline",
        headers=headers,
    )


def job_parts(parts: list[ScriptPart]) -> tuple[list[Voice], list[JobPart]]:
    """A script's parts as a job stores them: each distinct voice once (the job's
    ``script_voices``), each part naming its voice by index there. A voice is found by identity
    first (the parts of one resolved voice share its object), by its fields only the first time
    an object is seen: a clip voice's tens of kilobytes are never copied or encoded per part."""
    by_object: dict[int, int] = {}
    by_fields: dict[tuple, int] = {}
    table: list[Voice] = []
    out: list[JobPart] = []
    for part in parts:
        v = part.voice
        n = by_object.get(id(v))  # the parts hold every voice alive: an id is not reused meanwhile
        if n is None:
            n = by_fields.setdefault((v.name, v.seed, v.spk_emb, v.spk_smp, v.txt_smp), len(table))
            if n == len(table):
                table.append(v)
            by_object[id(v)] = n
        out.append(
            JobPart(
                text=part.text,
                voice=n,
                speed=part.speed,
                prompt=part.prompt,
                offset=part.offset,
                span=part.span,
                pause_before=part.pause_before,
                speaker=part.speaker,
                turn=part.turn,
            )
        )
    return table, out


@dataclasses.dataclass
class _Built:
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


class JobsService:
    """The store (read, listed and written here) and the application's runner (told of new
    jobs, of cancels, and every few seconds of the settings and stages it runs with).

    ``segments``: the TextNormalizer's limits (``args.segments``): a job is planned at
    submission with them, as the runner's chunks will be. ``runner``: the runner's handle
    (tests without Ray pass their own; by default the application's, found or made)."""

    def __init__(
        self,
        cfg: JobsSettings,
        normalizer: Any,
        vocoder: Any,
        voices: VoiceCatalog,
        app_name: str,
        segments: Optional[SegmentLimits] = None,
        runner: Any = None,
    ):
        self.cfg = cfg
        self.limits = job_limits(cfg)
        self.store = make_job_store(cfg)
        self.voices = voices
        self.planner = JobPlanner(segments or SegmentLimits())
        self._submitting: set[str] = set()  # owners with a submission being read and planned here
        self._runner_args = (app_name, cfg, normalizer, vocoder)
        if runner is not None:
            self.runner, self._keeper = runner, None
        else:
            self.runner = job_runner(*self._runner_args)
            self._keeper = asyncio.get_event_loop().create_task(self._keep_runner())

    async def _keep_runner(self) -> None:
        """Tell the runner our settings and stages now and then: a runner that outlived an older
        app version gets this one's, and one that died for good is made again."""
        _, cfg, normalizer, vocoder = self._runner_args
        while True:
            try:
                await asyncio.wait_for(
                    self.runner.configure.remote(cfg.model_dump(), normalizer, vocoder), RUNNER_CALL_S
                )
            except Exception as exc:  # noqa: BLE001 - restarting, or gone: find (or make) it again
                log.warning("jobs: runner unreachable (%s); looking it up again", exc.__class__.__name__)
                try:
                    self.runner = job_runner(*self._runner_args)
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
        _CollectorDeferred.submission(True)
        try:
            with _CollectorDeferred():
                built = await self._build(await self._request_of(request), caller)
            # The request, its turns and parts are gone now: what is planned is the chunks alone.
            return await self._create(built, caller, request.scope.get("root_path", ""))
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - typed errors keep their status (voice, quota, empty input)
            raise as_api_error(exc, "job creation failed", "job_failed") from None
        finally:
            self._submitting.discard(caller.owner)
            _CollectorDeferred.submission(False)

    async def _build(self, req: JobRequest, caller: Caller) -> "_Built":
        """The request read into the job's chunks (and its voices), every piece of it checked."""
        check_model(req.model)
        if req.script_chars > self.cfg.max_input_chars:
            raise APIError(
                413,
                f"input is {req.script_chars} characters; the limit is {self.cfg.max_input_chars}",
                param="turns" if req.turns is not None else "input",
                code="input_too_long",
            )
        used = await self._store(self.store.usage, caller.owner)
        check_room(used, self.limits, 1)  # again: the body took a while
        voice = await self.voices.resolve(req.voice, caller.owner, admin=caller.admin)  # the caller's own
        script_voices: list[Voice] = []
        if req.turns is not None or req.is_ssml:
            # Parsed and every voice resolved now (a malformed document is a 400 before anything
            # is stored), on a thread's loop; the chunks keep the script's parts, the job its voices.
            catalog = _ThreadVoices(self.voices, asyncio.get_running_loop())
            cap = self.cfg.max_input_chars
            script = await asyncio.to_thread(
                asyncio.run,
                dialogue_script(req, catalog, caller, cap)
                if req.turns is not None
                else speech_script(req, voice, catalog, caller, cap),
            )
            options, headers, chapters = script.options, script.headers, None
            seed = effective_seed(voice, options.seed)
            silence = self.planner.limits.max_silence_seconds
            script_voices, chunks = await asyncio.to_thread(self._cut_script, script.parts or [], seed, silence)
            voice_name = voice.name if req.turns is None else "+".join(dict.fromkeys(t.voice for t in req.turns))[:200]
        else:
            options, style = styled(req.to_options(), req.instructions)
            headers, voice_name = style_headers([style]), voice.name
            seed = effective_seed(voice, options.seed)  # fixed now: every chunk's seed follows from it
            chunks, chapters = await asyncio.to_thread(self._cut, req, seed)
        options = options.model_copy(update={"seed": seed, "priority": self.cfg.priority})
        if not chunks:
            raise EmptyInputError("input has nothing to speak (only punctuation, symbols or whitespace)")
        return _Built(
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

    async def _create(self, built: "_Built", caller: Caller, root: str) -> JSONResponse:
        """Plan the built job, reserve its planned audio, store it and tell the runner."""
        chunks, chapters, voice, script_voices, options = (
            built.chunks,
            built.chapters,
            built.voice,
            built.script_voices,
            built.options,
        )
        seconds = await self._planned_seconds(
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
        return JSONResponse(self.view(job, root).model_dump(), status_code=202, headers=headers)

    def _cut_script(self, parts: list[ScriptPart], seed: int, max_silence_s: float) -> tuple[list[Voice], list]:
        voices, job_parts_ = job_parts(parts)
        return voices, cut_script(job_parts_, seed, self.cfg.chunk_chars, max_silence_s)

    async def _planned_seconds(
        self,
        chunks: list,
        options: Any,
        voice: Voice,
        script_voices: list[Voice],
        owner: str,
        chapters: bool,
        room: int,
    ) -> float:
        """The job's planned audio (``JobPlanner``), a piece of chunks per thread call; a chunk the
        runner's planner would refuse is a 413 now, and planning stops with a 409 as soon as the
        reservation passes the owner's room."""
        seen: dict[str, float] = {}
        total = 0.0
        for start, end in pieces(chunks):
            total += sum(
                await asyncio.to_thread(
                    self.planner.seconds, chunks, start, end, options, voice, script_voices, owner, seen
                )
            )
            needed = reservation(total, chapters, self.cfg.reservation_headroom)[1]
            if needed > room:
                raise JobQuotaExceeded(
                    f"this job needs {'at least ' if end < len(chunks) else ''}{needed} bytes (its normalised plan: "
                    f"{total:.0f} s of audio so far{', twice with chapters' if chapters else ''}, with "
                    f"jobs.reservation_headroom); your jobs have {max(0, room)} bytes of room "
                    "(jobs.max_bytes_per_key): delete finished ones or send less text"
                )
        return total

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

    async def get(self, job_id: str, caller: Caller, root: str = "") -> AudioJob:
        return self.view(await self._job(job_id, caller), root)

    async def list(self, caller: Caller, root: str = "") -> AudioJobList:
        self._check_caller(caller)
        jobs = await self._store(self.store.list, caller.owner, caller.admin)
        return AudioJobList(data=[self.view(j, root) for j in jobs])

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
        return self.view(job, root)

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
            raise as_api_error(_not_found(job_id))
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
        progress = JobProgress(
            chunks_done=job.chunks_done,
            chunks_total=job.chunks_total,
            characters_done=job.chars_done,
            characters_total=job.chars_total,
            audio_seconds=round(job.audio_samples / SAMPLE_RATE, 3),
            eta_seconds=eta,
        )
        stamp = lambda t: int(t) if t is not None else None  # noqa: E731
        chapters = None
        if job.chapter_titles:
            done = job.status == "succeeded" and len(job.chapter_times) == len(job.chapter_titles)
            chapters = [
                JobChapter(
                    index=n,
                    title=title,
                    chunks_total=end - first,
                    chunks_done=sum(1 for k in range(first, end) if job.chunk_samples[k] >= 0),
                    start_seconds=job.chapter_times[n][0] if done else None,
                    duration_seconds=job.chapter_times[n][1] if done else None,
                    audio_url=f"{root}{JOBS_PATH}/{job.id}/chapters/{n}/audio" if done else None,
                    captions_url=f"{root}{JOBS_PATH}/{job.id}/chapters/{n}/captions" if done and job.captions else None,
                )
                for n, (title, (first, end)) in enumerate(zip(job.chapter_titles, job.chapter_spans()))
            ]
        return AudioJob(
            id=job.id,
            status=job.status,
            created_at=int(job.created_at),
            started_at=stamp(job.started_at),
            finished_at=stamp(job.finished_at),
            expires_at=stamp(job.expires_at),
            model=job.model,
            voice=job.voice_name,
            response_format=job.response_format,
            progress=progress,
            bytes=job.bytes,
            error=JobFailure(**job.error) if job.error else None,
            owner=job.owner,
            audio_url=f"{root}{JOBS_PATH}/{job.id}/audio" if job.status == "succeeded" else None,
            captions_url=f"{root}{JOBS_PATH}/{job.id}/captions" if job.status == "succeeded" and job.captions else None,
            chapters=chapters,
        )

    async def _request_of(self, request: Request) -> JobRequest:
        """The job's text and options from JSON, a text body (options in the query) or a form."""
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype in ("application/json", ""):
            return await asyncio.to_thread(_parse_body, await request.body())
        if ctype == "text/plain":
            params = dict(request.query_params)
            if "input" in params:
                raise _bad("with text/plain the body is the input", param="input")
            return _validated({**params, "input": _text(await request.body(), "input")})
        if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
            return _validated(await self._form(request))
        raise APIError(
            415,
            f"unsupported content type {ctype!r}: use application/json, text/plain or multipart/form-data",
            code="unsupported_media_type",
        )

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
