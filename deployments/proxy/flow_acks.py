"""The client's end of a stream's back-pressure (``pipeline/flow.py``): an ASGI middleware in front
of the Ingress that reports every block of a streamed answer the client's socket has taken.

Serve's HTTP proxy takes a replica's answer as fast as the replica sends it, whatever the client
reads, and holds the rest in its memory; a client reading slowly (or not at all) would make the
proxy hold up to a whole request's audio. Here, in the proxy (or, with HAProxy's front door, in
the Ingress replica's own HTTP server), each request is marked as one this middleware reports on
(``ACKS_HEADER``, whatever the client sent under that name), the answer's edge comes in its
``REF_HEADER`` (taken off before the client sees it), and every body block reported once the
server has handed it to the socket: the Ingress then stays at most a window ahead of the client,
and so does every stage before it. Installed with the front guard (``front_guard.middlewares``).

Every answer also says how long the proxy held the request before its answer started
(``Server-Timing: proxy;dur=<ms>``, this process's clock): with the client's own time to first
byte and the Ingress's, where a first audio's time went between the client and the Ingress.
"""

from __future__ import annotations

import time
from typing import Optional

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from serve_app.pipeline.flow import ACKS_HEADER, REF_HEADER, FlowAcks, FlowRef

_ACKS = ACKS_HEADER.encode()
_REF = REF_HEADER.encode()


class FlowAcksMiddleware:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t_in = time.perf_counter()
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != _ACKS]
        scope = dict(scope, headers=[*headers, (_ACKS, b"1")])
        acks: Optional[FlowAcks] = None

        async def send_reporting(message: Message) -> None:
            nonlocal acks
            if message["type"] == "http.response.start":
                kept, ref = [], None
                for k, v in message.get("headers", []):
                    if k.lower() == _REF:
                        ref = FlowRef.from_header(v.decode("latin-1"))
                    else:
                        kept.append((k, v))
                kept.append((b"server-timing", b"proxy;dur=%.1f" % ((time.perf_counter() - t_in) * 1000.0)))
                message = dict(message, headers=kept)
                if ref is not None:
                    acks = FlowAcks(ref)
            await send(message)  # returns once the server has the bytes (it waits while the socket is full)
            if acks is not None and message["type"] == "http.response.body":
                if message.get("body"):
                    acks.took()
                if not message.get("more_body", False):
                    acks.close()
                    acks = None

        try:
            await self.app(scope, receive, send_reporting)
        finally:
            if acks is not None:
                acks.close()
