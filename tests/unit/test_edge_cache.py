"""The edge cache middleware (http/edge_cache.py) in front of a real ASGI app: what it keeps
(only answers the app marks), under which request (path, credential, body), for how long, how
much, and what it always lets through."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from serve_app.http.edge_cache import EDGE_HEADER, EdgeCacheMiddleware, settings_from_env
from serve_app.settings import EdgeCacheSettings


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
        return Response(b"audio:" + body * 100, media_type="audio/wav", headers={**headers, "x-request-id": "app"})

    return Starlette(routes=[Route("/v1/audio/speech", speech, methods=["POST"]), Route("/other", speech, methods=["POST"])])


def _client(settings: EdgeCacheSettings = EdgeCacheSettings(), clock=None):
    calls: list = []
    mw = EdgeCacheMiddleware(_app(calls), settings=settings, clock=clock or Clock())
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=mw), base_url="http://t"), calls, mw


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
        client, calls, mw = _client(EdgeCacheSettings(ttl_s=10, max_bytes=2500, max_item_bytes=2000), clock)
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
        client, calls, _ = _client(EdgeCacheSettings(max_body_bytes=1024))
        body = b"mark" + b"y" * 5000
        async with client:
            r = await client.post("/v1/audio/speech", content=body)
            await client.post("/v1/audio/speech", content=body)
        assert calls == [body, body] and r.content == b"audio:" + body * 100

    asyncio.run(run())


def test_settings_from_the_environment():
    assert settings_from_env({}) == EdgeCacheSettings()
    assert settings_from_env({"CHATTTS_EDGE_CACHE": '{"enabled": false, "ttl_s": 5}'}).ttl_s == 5
