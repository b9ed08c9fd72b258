"""ASGI middleware of the HTTP API: who is calling (before any body byte is read), what a body may
cost (size, time, JSON nesting), and CORS. All of it comes from one immutable ``HttpPolicy`` in
the app's state: the FastAPI app is created at import time, before the deployment's settings are
known, so the Ingress builds the policy from its settings and swaps it in whole (``install_policy``)
at start and on each live change; until then every guarded route answers 503 ``starting``.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import APIError
from .jsonlimits import MAX_JSON_DEPTH, JsonDepthGuard
from .security import APIKeyAuth

# Routes anyone may call, each with why (``tests/unit/test_route_rules.py`` holds every route to a
# decision: public here, or keyed by the guard below; docs/operations.md lists them).
PUBLIC_PATHS: Mapping[str, str] = MappingProxyType(
    {
        "/": "a redirect to the web page",
        "/healthz": "liveness for load balancers and probes",
        "/health": "the same for monitors and wyoming-openai, which probe /health",
        "/readyz": "readiness for load balancers and probes",
        "/openapi.json": "the API's schema, no data",
        "/v1/audio/models": "the speech model ids: Open WebUI asks for {base}/audio/models without a key",
    }
)
PUBLIC_PREFIXES: Mapping[str, str] = MappingProxyType(
    {"/ui/": "the web page's static files; the page asks for a key itself"}
)
# GET routes a request without an ``Authorization`` header may call where keys are on: the route
# sees no caller and answers what needs none. A request that sends a key is checked as everywhere.
KEYLESS_GETS: Mapping[str, str] = MappingProxyType(
    {
        "/v1/audio/voices": "the built-in voices alone (Open WebUI lists voices without a key)",
        "/v1/voices": "the built-in voices alone, as GET /v1/audio/voices",
    }
)
# Set on the answer to a request the guard below identified: "key" when it authenticated an API
# key, "open" when keys are off (the caller is its address). The front guard (Serve's proxy)
# trusts a credential only on "key" and takes the header off; the edge cache learns from it
# whether keys are off. Public paths never carry it.
AUTH_HEADER = "x-chattts-auth"


@dataclass(frozen=True)
class HttpPolicy:
    """What the middleware enforces, as one value: replaced whole, never changed in place."""

    max_bytes: int
    body_timeout_s: float = 30.0
    # (method, exact path) of the routes with a limit of their own (uploads): a GET of the same path
    # keeps ``max_bytes``.
    route_max_bytes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    cors_origins: tuple[str, ...] = ()
    max_json_depth: int = MAX_JSON_DEPTH
    auth: Optional[APIKeyAuth] = None  # None: the Ingress has not configured it yet (all 503)

    def __post_init__(self) -> None:
        object.__setattr__(self, "route_max_bytes", MappingProxyType(dict(self.route_max_bytes)))
        object.__setattr__(self, "cors_origins", tuple(self.cors_origins))

    @staticmethod
    def path_of(scope: Scope) -> str:
        path, root = scope.get("path", ""), scope.get("root_path", "")
        return path[len(root) :] if root and path.startswith(root) else path

    def limit_for(self, method: str, path: str) -> int:
        return self.route_max_bytes.get((method, path), self.max_bytes)

    @staticmethod
    def is_public(path: str) -> bool:
        return path in PUBLIC_PATHS or path.startswith(tuple(PUBLIC_PREFIXES))


def install_policy(app: Any, policy: HttpPolicy) -> None:
    """Make ``policy`` the one the app's middleware enforces from its next request on."""
    app.state.policy = policy


def header(scope: Scope, name: bytes) -> Optional[str]:
    """A request header's value from the ASGI scope (``name`` lower-case), or None."""
    for key, value in scope.get("headers", []):
        if key == name:
            return value.decode("latin-1")
    return None


# ElevenLabs' clients (their SDK, the voice-agent frameworks' plugins) send their key as this
# header: it is the same key as ``Authorization: Bearer <key>``, wherever a key is read.
XI_API_KEY = b"xi-api-key"


def credential(scope: Scope) -> Optional[str]:
    """The request's credential as an Authorization value: its ``Authorization`` header, else its
    ``xi-api-key`` as a bearer token; None without either."""
    authorization = header(scope, b"authorization")
    if authorization is None:
        key = header(scope, XI_API_KEY)
        if key is not None:
            return f"Bearer {key}"
    return authorization


async def send_error(send: Send, exc: APIError) -> None:
    data = json.dumps(exc.body()).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.lower().encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class GuardMiddleware:
    """Before the app sees a request: the caller, from the headers alone (401 before any body byte
    is read; the caller lands in ``request.state.caller``; ``credential``: Authorization, or
    ElevenLabs' xi-api-key); then the body, read under its limits:
    a declared Content-Length over the limit is refused at once, a streamed body is cut at the
    limit (413), a body not complete within ``body_timeout_s`` of the request's start is 408, and
    a JSON body nesting deeper than ``max_json_depth`` is 400. A WebSocket handshake without an
    Authorization header passes: the session's first message may carry the key."""

    def __init__(self, app: ASGIApp, state: Any):
        self.app = app
        self._state = state  # the FastAPI app's state: its ``policy`` is read once per request

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["t_in"] = time.perf_counter()  # the request log's ingress_http hop
        policy: HttpPolicy = self._state.policy
        path = policy.path_of(scope)
        if not policy.is_public(path):
            try:
                mark = self._identify(scope, path, policy.auth)
            except APIError as exc:
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 4000 + exc.status, "reason": exc.code or ""})
                else:
                    await send_error(send, exc)
                return
            if mark is not None:
                send = _marking(send, mark)
        if scope["type"] != "http" or not _may_have_body(scope):
            await self.app(scope, receive, send)
            return
        limit = policy.limit_for(scope.get("method", ""), path)
        declared = header(scope, b"content-length")
        if declared is not None and declared.strip().isdigit() and int(declared) > limit:
            await send_error(send, _too_large(limit))
            return
        await self.app(scope, self._bounded(scope, receive, limit, policy), send)

    @staticmethod
    def _identify(scope: Scope, path: str, auth: Optional[APIKeyAuth]) -> Optional[bytes]:
        """Identify the caller (401 if it cannot be); the ``AUTH_HEADER`` value its answers carry."""
        if auth is None:
            raise APIError(
                503, "the server is starting", type="server_error", code="starting", headers={"Retry-After": "2"}
            )
        authorization = credential(scope)
        if scope["type"] == "websocket" and authorization is None:
            return None  # the session's first message may carry the key (the session checks it)
        if authorization is None and auth.enabled and scope.get("method") == "GET" and path in KEYLESS_GETS:
            return None  # no caller: the route answers what needs no key
        client = scope.get("client")
        caller = auth.identify(authorization, client[0] if client else "unknown")
        scope.setdefault("state", {})["caller"] = caller
        return b"key" if auth.enabled else b"open"

    @staticmethod
    def _bounded(scope: Scope, receive: Receive, limit: int, policy: HttpPolicy) -> Receive:
        deadline = time.monotonic() + policy.body_timeout_s
        ctype = (header(scope, b"content-type") or "").split(";")[0].strip().lower()
        depth = JsonDepthGuard(policy.max_json_depth) if ctype in ("application/json", "") else None
        seen = 0
        done = False

        async def bounded_receive() -> Message:
            nonlocal seen, done
            if done:  # the body is in; what follows (a disconnect) has no deadline
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                raise APIError(
                    408, f"the request body did not arrive within {policy.body_timeout_s:g} s", code="body_timeout"
                ) from None
            if message["type"] == "http.request":
                body = message.get("body", b"")
                seen += len(body)
                if seen > limit:
                    raise _too_large(limit)
                if depth is not None:
                    depth.feed(body)
                done = not message.get("more_body", False)
            else:
                done = True
            return message

        return bounded_receive


def _may_have_body(scope: Scope) -> bool:
    """Every method's body is bounded, not only POST's: a route that reads none is never offered
    more than the limit, and one added later that reads one, whatever its method, is bounded
    already. A GET or DELETE declaring no body (no Content-Length, no Transfer-Encoding) has none."""
    if scope.get("method") in ("POST", "PUT", "PATCH"):
        return True
    declared = header(scope, b"content-length")
    return header(scope, b"transfer-encoding") is not None or (
        declared is not None and declared.strip() not in ("", "0")
    )


def _marking(send: Send, value: bytes) -> Send:
    """``send`` that adds ``AUTH_HEADER: value`` to the answer's start (or a WebSocket's accept)."""
    name = AUTH_HEADER.encode()

    async def marked(message: Message) -> None:
        if message["type"] in ("http.response.start", "websocket.accept", "websocket.http.response.start"):
            message = {**message, "headers": [*message.get("headers", []), (name, value)]}
        await send(message)

    return marked


def _too_large(limit: int) -> APIError:
    return APIError(413, f"request body exceeds {limit} bytes", code="body_too_large")


class DynamicCORS:
    """CORS off unless origins are configured; then Starlette's CORSMiddleware does the work."""

    def __init__(self, app: ASGIApp, state: Any):
        self.app = app
        self._state = state
        self._cors: Optional[ASGIApp] = None
        self._origins: tuple[str, ...] = ()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        origins = self._state.policy.cors_origins
        if not origins:
            await self.app(scope, receive, send)
            return
        if self._cors is None or self._origins != origins:
            from starlette.middleware.cors import CORSMiddleware

            self._origins = origins
            self._cors = CORSMiddleware(
                self.app,
                allow_origins=list(origins),
                allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
                allow_headers=["Authorization", "xi-api-key", "Content-Type", "X-Request-Id", "Cache-Control"],
                expose_headers=["X-Request-Id", "X-Cache", "X-Weights"],
            )
        await self._cors(scope, receive, send)


def caller_of(scope_or_request: Any):
    """The caller the guard identified for this request (a ``security.Caller``), or None."""
    scope = getattr(scope_or_request, "scope", scope_or_request)
    return scope.get("state", {}).get("caller")
