"""Ingress (CPU): the OpenAI-compatible HTTP API and the Python handle API of the app.

HTTP: ``POST /v1/audio/speech`` streams audio by chunked transfer as it is made;
``GET /v1/models``, ``/v1/voices``, ``/healthz``, ``/readyz``. Handle: ``synthesize(request)``
-> bytes and ``stream(request)`` (with ``.options(stream=True)``) for other Ray apps.

Every request is validated and planned (normalised, split, voice resolved) before any byte is
sent, and the first audio chunk is awaited before the response starts, so an error before
audio still gets its proper status and an OpenAI-style body.
"""


import asyncio
import logging
import time
import uuid
from typing import Any, AsyncIterator, Optional, Union

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app.api import BodyLimits, error_response, make_app, sse_stream
from serve_app import metrics
from serve_app.cache import CacheConfig, make_cache, request_key
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
        self.settings = IngressSettings.model_validate(settings or {})
        BODY_LIMITS.max_bytes = self.settings.max_body_bytes
        self.weights_kind = "unknown"
        self.weights_id = "unknown"
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

    # ------------------------------------------------------------------ shared by HTTP and handles

    def _check(self, req: SpeechRequest) -> None:
        if req.model not in MODEL_IDS:
            raise APIError(404, f"model {req.model!r} does not exist; use one of {', '.join(MODEL_IDS)}", param="model", code="model_not_found")
        if len(req.input) > self.settings.max_input_chars:
            raise APIError(413, f"input is {len(req.input)} characters; the limit is {self.settings.max_input_chars}", param="input", code="input_too_long")

    async def _open(self, req: SpeechRequest) -> tuple[Any, bytes]:
        """Plan and start a synthesis; return the byte stream and its first chunk."""
        try:
            plan = await self.normalizer.plan.remote(req)
            gen = self.vocoder.options(stream=True).stream.remote(plan, req.response_format)
            try:
                first = await gen.__anext__()
            except StopAsyncIteration:
                first = b""
            return gen, first
        except Exception as exc:  # noqa: BLE001
            cause = _unwrap(exc)
            if isinstance(cause, APIError):
                raise cause from None
            log.exception("synthesis failed before the first byte")
            raise APIError(500, "synthesis failed", type="server_error", code="synthesis_failed") from None

    async def _audio(self, req: SpeechRequest) -> tuple[AsyncIterator[bytes], str]:
        """The request's audio stream and its cache status (hit, miss or bypass).

        Errors before the first audio byte raise APIError; a hit is answered from the cache.
        """
        t0 = time.perf_counter()
        self._check(req)
        key = request_key(req, weights_id=self.weights_id) if self.weights_id != "unknown" else None
        if key is not None:
            cached = await self.cache.get(key)
            metrics.inc("tts_cache_total", result="hit" if cached is not None else "miss")
            if cached is not None:
                return self._replay(cached, req.response_format, t0), "hit"
        else:
            metrics.inc("tts_cache_total", result="bypass")
        try:
            gen, first = await self._open(req)
        except APIError as exc:
            metrics.inc("tts_requests_total", status=str(exc.status), format=req.response_format)
            raise
        return self._chain(first, gen, req.response_format, t0, key), "miss" if key else "bypass"

    async def _replay(self, data: bytes, fmt: str, t0: float) -> AsyncIterator[bytes]:
        metrics.observe("tts_ttfb_seconds", time.perf_counter() - t0, format=fmt)
        yield data
        metrics.observe("tts_request_duration_seconds", time.perf_counter() - t0, format=fmt)
        metrics.inc("tts_requests_total", status="200", format=fmt)

    async def _chain(self, first: bytes, gen: Any, fmt: str, t0: float, key: Optional[str] = None) -> AsyncIterator[bytes]:
        """Forward the stream; record metrics; store complete audio in the cache."""
        completed = False
        reason = "client_disconnect"
        kept: Optional[list[bytes]] = [] if key else None
        size = 0
        limit = self.settings.cache.max_item_bytes
        metrics.observe("tts_ttfb_seconds", time.perf_counter() - t0, format=fmt)
        try:
            data = first
            while True:
                if data:
                    if kept is not None:
                        size += len(data)
                        kept = kept if size <= limit else None
                        if kept is not None:
                            kept.append(data)
                    yield data
                try:
                    data = await gen.__anext__()
                except StopAsyncIteration:
                    break
            completed = True
        except Exception:
            reason = "error"
            log.exception("stream failed after the first byte")
            raise
        finally:
            if completed:
                metrics.observe("tts_request_duration_seconds", time.perf_counter() - t0, format=fmt)
                metrics.inc("tts_requests_total", status="200", format=fmt)
                if kept:
                    await self.cache.put(key, b"".join(kept))
            else:  # client gone or a stage failed: stop every stage's work
                gen.cancel()
                metrics.inc("tts_stream_aborted_total", reason=reason)
                metrics.inc("tts_requests_total", status="aborted", format=fmt)

    async def synthesize(self, request: Union[SpeechRequest, dict]) -> bytes:
        """Handle API: the whole audio file."""
        audio, _ = await self._audio(_as_request(request))
        return b"".join([b async for b in audio])

    async def stream(self, request: Union[SpeechRequest, dict]) -> AsyncIterator[bytes]:
        """Handle API (``.options(stream=True)``): audio bytes as they are made."""
        audio, _ = await self._audio(_as_request(request))
        async for data in audio:
            yield data

    # ------------------------------------------------------------------ HTTP routes

    @api.post("/v1/audio/speech", response_class=StreamingResponse)
    async def speech(self, body: SpeechRequest, request: Request):
        # Serve's proxy already answers with X-Request-Id (the caller's, if it sent one).
        request_id = _request_id()
        t0 = time.perf_counter()
        try:
            audio, cache_status = await self._audio(body)
        except APIError as exc:
            return error_response(exc)
        headers = {"X-Weights": self.weights_kind, "X-Cache": cache_status, "Cache-Control": "no-store"}
        if body.stream_format == "sse":
            usage = {"input_tokens": len(body.input), "output_tokens": 0, "total_tokens": len(body.input)}
            audio = sse_stream(audio, usage)
        log.info("speech %s started in %.3fs (cache %s)", request_id, time.perf_counter() - t0, cache_status)
        return StreamingResponse(audio, media_type=body.content_type, headers=headers)

    @api.get("/v1/models", response_model=ModelList)
    async def models(self) -> ModelList:
        return ModelList(data=[ModelCard(id=m) for m in MODEL_IDS])

    @api.get("/v1/voices", response_model=VoiceList)
    async def voices(self) -> VoiceList:
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
