"""ASGI middleware of the HTTP API: body limits and CORS, both set live from the Ingress's settings
through one ``HttpPolicy`` object."""

from __future__ import annotations

import json
from typing import Any, Optional

from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import APIError, error_body


class BodyLimitMiddleware:
    """Reject bodies over ``max_bytes`` with 413 without reading them whole.

    A declared Content-Length over the limit is refused before any body byte is read; a
    chunked body is counted as it streams and cut off at the limit.
    """

    def __init__(self, app: ASGIApp, policy: "HttpPolicy"):
        self.app = app
        self.policy = policy

    @property
    def max_bytes(self) -> int:
        return self.policy.max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH"):
            await self.app(scope, receive, send)
            return
        limit = self.policy.limit_for(scope)
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


class HttpPolicy:
    """What the middleware enforces, set by the deployment after the app is built (the FastAPI app
    is created at import time, before the deployment's settings are known, and they change live):
    the body limit, per-route body limits (uploads) and the CORS origins."""

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

    def __init__(self, app: ASGIApp, policy: HttpPolicy):
        self.app = app
        self.policy = policy
        self._cors: Optional[ASGIApp] = None
        self._origins: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.policy.cors_origins:
            await self.app(scope, receive, send)
            return
        if self._cors is None or self._origins != self.policy.cors_origins:
            from starlette.middleware.cors import CORSMiddleware

            self._origins = list(self.policy.cors_origins)
            self._cors = CORSMiddleware(
                self.app,
                allow_origins=self._origins,
                allow_methods=["GET", "POST", "OPTIONS"],
                allow_headers=["Authorization", "Content-Type", "X-Request-Id"],
                expose_headers=["X-Request-Id", "X-Cache", "X-Weights"],
            )
        await self._cors(scope, receive, send)
