"""Ingress (CPU): the OpenAI-compatible HTTP API and the Python handle API of the app.

HTTP: ``POST /v1/audio/speech`` streams audio by chunked transfer as it is made;
``GET /v1/models``, ``/v1/voices``, ``/healthz``, ``/readyz``. Handle: ``synthesize(request)``
-> bytes and ``stream(request)`` (with ``.options(stream=True)``) for other Ray apps.

Every request is validated and planned (normalised, split, voice resolved) before any byte is
sent, and the first audio chunk is awaited before the response starts, so an error before
audio still gets its proper status and an OpenAI-style body.
"""


import asyncio
import json
import logging
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any, AsyncIterator, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.handle import DeploymentHandle

from ray.serve.exceptions import BackPressureError

from deployments.vocoder import StreamSummary
from serve_app import metrics
from serve_app.api import BodyLimits, error_response, make_app, sse_stream
from serve_app.cache import CacheConfig, make_cache, request_key
from serve_app.engine.pipeline import Plan
from serve_app.security import APIKeyAuth, SecuritySettings, StreamLimiter, load_api_keys
from serve_app.engine.voices import list_voices
from serve_app.protocol import (
    DEFAULT_MAX_INPUT_CHARS,
    MODEL_IDS,
    APIError,
    ModelCard,
    ModelList,
    SpeechRequest,
    VoiceCard,
    VoiceList,
)

log = logging.getLogger("ray.serve")


class IngressSettings(BaseModel):
    max_input_chars: int = Field(default=DEFAULT_MAX_INPUT_CHARS, ge=1)
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    warmup: bool = True
    cache: CacheConfig = CacheConfig()
    security: SecuritySettings = SecuritySettings()
    request_timeout_s: float = Field(default=300.0, gt=0, description="A request ends (504 before audio, cut after) past this.")
    # Degradation switches (off by default): answer 429 "busy" / skip refine_text past these
    # numbers of segment rows waiting in the acoustic queue.
    busy_queue_rows: Optional[int] = Field(default=None, ge=1)
    skip_refine_queue_rows: Optional[int] = Field(default=None, ge=0)
    log_text: bool = Field(default=False, description="Log request text (DEBUG only); off: no user text in logs.")


BODY_LIMITS = BodyLimits(IngressSettings().max_body_bytes)
api = make_app(BODY_LIMITS)


def _as_request(request: Union[SpeechRequest, dict]) -> SpeechRequest:
    if isinstance(request, SpeechRequest):
        return request
    try:
        return SpeechRequest.model_validate(request)
    except Exception as exc:  # pydantic.ValidationError
        raise APIError(400, f"invalid request: {exc}", code="invalid_value") from None


def _unwrap(exc: BaseException) -> BaseException:
    """Ray wraps a replica's exception; an APIError subclass instance still matches APIError."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, APIError) else exc


@dataclass
class RequestRecord:
    """What one request did: metrics at its milestones, one JSON log line at its end."""

    request_id: str
    voice: str
    chars: int
    format: str
    stream_format: str
    client: str
    text: Optional[str] = None  # only with log_text, and then at DEBUG
    cache: str = "bypass"
    status: str = "pending"
    ttfb_s: Optional[float] = None
    total_s: Optional[float] = None
    segments: int = 0
    audio_s: float = 0.0
    batch_rows: int = 0
    t0: float = field(default_factory=time.perf_counter, repr=False)

    @classmethod
    def start(cls, req: SpeechRequest, request_id: str, client: str, log_text: bool = False) -> "RequestRecord":
        voice = req.voice if len(req.voice) <= 32 else f"speaker:{req.voice[:8]}"
        return cls(request_id, voice, len(req.input), req.response_format, req.stream_format, client,
                   text=req.input if log_text else None)

    def first_byte(self) -> None:
        self.ttfb_s = time.perf_counter() - self.t0
        metrics.observe("tts_ttfb_seconds", self.ttfb_s, format=self.format)

    def finish(self, status: str) -> None:
        if self.status != "pending":
            return
        self.status = status
        self.total_s = time.perf_counter() - self.t0
        metrics.inc("tts_requests_total", status=status, format=self.format)
        if status == "200":
            metrics.observe("tts_request_duration_seconds", self.total_s, format=self.format)
        line = {k: v for k, v in asdict(self).items() if k not in ("t0", "text")}
        log.info(json.dumps({"event": "speech", **line}, ensure_ascii=False))
        if self.text is not None:
            log.debug(json.dumps({"event": "speech_text", "request_id": self.request_id, "text": self.text}, ensure_ascii=False))


async def _once(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def _released(audio: AsyncIterator[bytes], limiter: StreamLimiter, client: str) -> AsyncIterator[bytes]:
    try:
        async for data in audio:
            yield data
    finally:
        limiter.release(client)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("chattts-serve")
    except PackageNotFoundError:
        return "dev"


def _request_id() -> str:
    try:
        return serve.context._get_serve_request_context().request_id or uuid.uuid4().hex
    except Exception:  # noqa: BLE001 - outside a request context
        return uuid.uuid4().hex


# The ingress only routes and streams bytes: cheap, many concurrent streams per replica.
@serve.deployment(
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=128,
    autoscaling_config={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 32},
)
@serve.ingress(api)
class Ingress:
    def __init__(
        self,
        normalizer: DeploymentHandle,
        vocoder: DeploymentHandle,
        acoustic: DeploymentHandle,
        settings: Optional[dict] = None,
    ):
        self.normalizer = normalizer
        self.vocoder = vocoder
        self.acoustic = acoustic
        self.weights_kind = "unknown"
        self.weights_id = "unknown"
        self._queue_rows = 0
        self._poll_task: Optional[asyncio.Task] = None
        self._apply(IngressSettings.model_validate(settings or {}))
        self.cache = make_cache(self.settings.cache)
        self._ready = asyncio.Event()
        self._warmup_error: Optional[str] = None
        self._warmup_task = asyncio.get_event_loop().create_task(self._warmup())

    async def _warmup(self) -> None:
        """One dummy synthesis through every stage before /readyz says ready."""
        try:
            info = await self.acoustic.weights_info.remote()
            self.weights_kind = info["kind"]
            # Cached audio is only valid for the same weights and the same engine code.
            self.weights_id = f"{info['id']}:{_package_version()}"
            if self.settings.warmup:
                audio = await self.synthesize({"input": "你好。", "response_format": "wav"})
                if len(audio) <= 44:
                    raise RuntimeError("warm-up synthesis produced no audio")
            self._ready.set()
        except Exception as exc:  # noqa: BLE001 - reported by /readyz
            self._warmup_error = f"{exc.__class__.__name__}: {exc}"
            log.exception("warm-up failed")

    def _apply(self, settings: IngressSettings) -> None:
        self.settings = settings
        BODY_LIMITS.max_bytes = settings.max_body_bytes
        BODY_LIMITS.cors_origins = list(settings.security.cors_origins)
        self.auth = APIKeyAuth(load_api_keys(settings.security))
        self.limiter = StreamLimiter(settings.security.max_streams_per_key)
        needs_queue = settings.busy_queue_rows is not None or settings.skip_refine_queue_rows is not None
        if needs_queue and self._poll_task is None:
            self._poll_task = asyncio.get_event_loop().create_task(self._poll_queue())

    async def reconfigure(self, user_config: dict) -> None:
        """Serve ``user_config``: any IngressSettings field except the cache, applied live
        (limits, timeout, degradation switches, API keys, CORS)."""
        changes = {k: v for k, v in (user_config or {}).items() if k != "cache"}
        if changes:
            self._apply(IngressSettings.model_validate({**self.settings.model_dump(), **changes}))

    async def _poll_queue(self) -> None:
        """Keep the acoustic queue length at hand for the degradation switches."""
        while True:
            try:
                stats = await self.acoustic.stats.remote()
                self._queue_rows = int(stats["waiting_rows"])
            except Exception:  # noqa: BLE001 - keep the last value; the stage may be restarting
                pass
            await asyncio.sleep(0.5)

    # ------------------------------------------------------------------ shared by HTTP and handles

    def _check(self, req: SpeechRequest) -> None:
        if req.model not in MODEL_IDS:
            raise APIError(404, f"model {req.model!r} does not exist; use one of {', '.join(MODEL_IDS)}", param="model", code="model_not_found")
        if len(req.input) > self.settings.max_input_chars:
            raise APIError(413, f"input is {len(req.input)} characters; the limit is {self.settings.max_input_chars}", param="input", code="input_too_long")

    async def _plan(self, req: SpeechRequest) -> Plan:
        plan = await self.normalizer.plan.remote(req)
        if req.refine_text:
            busy = self.settings.skip_refine_queue_rows
            if busy is not None and self._queue_rows >= busy:
                log.info("queue at %d rows: skipping refine_text", self._queue_rows)
            else:
                seed = plan.segments[0].seed if plan.segments else 0
                texts = await self.acoustic.refine.remote(plan.texts, seed)
                plan = await self.normalizer.replan.remote(req, texts)
        return plan

    async def _open(self, req: SpeechRequest) -> tuple[Any, bytes, Plan]:
        """Plan and start a synthesis; return the byte stream, its first chunk and the plan."""
        gen = None
        try:
            plan = await self._plan(req)
            gen = self.vocoder.options(stream=True).stream.remote(plan, req.response_format)
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:
                first = b""
            return gen, first, plan
        except asyncio.CancelledError:
            if gen is not None:
                gen.cancel()
            raise
        except BackPressureError:
            raise APIError(503, "server overloaded: a stage's queue is full; retry shortly", type="server_error",
                           code="overloaded", headers={"Retry-After": "1"}) from None
        except Exception as exc:  # noqa: BLE001
            cause = _unwrap(exc)
            if isinstance(cause, APIError):
                raise cause from None
            log.exception("synthesis failed before the first byte")
            raise APIError(500, "synthesis failed", type="server_error", code="synthesis_failed") from None

    def _check_busy(self) -> None:
        limit = self.settings.busy_queue_rows
        if limit is not None and self._queue_rows >= limit:
            raise APIError(429, "server busy: too many requests queued; retry shortly", type="rate_limit_error",
                           code="busy", headers={"Retry-After": "2"})

    async def _audio(self, req: SpeechRequest, rec: RequestRecord, cache_control: str = "") -> Union[bytes, AsyncIterator[bytes]]:
        """The request's audio: the cached bytes on a hit, else a stream.

        ``cache_control``: the request's Cache-Control header: ``no-cache`` skips the lookup (fresh
        synthesis, still stored), ``no-store`` also skips storing. Errors before the first audio
        byte raise APIError.
        """
        directives = {d.strip().lower() for d in cache_control.split(",")}
        try:
            self._check(req)
            key = request_key(req, weights_id=self.weights_id) if self.weights_id != "unknown" else None
            if key is not None and "no-store" in directives:
                key = None
                metrics.inc("tts_cache_total", result="bypass")
            elif key is not None and "no-cache" in directives:
                rec.cache = "miss"
                metrics.inc("tts_cache_total", result="miss")
            elif key is not None:
                cached = await self.cache.get(key)
                rec.cache = "hit" if cached is not None else "miss"
                metrics.inc("tts_cache_total", result=rec.cache)
                if cached is not None:
                    rec.first_byte()
                    rec.finish("200")
                    return cached
            else:
                metrics.inc("tts_cache_total", result="bypass")
            self._check_busy()
            try:
                gen, first, plan = await asyncio.wait_for(self._open(req), self.settings.request_timeout_s)
            except asyncio.TimeoutError:
                raise APIError(504, f"no audio within {self.settings.request_timeout_s:g}s", type="server_error",
                               code="timeout") from None
        except APIError as exc:
            rec.finish(str(exc.status))
            raise
        rec.segments = len(plan.segments)
        return self._chain(first, gen, rec, key)

    async def _chain(self, first: bytes, gen: Any, rec: RequestRecord, key: Optional[str]) -> AsyncIterator[bytes]:
        """Forward the stream within the deadline; record metrics and the log line; cache it."""
        status = "aborted"
        kept: Optional[list[bytes]] = [] if key else None
        size = 0
        limit = self.settings.cache.max_item_bytes
        deadline = rec.t0 + self.settings.request_timeout_s
        rec.first_byte()
        try:
            data: Any = first
            while True:
                if isinstance(data, StreamSummary):
                    rec.audio_s, rec.batch_rows = data.audio_seconds, data.batch_rows
                elif data:
                    if kept is not None:
                        size += len(data)
                        kept = kept if size <= limit else None
                        if kept is not None:
                            kept.append(data)
                    yield data
                try:
                    data = await asyncio.wait_for(gen.__anext__(), max(0.001, deadline - time.perf_counter()))
                except StopAsyncIteration:
                    break
                except asyncio.TimeoutError:
                    status = "timeout"
                    log.warning("request %s hit its %gs timeout mid-stream", rec.request_id, self.settings.request_timeout_s)
                    return
            status = "200"
        except asyncio.CancelledError:
            status = "client_disconnect"
            raise
        except Exception:
            status = "error"
            log.exception("stream failed after the first byte")
            raise
        finally:
            if status == "200":
                if kept:
                    await self.cache.put(key, b"".join(kept))
            else:  # client gone, timeout or a stage failed: stop every stage's work
                gen.cancel()
                metrics.inc("tts_stream_aborted_total", reason=status)
            rec.finish(status)

    async def synthesize(self, request: Union[SpeechRequest, dict]) -> bytes:
        """Handle API: the whole audio file."""
        req = _as_request(request)
        audio = await self._audio(req, RequestRecord.start(req, _request_id(), client="handle"))
        return audio if isinstance(audio, bytes) else b"".join([b async for b in audio])

    async def stream(self, request: Union[SpeechRequest, dict]) -> AsyncIterator[bytes]:
        """Handle API (``.options(stream=True)``): audio bytes as they are made."""
        req = _as_request(request)
        audio = await self._audio(req, RequestRecord.start(req, _request_id(), client="handle"))
        if isinstance(audio, bytes):
            yield audio
            return
        async for data in audio:
            yield data

    # ------------------------------------------------------------------ HTTP routes

    def _authorize(self, request: Request) -> str:
        """The caller's id for limits: its key's fingerprint, or its address when keys are off."""
        key_id = self.auth.check(request.headers.get("authorization"))
        if self.auth.enabled:
            return key_id
        return "ip:" + (request.client.host if request.client else "unknown")

    @api.post("/v1/audio/speech", response_class=StreamingResponse)
    async def speech(self, body: SpeechRequest, request: Request):
        # Serve's proxy already answers with X-Request-Id (the caller's, if it sent one).
        rec = RequestRecord.start(body, _request_id(), client="http", log_text=self.settings.log_text)
        try:
            client = self._authorize(request)
            self.limiter.acquire(client)
        except APIError as exc:
            rec.finish(str(exc.status))
            return error_response(exc)
        try:
            audio = await self._audio(body, rec, request.headers.get("cache-control", ""))
        except APIError as exc:
            self.limiter.release(client)
            return error_response(exc)
        headers = {"X-Weights": self.weights_kind, "X-Cache": rec.cache, "Cache-Control": "no-store"}
        if isinstance(audio, bytes):
            if body.stream_format != "sse":
                # A hit goes out as one plain response: no streaming round trips through the proxy.
                self.limiter.release(client)
                return Response(audio, media_type=body.content_type, headers=headers)
            audio = _once(audio)
        if body.stream_format == "sse":
            usage = {"input_tokens": len(body.input), "output_tokens": 0, "total_tokens": len(body.input)}
            audio = sse_stream(audio, usage)
        return StreamingResponse(_released(audio, self.limiter, client), media_type=body.content_type, headers=headers)

    @api.get("/v1/models", response_model=ModelList)
    async def models(self, request: Request) -> ModelList:
        self._authorize(request)
        return ModelList(data=[ModelCard(id=m) for m in MODEL_IDS])

    @api.get("/v1/voices", response_model=VoiceList)
    async def voices(self, request: Request) -> VoiceList:
        self._authorize(request)
        return VoiceList(data=[VoiceCard(id=v["id"], seed=v["seed"], description="OpenAI voice name; any 'seed:<n>' works too") for v in list_voices()])

    @api.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/readyz")
    async def readyz(self):
        if self._ready.is_set():
            return {"status": "ready", "weights": self.weights_kind}
        status = {"status": "warming_up" if self._warmup_error is None else "failed", "error": self._warmup_error}
        return JSONResponse(status, status_code=503, headers={"Retry-After": "2"})
