"""Ingress (CPU): the OpenAI-compatible HTTP API and the Python handle API of the app.

HTTP: ``POST /v1/audio/speech`` streams audio by chunked transfer as it is made;
``WS /v1/audio/speech/stream`` speaks text while it is still being written (``serve_app/realtime/``);
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

from fastapi import Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from serve_app.serving import metrics
from serve_app.http.app import BodyLimits, error_response, make_app, overloaded, sse_stream, stage_error
from serve_app.storage.cache import CacheConfig, make_cache, request_key
from serve_app.engine.types import Plan, StreamSummary, Voice
from serve_app.engine.voices import VoiceResolver, list_voices
from serve_app.protocol import (
    MODEL_IDS,
    APIError,
    ModelCard,
    ModelList,
    SessionCreated,
    SessionStart,
    SpeechRequest,
    VoiceCard,
    VoiceList,
    to_api_error,
)
from serve_app.realtime import SessionLimits, serve_session
from serve_app.http.security import APIKeyAuth, StreamLimiter, load_api_keys
from serve_app.settings import IngressSettings
from serve_app.storage.voices import VoiceStoreConfig
from serve_app.http.voices import VOICES_PATH, VoicesAPI
from serve_app.http.webui import page_response

log = logging.getLogger("ray.serve")


BODY_LIMITS = BodyLimits(IngressSettings().max_body_bytes)
api = make_app(BODY_LIMITS)


def _as_request(request: Union[SpeechRequest, dict]) -> SpeechRequest:
    if isinstance(request, SpeechRequest):
        return request
    try:
        return SpeechRequest.model_validate(request)
    except Exception as exc:  # pydantic.ValidationError
        raise to_api_error(exc) from None


def _voice_label(voice: str) -> str:
    return voice if len(voice) <= 32 else f"speaker:{voice[:8]}"  # a speaker string is long


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
        return cls(request_id, _voice_label(req.voice), len(req.input), req.response_format, req.stream_format, client,
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


class _GraphBackend:
    """A WebSocket session's way into the graph: per cut, a TextNormalizer plan (with the voice
    resolved once, at the session's start); per segment, a Vocoder stream (as an HTTP request),
    cancelled when the session stops reading it."""

    def __init__(self, normalizer: DeploymentHandle, vocoder: DeploymentHandle):
        self.normalizer = normalizer
        self.vocoder = vocoder
        self.voice: Optional[Voice] = None

    async def plan(self, text: str, options: Any) -> Plan:
        try:
            return await self.normalizer.plan.remote(text, options, self.voice)
        except BackPressureError:
            raise overloaded() from None

    async def audio(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        gen = self.vocoder.options(stream=True).stream.remote(plan, response_format)
        done = False
        try:
            async for item in gen:
                yield item
            done = True
        except BackPressureError:
            raise overloaded() from None
        finally:
            if not done:  # cancel, disconnect, or a failure: stop every stage's work
                gen.cancel()


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


# Replicas, resources and autoscaling come from the config file (config/serve.yaml).
@serve.deployment
@serve.ingress(api)
class Ingress:
    def __init__(
        self,
        normalizer: DeploymentHandle,
        vocoder: DeploymentHandle,
        acoustic: DeploymentHandle,
        settings: Optional[dict] = None,
        cache: Optional[dict] = None,
        voices: Optional[dict] = None,
    ):
        self.normalizer = normalizer
        self.vocoder = vocoder
        self.acoustic = acoustic
        self.weights_kind = "unknown"
        self.weights_id = "unknown"
        self._queue_rows = 0
        self._poll_task: Optional[asyncio.Task] = None
        self._apply(IngressSettings.model_validate(settings or {}))
        self.cache_config = CacheConfig.model_validate(cache or {})
        self.cache = make_cache(self.cache_config)
        self.voices = VoiceResolver()
        voice_config = VoiceStoreConfig.model_validate(voices or {})
        BODY_LIMITS.route_max_bytes[VOICES_PATH] = voice_config.max_upload_bytes  # clip uploads
        self.voice_api = VoicesAPI(voice_config, vocoder)  # the Vocoder stage encodes clips and seeds
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

    @staticmethod
    def _check_model(model: str) -> None:
        if model not in MODEL_IDS:
            raise APIError(404, f"model {model!r} does not exist; use one of {', '.join(MODEL_IDS)}", param="model", code="model_not_found")

    def _check(self, req: SpeechRequest) -> None:
        self._check_model(req.model)
        if len(req.input) > self.settings.max_input_chars:
            raise APIError(413, f"input is {len(req.input)} characters; the limit is {self.settings.max_input_chars}", param="input", code="input_too_long")

    async def _plan(self, req: SpeechRequest, voice: Voice) -> Plan:
        options = req.to_options()
        plan = await self.normalizer.plan.remote(req.input, options, voice)
        if req.refine_text:
            busy = self.settings.skip_refine_queue_rows
            if busy is not None and self._queue_rows >= busy:
                log.info("queue at %d rows: skipping refine_text", self._queue_rows)
            else:
                seed = plan.segments[0].seed if plan.segments else 0
                texts = await self.acoustic.refine.remote(plan.texts, seed)
                plan = await self.normalizer.replan.remote(texts, options, voice)
        return plan

    async def _open(self, req: SpeechRequest, voice: Voice) -> tuple[Any, bytes, Plan]:
        """Plan and start a synthesis; return the byte stream, its first chunk and the plan."""
        gen = None
        try:
            plan = await self._plan(req, voice)
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
        except Exception as exc:  # noqa: BLE001
            raise stage_error(exc, "synthesis failed", "synthesis_failed") from None

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
            # Built-in or custom (the voice store): an unknown voice fails here, before any work.
            voice = await self.voice_api.directory.resolve(req.voice)
            key = request_key(req, voice, weights_id=self.weights_id) if self.weights_id != "unknown" else None
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
                gen, first, plan = await asyncio.wait_for(self._open(req, voice), self.settings.request_timeout_s)
            except asyncio.TimeoutError:
                raise APIError(504, f"no audio within {self.settings.request_timeout_s:g}s", type="server_error",
                               code="timeout") from None
        except Exception as exc:
            api_exc = to_api_error(exc)
            if api_exc is None:
                raise
            rec.finish(str(api_exc.status))
            raise api_exc from None
        rec.segments = len(plan.segments)
        return self._chain(first, gen, rec, key)

    async def _chain(self, first: bytes, gen: Any, rec: RequestRecord, key: Optional[str]) -> AsyncIterator[bytes]:
        """Forward the stream within the deadline; record metrics and the log line; cache it."""
        status = "aborted"
        kept: Optional[list[bytes]] = [] if key else None
        size = 0
        limit = self.cache_config.max_item_bytes
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

    def _authorize(self, request: Union[Request, WebSocket], api_key: Optional[str] = None) -> str:
        """The caller's id for limits: its key's fingerprint, or its address when keys are off.
        ``api_key``: a key sent in a WebSocket session's first message, when no header has one."""
        authorization = request.headers.get("authorization") or (f"Bearer {api_key}" if api_key else None)
        key_id = self.auth.check(authorization)
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

    @api.websocket("/v1/audio/speech/stream")
    async def speech_stream(self, ws: WebSocket) -> None:
        """Text in as it is written, audio out as it is made (protocol: ``protocol.SessionStart``
        and the messages after it; session logic: ``serve_app/realtime/``)."""
        await ws.accept()
        request_id = _request_id()
        holder: list[str] = []  # the client id once its stream slot is taken
        rec = RequestRecord(request_id, "", 0, "", "ws", "ws")
        backend = _GraphBackend(self.normalizer, self.vocoder)

        async def admit(start: SessionStart) -> SessionCreated:
            client = self._authorize(ws, start.api_key)
            self._check_model(start.model)
            # Built-in or custom (the voice store): an unknown voice fails here, before any work.
            backend.voice = await self.voice_api.directory.resolve(start.voice)
            self._check_busy()
            self.limiter.acquire(client)
            holder.append(client)
            rec.voice, rec.format = _voice_label(start.voice), start.response_format
            return SessionCreated(id=request_id, response_format=start.response_format, sample_rate=24000,
                                  weights=self.weights_kind)

        limits = SessionLimits(max_text_chars=self.settings.max_input_chars, max_message_bytes=self.settings.max_body_bytes,
                               segment_timeout_s=self.settings.request_timeout_s)
        try:
            _, stats = await serve_session(ws, backend, admit, limits)
        finally:
            if holder:
                self.limiter.release(holder[0])
        rec.chars, rec.segments, rec.audio_s = stats.chars, stats.segments, round(stats.audio_seconds, 3)
        rec.ttfb_s = stats.first_audio_s  # from the session's start: it includes the client's writing
        rec.finish(stats.status)

    @api.get("/v1/models", response_model=ModelList)
    async def models(self, request: Request) -> ModelList:
        self._authorize(request)
        return ModelList(data=[ModelCard(id=m) for m in MODEL_IDS])

    @api.get("/v1/voices", response_model=VoiceList)
    async def voices(self, request: Request) -> VoiceList:
        self._authorize(request)
        return VoiceList(data=[VoiceCard(id=v["id"], seed=v["seed"], description="OpenAI voice name; any 'seed:<n>' works too") for v in list_voices()])

    # ------------------------------------------------------------------ voices users own (serve_app/http/voices.py)

    @api.post(VOICES_PATH, openapi_extra={"requestBody": {"content": {
        "application/json": {"schema": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "speaker": {"type": "string"}, "seed": {"type": "integer"}}}},
        "multipart/form-data": {"schema": {"type": "object", "required": ["name", "audio", "transcript"], "properties": {
            "name": {"type": "string"}, "audio": {"type": "string", "format": "binary"}, "transcript": {"type": "string"}}}},
    }}})
    async def create_voice(self, request: Request):
        """A custom voice from a speaker string, a seed, or a 2-30 s clip and its transcript."""
        self._authorize(request)
        return await self.voice_api.create(request)

    @api.get(VOICES_PATH)
    async def list_voices(self, request: Request):
        """Built-in and custom voices."""
        self._authorize(request)
        return await self.voice_api.list()

    @api.get(VOICES_PATH + "/{voice_id}")
    async def get_voice(self, voice_id: str, request: Request):
        """One voice, with its speaker string (and a clip voice's codes and transcript) to keep."""
        self._authorize(request)
        return await self.voice_api.get(voice_id)

    @api.delete(VOICES_PATH + "/{voice_id}")
    async def delete_voice(self, voice_id: str, request: Request):
        self._authorize(request)
        return await self.voice_api.delete(voice_id)

    # ------------------------------------------------------------------ the web page (serve_app/http/static/)

    @api.get("/", include_in_schema=False)
    async def root(self):
        return RedirectResponse("ui/")

    @api.get("/ui/{name:path}", include_in_schema=False)
    async def ui(self, name: str):
        return page_response(name)

    @api.get("/healthz")
    async def healthz(self) -> dict:
        return {"status": "ok"}

    @api.get("/readyz")
    async def readyz(self):
        if self._ready.is_set():
            return {"status": "ready", "weights": self.weights_kind}
        status = {"status": "warming_up" if self._warmup_error is None else "failed", "error": self._warmup_error}
        return JSONResponse(status, status_code=503, headers={"Retry-After": "2"})
