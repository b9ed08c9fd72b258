"""HTTP plumbing of the ingress: the FastAPI app, OpenAI-style error handlers, body limits, SSE.

The routes themselves live on the Ingress deployment (``deployments/ingress.py``); everything
here is plain FastAPI/Starlette, so it is testable without Ray.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any, AsyncIterator, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from ray.serve.exceptions import BackPressureError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ..protocol import APIError, error_body, to_api_error

log = logging.getLogger("chattts_serve.api")


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def overloaded() -> APIError:
    """A stage's queue is full (Serve's ``max_queued_requests``): 503, the client may retry."""
    return APIError(503, "server overloaded: a stage's queue is full; retry shortly", type="server_error",
                    code="overloaded", headers={"Retry-After": "1"})


def stage_error(exc: BaseException, failed: str, code: str) -> APIError:
    """The APIError to answer when a call to another stage raised ``exc``: a full queue is 503,
    a known error (bad voice, bad clip, ...) keeps its own status, anything else is logged here
    and answered 500 "``failed``" with ``code`` (the client never sees a traceback)."""
    if isinstance(exc, BackPressureError):
        return overloaded()
    known = to_api_error(exc)
    if known is not None:
        return known
    # Serve's own logger: the line lands in the replica's log beside the request's.
    logging.getLogger("ray.serve").error("%s", failed, exc_info=exc)
    return APIError(500, failed, type="server_error", code=code)


def _validation_param(loc: tuple) -> Optional[str]:
    parts = [str(p) for p in loc if p not in ("body",)]
    return ".".join(parts) or None


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        param = _validation_param(tuple(first.get("loc", ())))
        kind = first.get("type", "")
        if kind == "json_invalid":
            message, code, param = "request body is not valid JSON", "invalid_json", None
        elif kind == "missing":
            message, code = f"missing required parameter: {param}", "missing_required_parameter"
        else:
            message, code = f"invalid value for {param}: {first.get('msg', 'invalid')}", "invalid_value"
        return JSONResponse(error_body(message, param=param, code=code), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, APIError):  # FastAPI wraps errors raised while reading the
            return error_response(exc.__cause__)  # body (the chunked body limit) as a plain 400
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(
            error_body(str(exc.detail), type=kind, code=str(exc.status_code)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body("internal error", type="server_error", code="internal_error"), status_code=500)


class BodyLimitMiddleware:
    """Reject bodies over ``max_bytes`` with 413 without reading them whole.

    A declared Content-Length over the limit is refused before any body byte is read; a
    chunked body is counted as it streams and cut off at the limit.
    """

    def __init__(self, app: ASGIApp, limits: "BodyLimits"):
        self.app = app
        self.limits = limits

    @property
    def max_bytes(self) -> int:
        return self.limits.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        limit = self.limits.limit_for(scope)
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    too_big = int(value) > limit
                except ValueError:
                    too_big = False
                if too_big:
                    await _send_json(send, 413, self._body(limit))
                    return
        seen = 0

        async def limited_receive() -> dict:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise APIError(413, f"request body exceeds {limit} bytes", code="body_too_large")
            return message

        await self.app(scope, limited_receive, send)

    def _body(self, limit: int) -> dict[str, Any]:
        return error_body(f"request body exceeds {limit} bytes", code="body_too_large")


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": data})


class BodyLimits:
    """HTTP settings the deployment applies after the app is built (the app object is created at
    import time, before the deployment's config is known): body limit and CORS origins."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.route_max_bytes: dict[str, int] = {}  # exact paths with their own limit (uploads)
        self.cors_origins: list[str] = []

    def limit_for(self, scope: Scope) -> int:
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):]
        return self.route_max_bytes.get(path, self.max_bytes)


class DynamicCORS:
    """CORS off unless origins are configured; then Starlette's CORSMiddleware does the work."""

    def __init__(self, app: ASGIApp, limits: BodyLimits):
        self.app = app
        self.limits = limits
        self._cors: Optional[ASGIApp] = None
        self._origins: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.limits.cors_origins:
            await self.app(scope, receive, send)
            return
        if self._cors is None or self._origins != self.limits.cors_origins:
            from starlette.middleware.cors import CORSMiddleware

            self._origins = list(self.limits.cors_origins)
            self._cors = CORSMiddleware(
                self.app,
                allow_origins=self._origins,
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                expose_headers=["X-Request-Id", "X-Cache", "X-Weights"],
            )
        await self._cors(scope, receive, send)


def make_app(limits: BodyLimits) -> FastAPI:
    app = FastAPI(
        title="chattts-serve",
        version="0.1.0",
        description="ChatTTS text-to-speech with an OpenAI-compatible API, on Ray Serve.",
    )
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, limits=limits)
    app.add_middleware(DynamicCORS, limits=limits)  # outermost: preflight answers never hit limits
    return app


def sse_event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def sse_stream(audio: AsyncIterator[bytes], usage: dict[str, Any]) -> AsyncIterator[bytes]:
    """OpenAI's speech SSE: ``speech.audio.delta`` events with base64 audio, then ``speech.audio.done``."""
    async for data in audio:
        yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    yield sse_event({"type": "speech.audio.done", "usage": usage})
