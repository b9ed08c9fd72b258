"""The edge cache: the answers the Ingress gives from its response cache, kept for a short while
in Serve's HTTP proxy and given again there, without a trip to an Ingress replica.

A cache hit costs the Ingress about a millisecond, but the trip to it costs what every Serve
request costs on top: the proxy routes it, the replica reads the body back from the proxy in a
second call, and the answer (a 10 s WAV is ~480 KB) crosses the object store; on a 2-core box
that was 8-18 ms against 5-8 ms for ``/healthz`` (bench/README.md, "Cache hits"). Here the
proxy keeps what the Ingress marked as edge-cacheable (``EDGE_HEADER``: a whole answer from its
cache, for a plain request whose voice is content-addressed: a built-in voice, ``seed:<n>`` or a
speaker string, never a stored voice, whose content may change under its name; and whose audio no
lexicon can change: ``lexicon: "none"``, or none named without a key, never a key's default or a
named lexicon, which may be replaced or deleted: ``SpeechService._edge_cacheable``) under the exact
request: path, ``Authorization`` header and body bytes. So only the same credential gets it, and
an answer is at most ``ttl_s`` old: a revoked key, a deleted voice or new weights reach every
client within it. ``Cache-Control: no-cache`` / ``no-store`` always go through.

Looking a request up means reading its body here, before the Ingress has checked anything, so
the edge reads one only for a request that carries a credential (or once the Ingress's answers
said that keys are off: ``middleware.AUTH_HEADER: open``), and only within ``body_timeout_s`` of
the request's start: past it the answer is 408 ``body_timeout``, a refusal the front guard counts.
A request without a key goes on unread, to the Ingress's 401 from its headers.

Installed with the front guard (``front_guard.middlewares``); settings from the env var
``CHATTTS_EDGE_CACHE`` (``settings.EdgeCacheConfig``). State is per proxy process, bounded.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.errors import APIError
from serve_app.http.middleware import AUTH_HEADER, credential, header, send_error
from serve_app.settings import EDGE_HEADER, EdgeCacheConfig

ENV = "CHATTTS_EDGE_CACHE"
PATHS = ("/v1/audio/speech",)
_EDGE = EDGE_HEADER.encode()
_AUTH = AUTH_HEADER.encode()
_DROPPED = {_EDGE, b"x-request-id", b"date", b"server", b"content-length"}


@dataclass
class _Entry:
    expires: float
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class EdgeCache:
    """The entries, least recently used first out past ``max_bytes``."""

    def __init__(self, settings: EdgeCacheConfig, clock: Callable[[], float] = time.monotonic):
        self.s = settings
        self.clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self.bytes = 0
        self.hits = self.stores = 0

    def get(self, key: str) -> Optional[_Entry]:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= self.clock():
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return entry

    def put(self, key: str, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        if len(body) > self.s.max_item_bytes:
            return
        self._drop(key)
        self._entries[key] = _Entry(self.clock() + self.s.ttl_s, status, headers, body)
        self.bytes += len(body)
        self.stores += 1
        while self.bytes > self.s.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self.bytes -= len(entry.body)

    def __len__(self) -> int:
        return len(self._entries)


def request_key(scope: Scope, body: bytes) -> str:
    """The exact request: path, credential and body (a hash: no key or text is kept)."""
    h = hashlib.sha256(scope.get("path", "").encode())
    h.update(b"\0" + (credential(scope) or "").encode("latin-1") + b"\0")
    h.update(body)
    return h.hexdigest()


class EdgeCacheMiddleware:
    """ASGI middleware: answers a request it has an edge entry for; keeps the marked answers."""

    def __init__(
        self, app: ASGIApp, settings: Optional[EdgeCacheConfig] = None, clock: Callable[[], float] = time.monotonic
    ):
        self.app = app
        self.s = settings or EdgeCacheConfig()
        self.cache = EdgeCache(self.s, clock)
        # Keys off at the Ingress, as its last answer here said (AUTH_HEADER "open"; a 401 or
        # "key": on). Until it says so, a request without a credential is never read here.
        self.keys_off = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            not self.s.enabled
            or scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in PATHS
            or _bypass(header(scope, b"cache-control") or "")
        ):
            await self.app(scope, receive, send)
            return
        if not credential(scope) and not self.keys_off:
            await self.app(scope, receive, self._learning(send))  # unread: the Ingress answers it from its headers
            return
        try:
            body, complete, replay = await _read_body(receive, self.s.max_body_bytes, self.s.body_timeout_s)
        except asyncio.TimeoutError:
            await send_error(
                send,
                APIError(
                    408,
                    f"the request body did not arrive within {self.s.body_timeout_s:g} s",
                    code="body_timeout",
                    headers={"Connection": "close"},
                ),
            )
            return
        if not complete:  # too large to key: the request goes on as it came
            await self.app(scope, replay, self._learning(send))
            return
        key = request_key(scope, body)
        entry = self.cache.get(key)
        if entry is not None:
            headers = [*entry.headers, (b"x-request-id", uuid.uuid4().hex.encode()), (b"x-edge-cache", b"hit")]
            await send({"type": "http.response.start", "status": entry.status, "headers": headers})
            await send({"type": "http.response.body", "body": entry.body, "more_body": False})
            return
        await self.app(scope, replay, self._keeping(send, key))

    def _learn(self, start: Message) -> None:
        """Whether keys are off, from an answer's start (the Ingress's mark, or a 401)."""
        mark = next((v for k, v in start.get("headers", ()) if k.lower() == _AUTH), None)
        if mark is not None or start.get("status") == 401:
            self.keys_off = mark == b"open"

    def _learning(self, send: Send) -> Send:
        async def learn(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._learn(message)
                headers = message.get("headers", [])
                if any(k.lower() == _EDGE for k, _ in headers):  # not kept: the mark still never shows
                    message = dict(message, headers=[(k, v) for k, v in headers if k.lower() != _EDGE])
            await send(message)

        return learn

    def _keeping(self, send: Send, key: str) -> Send:
        state: dict = {}

        async def keep(message: Message) -> None:
            if message["type"] == "http.response.start":
                self._learn(message)
                headers = message.get("headers", [])
                if any(k.lower() == _EDGE for k, _ in headers):
                    state["start"] = message
                    message = dict(message, headers=[(k, v) for k, v in headers if k.lower() != _EDGE])
            elif message["type"] == "http.response.body" and "start" in state:
                state.setdefault("body", []).append(message.get("body", b""))
                if not message.get("more_body", False):
                    start = state.pop("start")
                    kept = [(k, v) for k, v in start.get("headers", []) if k.lower() not in _DROPPED]
                    self.cache.put(key, start["status"], kept, b"".join(state.pop("body")))
            await send(message)

        return keep


def _bypass(cache_control: str) -> bool:
    directives = {d.strip().lower() for d in cache_control.split(",")}
    return bool(directives & {"no-cache", "no-store"})


async def _read_body(receive: Receive, limit: int, timeout_s: float) -> tuple[bytes, bool, Receive]:
    """The request body if it is at most ``limit`` bytes (complete True), and a ``receive`` that
    gives the app what was read, then the rest as it comes. ``asyncio.TimeoutError`` if what it
    reads is not in within ``timeout_s``: a byte now and then holds no socket here for longer."""
    messages: list[Message] = []
    size = 0
    deadline = time.monotonic() + timeout_s
    while True:
        message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
        messages.append(message)
        if message["type"] != "http.request":
            break
        size += len(message.get("body", b""))
        if size > limit or not message.get("more_body", False):
            break
    complete = size <= limit and messages[-1]["type"] == "http.request" and not messages[-1].get("more_body", False)
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.request")

    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return body, complete, replay


def settings_from_env(environ: Optional[dict[str, str]] = None) -> EdgeCacheConfig:
    raw = (environ if environ is not None else os.environ).get(ENV, "").strip()
    return EdgeCacheConfig.model_validate_json(raw) if raw else EdgeCacheConfig()
