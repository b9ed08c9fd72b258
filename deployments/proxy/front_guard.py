"""The front guard: a refusal budget per client, enforced in Serve's HTTP proxy before a request
is routed (nginx's ``limit_req`` and HAProxy's ``tarpit``, learnt from the service's answers).

Every limit of the service answers a hostile request with a cheap 4xx, but each answer is still a
trip through the proxy and an Ingress call, and a client that retries at once can send thousands
a second: a few hundred refused WebSocket handshakes or unauthenticated bodies in a loop queue
everyone else behind them. The guard watches what the service answers each client (its address
plus a fingerprint of its ``Authorization`` header, never the key itself): every 4xx spends a
token, tokens come back at ``refusals_per_s``, and a client with none left is answered 429
``too_many_refusals`` by the guard itself after ``tarpit_s`` (so a client that waits for its
answer slows to one attempt per ``tarpit_s``), without reaching the Ingress. A client whose
credential the Ingress has never authenticated also spends from its address's bucket, so made-up
keys do not buy fresh budgets; a client whose key it has authenticated (its answers carry
``middleware.AUTH_HEADER: key``, which the guard takes off) is judged by its own bucket alone and
kept in its own table, so a key that works is neither held up nor forgotten for a flood of
unknown credentials from the same address.

Installed through Ray's hook ``RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH=deployments.proxy.front_guard:middlewares``
(in Serve's proxy, and in each Ingress replica's own HTTP server with HAProxy's front door);
settings from the env var ``CHATTTS_FRONT_GUARD`` (``settings.FrontGuardConfig``). State is per
proxy process, like nginx's per instance. Light on purpose (no torch, no Ray): it runs in the proxy.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import os
import time
from collections import OrderedDict
from typing import Any, Callable, Optional

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.errors import error_body
from serve_app.http.middleware import AUTH_HEADER, credential
from serve_app.settings import FrontGuardConfig

log = logging.getLogger("ray.serve")

ENV = "CHATTTS_FRONT_GUARD"
WARN_EVERY_S = 60.0  # one log line per refused client or address at most this often
_AUTH = AUTH_HEADER.encode()
_STARTS = ("http.response.start", "websocket.accept", "websocket.http.response.start")


class Bucket:
    """A token bucket of refusals; ``served``: the Ingress has authenticated this client's key."""

    __slots__ = ("tokens", "at", "served", "held", "warned")

    def __init__(self, burst: int, now: float):
        self.tokens = float(burst)
        self.at = now
        self.served = False
        self.held = 0  # requests of this key being held in the tarpit now
        self.warned = -math.inf  # when the guard last logged that it refuses this key

    def refill(self, rate: float, burst: int, now: float) -> None:
        self.tokens = min(float(burst), self.tokens + (now - self.at) * rate)
        self.at = now

    def wait_s(self, rate: float) -> int:
        """Whole seconds until the next token (Retry-After)."""
        return max(1, math.ceil((1.0 - self.tokens) / rate))


class Buckets:
    """Buckets by key, the least recently seen forgotten first past ``max_keys``."""

    def __init__(self, rate: float, burst: int, max_keys: int, clock: Callable[[], float]):
        self.rate, self.burst, self.max_keys, self.clock = rate, burst, max_keys, clock
        self._buckets: OrderedDict[Any, Bucket] = OrderedDict()

    def get(self, key: Any) -> Bucket:
        now = self.clock()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = Bucket(self.burst, now)
            if len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(key)
            bucket.refill(self.rate, self.burst, now)
        return bucket

    def find(self, key: Any) -> Optional[Bucket]:
        """The key's bucket (refilled, marked recently seen), or None; never adds one."""
        bucket = self._buckets.get(key)
        if bucket is not None:
            self._buckets.move_to_end(key)
            bucket.refill(self.rate, self.burst, self.clock())
        return bucket

    def adopt(self, key: Any, bucket: Bucket) -> None:
        """Keep ``bucket`` under ``key`` (the least recently seen out past ``max_keys``)."""
        self._buckets[key] = bucket
        self._buckets.move_to_end(key)
        while len(self._buckets) > self.max_keys:
            self._buckets.popitem(last=False)

    def pop(self, key: Any) -> None:
        self._buckets.pop(key, None)

    def give_back(self, bucket: Bucket) -> None:
        """A token taken up front comes back (never past the burst)."""
        bucket.tokens = min(float(self.burst), bucket.tokens + 1)

    def __len__(self) -> int:
        return len(self._buckets)


class Clients:
    """Client buckets in two bounded tables: ``served`` (the Ingress authenticated the client's
    key) and ``unknown`` (never authenticated: made-up keys, no key, keys off). Only a served
    client can push a served one out, so a flood of unknown credentials, however many, churns
    its own table and never takes a paying key's standing with it."""

    def __init__(self, rate: float, burst: int, max_served: int, max_unknown: int, clock: Callable[[], float]):
        self.rate, self.burst, self.clock = rate, burst, clock
        self.served = Buckets(rate, burst, max_served, clock)
        self.unknown = Buckets(rate, burst, max_unknown, clock)

    def get(self, key: Any) -> Bucket:
        return self.served.find(key) or self.unknown.get(key)

    def mark_served(self, key: Any, bucket: Bucket) -> None:
        if not bucket.served:
            bucket.served = True
            self.unknown.pop(key)
        self.served.adopt(key, bucket)  # also back in, if a churn of served ones pushed it out meanwhile

    def give_back(self, bucket: Bucket) -> None:
        bucket.tokens = min(float(self.burst), bucket.tokens + 1)

    def __len__(self) -> int:
        return len(self.served) + len(self.unknown)


def client_of(scope: Scope) -> tuple[str, str]:
    """(address, credential fingerprint): a hash of the credential (Authorization, or xi-api-key
    as its bearer token: the Ingress reads it so too), '' without one."""
    client = scope.get("client")
    address = client[0] if client else "unknown"
    authorization = credential(scope)
    return address, hashlib.blake2b(authorization.encode("latin-1"), digest_size=8).hexdigest() if authorization else ""


class FrontGuard:
    """ASGI middleware: a client out of refusal tokens is answered 429 here, after the tarpit."""

    def __init__(
        self, app: ASGIApp, settings: Optional[FrontGuardConfig] = None, clock: Callable[[], float] = time.monotonic
    ):
        self.app = app
        self.s = s = settings or FrontGuardConfig()
        self.clients = Clients(s.refusals_per_s, s.refusal_burst, s.max_served_clients, s.max_clients, clock)
        self.addresses = Buckets(s.address_refusals_per_s, s.address_refusal_burst, s.max_clients, clock)
        self.held = 0
        self.refused: dict[str, int] = {
            "client": 0,
            "address": 0,
        }  # answered by the guard, by the bucket that was empty
        self._metric = _counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        if not self.s.enabled:
            await self.app(scope, receive, _watching(send, [], None))  # the Ingress's mark still goes
            return
        address, credential = client_of(scope)
        key = (address, credential)
        client = self.clients.get(key)
        if client.tokens < 1:
            await self._refuse(scope, receive, send, "client", self.clients, client, address, credential)
            return
        addr = None
        if not client.served:
            addr = self.addresses.get(address)
            if addr.tokens < 1:
                await self._refuse(scope, receive, send, "address", self.addresses, addr, address, credential)
                return
        # A client not yet served, or refused lately, pays up front (given back as soon as the
        # answer is not a refusal): a burst of concurrent attempts cannot overdraw its budget
        # before the answers come. A served client with a full bucket goes on trust.
        ticket = Ticket(self, client, addr) if addr is not None or client.tokens < self.s.refusal_burst else None
        status: list[int] = []
        authenticated: list[bool] = []
        try:
            await self.app(scope, receive, _watching(send, status, ticket, authenticated))
        finally:
            if ticket is not None:
                ticket.settle(status[0] if status else None)
            if status and (len(status) > 1 or (ticket is None and 400 <= status[0] < 500)):
                client.tokens = max(0.0, client.tokens - 1)  # refused after the fact (or after an accept)
            # Served only when the Ingress says it authenticated the key: never for a public page
            # (``/healthz`` answers any header 200) or with keys off, whatever the status.
            if authenticated and credential:
                self.clients.mark_served(key, client)

    async def _refuse(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        where: str,
        buckets: Buckets,
        bucket: Bucket,
        address: str,
        credential: str,
    ) -> None:
        self.refused[where] += 1
        if self._metric is not None:
            self._metric.inc(tags={"bucket": where})
        now = self.clients.clock()
        if now - bucket.warned >= WARN_EVERY_S:
            bucket.warned = now
            log.warning(
                "front guard: %s %s (credential %s) is out of refusal budget; its requests get 429 after %g s",
                where,
                address,
                credential or "none",
                self.s.tarpit_s,
            )
        addr = self.addresses.get(address)
        if self.s.tarpit_s > 0 and addr.held < self.s.max_tarpitted_per_address and self.held < self.s.max_tarpitted:
            addr.held += 1
            self.held += 1
            try:
                await asyncio.sleep(self.s.tarpit_s)
            finally:
                addr.held -= 1
                self.held -= 1
        retry = bucket.wait_s(buckets.rate)
        body = json.dumps(
            error_body(
                f"too many refused requests from this client; retry after {retry} s",
                "rate_limit_error",
                code="too_many_refusals",
            )
        ).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(retry).encode()),
            (b"connection", b"close"),
        ]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 429, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif "websocket.http.response" in scope.get("extensions", {}):
            await receive()  # websocket.connect
            await send({"type": "websocket.http.response.start", "status": 429, "headers": headers})
            await send({"type": "websocket.http.response.body", "body": body})
        else:
            await receive()
            await send({"type": "websocket.close", "code": 1008, "reason": "too_many_refusals"})  # a 403 handshake


class Ticket:
    """Tokens taken up front from a client (and its address while it was never served), settled
    by the answer's first status: a refusal keeps them, anything else gives them back."""

    def __init__(self, guard: FrontGuard, client: Bucket, addr: Optional[Bucket]):
        self.guard, self.client, self.addr = guard, client, addr
        self.open = True
        client.tokens -= 1
        if addr is not None:
            addr.tokens -= 1

    def settle(self, status: Optional[int]) -> None:
        if not self.open:
            return
        self.open = False
        if status is not None and 400 <= status < 500:
            return
        self.guard.clients.give_back(self.client)
        if self.addr is not None:
            self.guard.addresses.give_back(self.addr)


def _watching(
    send: Send, status: list[int], ticket: Optional[Ticket], authenticated: Optional[list[bool]] = None
) -> Send:
    """``send`` that notes the answer's status (and settles the ticket on it): HTTP's; a
    WebSocket's accept as 101, a handshake refused by a close as 403, a denial response's own;
    then a session closed by the service with a 44xx code as that 4xx. The Ingress's
    ``AUTH_HEADER`` is taken off the answer (``authenticated`` notes a ``key`` one)."""

    async def watched(message: Message) -> None:
        kind = message["type"]
        if kind in _STARTS and any(k.lower() == _AUTH for k, _ in message.get("headers", ())):
            headers = message["headers"]
            if authenticated is not None and any(k.lower() == _AUTH and v == b"key" for k, v in headers):
                authenticated.append(True)
            message = {**message, "headers": [(k, v) for k, v in headers if k.lower() != _AUTH]}
        if not status:
            if kind in ("http.response.start", "websocket.http.response.start"):
                status.append(int(message["status"]))
            elif kind == "websocket.accept":
                status.append(101)
            elif kind == "websocket.close":
                status.append(403)
            if status and ticket is not None:
                ticket.settle(status[0])
        elif kind == "websocket.close" and status[0] == 101 and 4400 <= int(message.get("code") or 0) < 4500:
            status.append(int(message["code"]) - 4000)
        await send(message)

    return watched


def _counter():
    """``tts_front_guard_refused_total{bucket}`` where Ray's metrics are there (a proxy or replica)."""
    try:
        from ray.util.metrics import Counter

        return Counter(
            "tts_front_guard_refused_total",
            "Requests the front guard answered 429 itself, by the bucket that was empty.",
            tag_keys=("bucket",),
        )
    except Exception:  # noqa: BLE001 - outside Ray (tests, other ASGI servers) there is no metric
        return None


def settings_from_env(environ: Optional[dict[str, str]] = None) -> FrontGuardConfig:
    raw = (environ if environ is not None else os.environ).get(ENV, "").strip()
    return FrontGuardConfig.model_validate_json(raw) if raw else FrontGuardConfig()


def middlewares() -> list[Middleware]:
    """Ray's proxy callback: the edge cache (``edge_cache.py``, ``CHATTTS_EDGE_CACHE``), the guard,
    with the settings of ``CHATTTS_FRONT_GUARD``, and the client's end of streams' back-pressure
    (``flow_acks.py``), and the proxy's event-loop watch."""
    from deployments.proxy import edge_cache
    from deployments.proxy.flow_acks import FlowAcksMiddleware
    from deployments.proxy.front_door import pin_forwarded_allow_ips
    from serve_app.http.loop_watch import LoopWatchMiddleware

    settings = settings_from_env()
    edge = edge_cache.settings_from_env()
    # Before Ray builds this process's uvicorn server: whose X-Forwarded-For names the client.
    trusted = pin_forwarded_allow_ips(settings.forwarded_allow_ips)
    log.info("front guard: X-Forwarded-For believed from %s", trusted or "no one")
    log.info("front guard: %s; edge cache: %s", settings.model_dump_json(), edge.model_dump_json())
    # Ray wraps the app in list order, the last outermost: the guard sees the edge's answers (its
    # hits, its 408s) and refuses a client out of budget before the edge reads a body; the edge
    # sees the Ingress's AUTH_HEADER before the guard takes it off.
    # Outermost, the proxy's own event-loop watch (loop_watch.py): the hooks run on that loop.
    return [
        Middleware(edge_cache.EdgeCacheMiddleware, settings=edge),
        Middleware(FrontGuard, settings=settings),
        Middleware(FlowAcksMiddleware),
        Middleware(LoopWatchMiddleware),
    ]
