"""The edge cache middleware (deployments/proxy/edge_cache.py) in front of a real ASGI app: what it keeps
(only answers the app marks), under which request (path, credential, body), for how long, how
much, and what it always lets through."""

from __future__ import annotations

import asyncio
import json

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from deployments.proxy.edge_cache import EDGE_HEADER, EdgeCacheMiddleware, settings_from_env
from serve_app.http.middleware import AUTH_HEADER
from serve_app.settings import EdgeCacheConfig


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _app(calls: list):
    async def speech(request: Request) -> Response:
        body = await request.body()
        calls.append(body)
        marked = b"mark" in body
        headers = {EDGE_HEADER: "1", "X-Cache": "hit"} if marked else {"X-Cache": "miss"}
        headers[AUTH_HEADER] = "key" if request.headers.get("authorization") else "open"  # as the Ingress with keys off
        return Response(b"audio:" + body * 100, media_type="audio/wav", headers={**headers, "x-request-id": "app"})

    return Starlette(
        routes=[Route("/v1/audio/speech", speech, methods=["POST"]), Route("/other", speech, methods=["POST"])]
    )


def _client(settings: EdgeCacheConfig = EdgeCacheConfig(), clock=None, key: str = "Bearer k1"):
    calls: list = []
    mw = EdgeCacheMiddleware(_app(calls), settings=settings, clock=clock or Clock())
    headers = {"Authorization": key} if key else {}
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t", headers=headers), calls, mw


def test_a_marked_answer_is_given_again_by_the_edge_for_the_same_request_only():
    async def run():
        client, calls, mw = _client()
        async with client:
            first = await client.post("/v1/audio/speech", content=b'{"input":"mark"}')
            again = await client.post("/v1/audio/speech", content=b'{"input":"mark"}')
            assert len(calls) == 1 and again.content == first.content
            assert again.headers["x-edge-cache"] == "hit" and again.headers["x-cache"] == "hit"
            assert EDGE_HEADER not in first.headers and EDGE_HEADER not in again.headers  # never shown
            assert again.headers["x-request-id"] != "app"  # its own id, not the stored answer's
            # Another credential, another body, another path: the app answers.
            await client.post("/v1/audio/speech", content=b'{"input":"mark"}', headers={"Authorization": "Bearer k2"})
            await client.post("/v1/audio/speech", content=b'{"input":"mark!"}')
            await client.post("/other", content=b'{"input":"mark"}')
            assert len(calls) == 4
            # no-cache / no-store always reach the app; unmarked answers are never kept.
            await client.post("/v1/audio/speech", content=b'{"input":"mark"}', headers={"Cache-Control": "no-cache"})
            await client.post("/v1/audio/speech", content=b'{"input":"plain"}')
            await client.post("/v1/audio/speech", content=b'{"input":"plain"}')
            assert len(calls) == 7 and len(mw.cache) == 3

    asyncio.run(run())


def test_entries_expire_and_memory_is_bounded():
    async def run():
        clock = Clock()
        client, calls, mw = _client(EdgeCacheConfig(ttl_s=10, max_bytes=2500, max_item_bytes=2000), clock)
        async with client:
            await client.post("/v1/audio/speech", content=b"mark-a")
            clock.t += 9
            await client.post("/v1/audio/speech", content=b"mark-a")
            assert len(calls) == 1
            clock.t += 2  # past its ttl
            await client.post("/v1/audio/speech", content=b"mark-a")
            assert len(calls) == 2
            for name in (b"mark-b", b"mark-c", b"mark-d"):  # each answer ~606 bytes: 4 fit in 2500
                await client.post("/v1/audio/speech", content=name)
            await client.post("/v1/audio/speech", content=b"mark-e")  # the least recently used goes
            assert mw.cache.bytes <= 2500 and len(mw.cache) == 4
            await client.post("/v1/audio/speech", content=b"mark-a")
            assert len(calls) == 7  # mark-a was the oldest: gone
            big = b"mark" + b"x" * 30
            await client.post("/v1/audio/speech", content=big)  # an answer over max_item_bytes
            await client.post("/v1/audio/speech", content=big)
            assert len(calls) == 9

    asyncio.run(run())


def test_a_body_too_large_to_key_goes_through_whole():
    async def run():
        client, calls, _ = _client(EdgeCacheConfig(max_body_bytes=1024))
        body = b"mark" + b"y" * 5000
        async with client:
            r = await client.post("/v1/audio/speech", content=body)
            await client.post("/v1/audio/speech", content=body)
        assert calls == [body, body] and r.content == b"audio:" + body * 100

    asyncio.run(run())


def test_settings_from_the_environment():
    assert settings_from_env({}) == EdgeCacheConfig()
    assert settings_from_env({"CHATTTS_EDGE_CACHE": '{"enabled": false, "ttl_s": 5}'}).ttl_s == 5


def _trickle(*chunks: bytes, gap_s: float):
    """A receive that gives a body a piece every ``gap_s`` seconds (a slow or hostile sender)."""
    pending = list(chunks)

    async def receive():
        await asyncio.sleep(gap_s)
        body = pending.pop(0)
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    return receive


async def _call(mw: EdgeCacheMiddleware, receive, authorization: bytes | None = b"Bearer k1") -> list[dict]:
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/audio/speech",
        "headers": [(b"authorization", authorization)] if authorization else [],
        "client": ("10.0.0.1", 1),
        "query_string": b"",
    }
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await mw(scope, receive, send)
    return sent


def test_a_body_that_trickles_past_the_deadline_is_408_before_any_app_call():
    """A byte now and then holds the socket at most ``body_timeout_s`` (before: as long as the
    sender liked, with no answer the front guard could count)."""

    async def run():
        calls: list = []
        mw = EdgeCacheMiddleware(_app(calls), settings=EdgeCacheConfig(body_timeout_s=0.3))
        t0 = asyncio.get_running_loop().time()
        sent = await _call(mw, _trickle(*[b"x"] * 100, gap_s=0.05))
        took = asyncio.get_running_loop().time() - t0
        assert sent[0]["status"] == 408 and calls == [] and 0.3 <= took < 0.6
        body = json.loads(sent[1]["body"])
        assert body["error"]["code"] == "body_timeout" and body["error"]["type"] == "invalid_request_error"
        assert (b"connection", b"close") in sent[0]["headers"]
        # A body that arrives in time, in pieces, is read and answered as before.
        sent = await _call(mw, _trickle(b'{"input":', b'"mark"}', gap_s=0.05))
        assert sent[0]["status"] == 200 and calls == [b'{"input":"mark"}']

    asyncio.run(run())


def test_a_request_without_a_key_is_never_read_until_the_ingress_says_keys_are_off():
    """Without a credential the body is not the edge's to wait for: the request goes on unread
    (the Ingress answers 401 from its headers when keys are on). Once an answer says keys are off
    (``AUTH_HEADER: open``), keyless requests are looked up; a 401 turns that off again."""

    async def run():
        seen: list[str] = []

        async def ingress(scope, receive, send):  # keys on: 401 before any body byte
            seen.append("call")
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        mw = EdgeCacheMiddleware(ingress, settings=EdgeCacheConfig(body_timeout_s=5))

        async def never():
            await asyncio.sleep(3600)

        sent = await asyncio.wait_for(_call(mw, never, authorization=None), 1)
        assert sent[0]["status"] == 401 and seen == ["call"] and mw.keys_off is False

        calls: list = []
        mw = EdgeCacheMiddleware(_app(calls))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t") as client:
            for _ in range(3):
                r = await client.post("/v1/audio/speech", content=b'{"input":"mark"}')
            assert AUTH_HEADER in r.headers  # the guard, outside, takes it off
        assert mw.keys_off is True and len(calls) == 2 and r.headers["x-edge-cache"] == "hit"  # the first one taught it

    asyncio.run(run())


def test_the_edge_mark_never_shows_on_an_answer_the_edge_did_not_read():
    async def run():
        client, calls, _ = _client(key="")  # keys not yet known to be off: the request goes on unread
        async with client:
            r = await client.post("/v1/audio/speech", content=b'{"input":"mark"}')
        assert r.status_code == 200 and EDGE_HEADER not in r.headers and len(calls) == 1

    asyncio.run(run())
