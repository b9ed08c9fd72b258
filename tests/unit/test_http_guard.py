"""What the HTTP surface bounds before any work, as plain ASGI (no Ray): the caller from the headers
before a body byte is read, the body's size, time and nesting, the keys' grants, auth that fails
closed, and the stream slots that cannot leak (also across replicas: the counter's leases)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from fastapi import Request

from deployments.slots import SlotTable
from serve_app.callers import LocalSlots, hold_slot
from serve_app.errors import APIError
from serve_app.http.app import make_app
from serve_app.http.jsonlimits import JsonDepthGuard, check_json_depth
from serve_app.http.middleware import HttpPolicy, caller_of
from serve_app.http.security import APIKeyAuth, check_priority, key_id
from serve_app.settings import KeyConfig, SecurityConfig

KEY = "test-key-1"


def _app(policy: HttpPolicy):
    app = make_app(policy)

    @app.post("/v1/echo")
    async def echo(request: Request) -> dict:
        body = await request.body()
        caller = caller_of(request)
        return {"bytes": len(body), "caller": caller.id if caller else None}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok"}

    return app


def _policy(keys: str = KEY, body_timeout_s: float = 0.3, monkeypatch=None) -> HttpPolicy:
    monkeypatch.setenv("GUARD_TEST_KEYS", keys)
    auth = APIKeyAuth(SecurityConfig(api_keys_env="GUARD_TEST_KEYS", max_streams_per_key=2))
    return HttpPolicy(max_bytes=4096, body_timeout_s=body_timeout_s, auth=auth)


async def _call(app, path: str, headers: dict[str, str], chunks: list, method: str = "POST", stall: bool = False):
    """One HTTP request through the ASGI app: ``chunks`` are the body's pieces; ``stall`` never
    sends the rest. Returns (status, json body, seconds, body pieces the app asked for)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("10.0.0.9", 5000),
        "server": ("testserver", 80),
    }
    pieces = list(chunks)
    asked = 0
    sent: list[dict] = []

    async def receive():
        nonlocal asked
        asked += 1
        if pieces:
            body = pieces.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(pieces) or stall}
        await asyncio.sleep(3600)  # a client that never sends the rest

    async def send(message):
        sent.append(message)

    t0 = time.perf_counter()
    await asyncio.wait_for(app(scope, receive, send), 10)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(body or b"null"), time.perf_counter() - t0, asked


async def test_the_key_is_checked_before_any_body_byte_is_read(monkeypatch):
    app = _app(_policy(monkeypatch=monkeypatch))
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        status, body, took, asked = await _call(app, "/v1/echo", headers, [b'{"a"'], stall=True)
        assert status == 401 and body["error"]["code"] == "invalid_api_key" and asked == 0, (status, body, asked)
        assert took < 1.0
    # Public routes need no key.
    status, body, _, _ = await _call(app, "/healthz", {}, [], method="GET")
    assert status == 200


async def test_a_slow_body_gets_408_within_the_deadline(monkeypatch):
    app = _app(_policy(body_timeout_s=0.3, monkeypatch=monkeypatch))
    status, body, took, _ = await _call(
        app, "/v1/echo", {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, [b'{"a": '], stall=True
    )
    assert status == 408 and body["error"]["code"] == "body_timeout"
    assert 0.3 <= took < 2.0
    # A body in time passes, and the route sees the caller the guard identified.
    status, body, _, _ = await _call(
        app, "/v1/echo", {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, [b'{"a": ', b"1}"]
    )
    assert status == 200 and body == {"bytes": 8, "caller": key_id(KEY)}


async def test_oversized_bodies_are_413_declared_or_streamed(monkeypatch):
    app = _app(_policy(monkeypatch=monkeypatch))
    auth = {"Authorization": f"Bearer {KEY}"}
    status, body, _, asked = await _call(app, "/v1/echo", {**auth, "Content-Length": "5000"}, [b"x" * 10], stall=True)
    assert status == 413 and asked == 0  # refused on the declared length alone
    status, body, _, _ = await _call(
        app, "/v1/echo", {**auth, "Content-Type": "text/plain"}, [b"x" * 3000, b"x" * 3000]
    )
    assert status == 413 and body["error"]["code"] == "body_too_large"


@pytest.mark.parametrize("depth, status", [(32, 200), (33, 400), (100_000, 400)])
async def test_json_nesting_is_bounded_before_any_parser(monkeypatch, depth, status):
    app = _app(_policy(monkeypatch=monkeypatch))
    doc = "[" * depth + "]" * depth
    pieces = (
        [doc.encode()[i : i + 1000] for i in range(0, min(len(doc), 4000), 1000)]
        if depth < 1000
        else [doc.encode()[:4000]]
    )
    got, body, _, _ = await _call(
        app,
        "/v1/echo",
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
        pieces,
        stall=depth >= 1000,
    )
    assert got == status, body
    if status == 400:
        assert body["error"]["code"] == "invalid_json" and "nests deeper" in body["error"]["message"]


def test_json_depth_guard_reads_strings_and_escapes_across_pieces():
    doc = json.dumps({"a": [']]]]\\"[[[[', {"b": "\\"}], "c": "{" * 100}).encode()
    for cut in range(len(doc)):  # any split of the body into two pieces
        g = JsonDepthGuard(3)
        g.feed(doc[:cut])
        g.feed(doc[cut:])
    with pytest.raises(APIError):
        check_json_depth('{"a": [[[[1]]]]}', max_depth=4)
    t0 = time.process_time()  # CPU time: the box may be busy
    check_json_depth("[" + ",".join(["[[[1]]]"] * 20000) + "]")  # 160 KB, past any body limit
    assert time.process_time() - t0 < 0.5


def test_auth_required_fails_closed_and_grants_are_per_key(monkeypatch):
    monkeypatch.delenv("GUARD_NO_KEYS", raising=False)
    with pytest.raises(RuntimeError, match="required"):
        APIKeyAuth(SecurityConfig(auth="required", api_keys_env="GUARD_NO_KEYS"))
    anonymous = APIKeyAuth(SecurityConfig(api_keys_env="GUARD_NO_KEYS")).identify(None, "10.1.2.3")
    assert (anonymous.id, anonymous.owner, anonymous.max_priority) == ("ip:10.1.2.3", "anonymous", 0)
    monkeypatch.setenv("GUARD_TWO_KEYS", "k-plain,k-vip")
    auth = APIKeyAuth(
        SecurityConfig(
            api_keys_env="GUARD_TWO_KEYS",
            max_streams_per_key=3,
            keys={key_id("k-vip"): KeyConfig(max_priority=5, max_streams=10, admin=True)},
        )
    )
    plain, vip = auth.identify("Bearer k-plain", "a"), auth.identify("Bearer k-vip", "a")
    assert (plain.max_priority, plain.max_streams, plain.admin) == (0, 3, False)
    assert (vip.max_priority, vip.max_streams, vip.admin, vip.owner) == (5, 10, True, key_id("k-vip"))
    check_priority(vip, 5)
    with pytest.raises(APIError) as err:
        check_priority(plain, 1)
    assert (err.value.status, err.value.code, err.value.param) == (403, "priority_not_allowed", "priority")


async def test_local_slots_hold_the_limit_and_never_leak_on_cancel(monkeypatch):
    monkeypatch.setenv("GUARD_KEYS", KEY)
    caller = APIKeyAuth(SecurityConfig(api_keys_env="GUARD_KEYS", max_streams_per_key=2)).identify(f"Bearer {KEY}", "a")
    slots = LocalSlots()
    a, b = await hold_slot(slots, caller), await hold_slot(slots, caller)
    with pytest.raises(APIError) as err:
        await hold_slot(slots, caller)
    assert err.value.status == 429 and err.value.code == "too_many_streams"
    a.release()
    a.release()  # idempotent: a second release frees nothing more
    assert slots.held(caller.id) == 1
    b.release()
    assert slots.held(caller.id) == 0

    class SlowSlots(LocalSlots):
        async def acquire(self, caller):
            await asyncio.sleep(0.05)
            return await super().acquire(caller)

    slow = SlowSlots()
    task = asyncio.ensure_future(hold_slot(slow, caller))
    await asyncio.sleep(0.01)
    task.cancel()  # the caller gives up while the slot is being taken
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.sleep(0.1)
    assert slow.held(caller.id) == 0


def test_the_cluster_counter_leases_slots_and_learns_them_back():
    table = SlotTable(lease_s=10.0)
    assert table.acquire("k", 2, "t1", now=0.0) and table.acquire("k", 2, "t2", now=0.0)
    assert not table.acquire("k", 2, "t3", now=1.0)  # one limit for every replica
    assert table.acquire("other", 2, "t4", now=1.0)
    table.release("t1")
    assert table.acquire("k", 2, "t3", now=2.0)
    # A replica that died stops renewing: its slots free themselves after the lease.
    table.renew({"t3": "k"}, now=8.0)
    assert table.held("k", now=12.0) == 1  # t2 expired, t3 renewed
    # A restarted counter (empty) takes the live slots back from the next renewal, whatever the limit.
    fresh = SlotTable(lease_s=10.0)
    fresh.renew({"t3": "k", "t5": "k", "t6": "k"}, now=20.0)
    assert fresh.held("k", now=21.0) == 3 and not fresh.acquire("k", 2, "t7", now=21.0)
