"""The front guard as plain ASGI (no Ray): a client's refusal budget, the per-address budget of
clients never authenticated, the tarpit, WebSocket handshakes, and what the service's answers
teach it (only the Ingress's mark of an authenticated key makes a client served)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import httpx
import pytest

from deployments.proxy.front_guard import FrontGuard, middlewares, settings_from_env
from serve_app.http.middleware import AUTH_HEADER
from serve_app.settings import HOOK_ENV, IMPORT_PATH, FrontGuardConfig

GOOD = "Bearer good-key"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


MARK = [(AUTH_HEADER.encode(), b"key")]  # what the Ingress adds to its answers to an authenticated key


async def service(scope, receive, send) -> None:
    """Stands in for the proxy's routing and the Ingress: /ok answers 200 to the good key (marked
    authenticated), 401 to any other; /healthz 200 to anyone, unmarked, as a public page."""
    if scope["type"] == "websocket":
        await receive()
        headers = dict(scope["headers"])
        if headers.get(b"authorization") == GOOD.encode():
            await send({"type": "websocket.accept", "headers": MARK})
            await send({"type": "websocket.close", "code": int(scope["path"].rsplit("/", 1)[-1] or 1000)})
        else:
            await send({"type": "websocket.close", "code": 4401})
        return
    headers = dict(scope["headers"])
    good = headers.get(b"authorization") == GOOD.encode()
    if scope["path"] == "/healthz":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    if scope["path"] == "/fail":
        status = 500
    elif scope["path"] == "/bad":
        status = 400
    else:
        status = 200 if good else 401
    await send({"type": "http.response.start", "status": status, "headers": MARK if good else []})
    await send({"type": "http.response.body", "body": b"{}"})


def _guard(clock: Clock, **settings) -> FrontGuard:
    s = {
        "tarpit_s": 0.0,
        "refusal_burst": 3,
        "refusals_per_s": 1.0,
        "address_refusal_burst": 5,
        "address_refusals_per_s": 1.0,
        **settings,
    }
    return FrontGuard(service, FrontGuardConfig(**s), clock=clock)


async def _get(
    guard: FrontGuard, key: str | None = None, address: str = "10.0.0.1", path: str = "/ok"
) -> httpx.Response:
    transport = httpx.ASGITransport(app=guard, client=(address, 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        return await client.get(path, headers={"Authorization": key} if key else {})


def _fp(key: str) -> str:
    from deployments.proxy.front_guard import client_of

    return client_of({"headers": [(b"authorization", key.encode())]})[1]


async def _statuses(guard: FrontGuard, n: int, **kw) -> list[int]:
    return [(await _get(guard, **kw)).status_code for _ in range(n)]


def test_a_client_out_of_budget_is_answered_by_the_guard_and_recovers_at_the_rate():
    clock = Clock()
    guard = _guard(clock, address_refusal_burst=100)

    async def run():
        assert await _statuses(guard, 3, key="Bearer wrong") == [401, 401, 401]  # the burst reaches the service
        r = await _get(guard, key="Bearer wrong")
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_refusals"
        assert r.headers["retry-after"] == "1" and r.headers["connection"] == "close"
        assert guard.refused == {"client": 1, "address": 0}
        clock.now += 1.0  # one token back: one more trip to the service, then the guard again
        assert await _statuses(guard, 2, key="Bearer wrong") == [401, 429]
        # Another credential from the same address, and the good key, are other clients.
        assert await _statuses(guard, 2, key="Bearer other") == [401, 401]
        assert await _statuses(guard, 5, key=GOOD) == [200] * 5

    asyncio.run(run())


def test_made_up_keys_share_their_address_budget_while_a_served_key_passes():
    clock = Clock()
    guard = _guard(clock)

    async def run():
        assert (await _get(guard, key=GOOD)).status_code == 200  # served: judged by its own bucket only
        got = [(await _get(guard, key=f"Bearer made-up-{i}")).status_code for i in range(8)]
        assert got == [401] * 5 + [429] * 3  # five refusals from the address, then the guard
        assert guard.refused["address"] == 3
        assert await _statuses(guard, 3, key=GOOD) == [200] * 3
        assert (await _get(guard, key="Bearer new", address="10.0.0.2")).status_code == 401  # another address

    asyncio.run(run())


def test_server_errors_and_successes_cost_nothing():
    clock = Clock()
    guard = _guard(clock)

    async def run():
        assert await _statuses(guard, 10, key="Bearer any", path="/fail") == [500] * 10
        assert await _statuses(guard, 10, key=GOOD) == [200] * 10
        assert guard.refused == {"client": 0, "address": 0}

    asyncio.run(run())


def test_concurrent_attempts_of_an_unserved_client_cannot_overdraw_its_budget():
    clock = Clock()
    guard = _guard(clock, refusal_burst=4, address_refusal_burst=100)

    async def run():
        got = await asyncio.gather(*(_get(guard, key="Bearer wrong") for _ in range(30)))
        statuses = sorted(r.status_code for r in got)
        assert statuses.count(401) == 4 and statuses.count(429) == 26

    asyncio.run(run())


def test_a_served_client_refused_lately_pays_up_front():
    """A served client with a full bucket goes on trust; once refused it pays before each request,
    so concurrent bad requests cannot overdraw it; good answers give the token back at once."""
    clock = Clock()
    guard = _guard(clock)

    async def run():
        assert await _statuses(guard, 4, key=GOOD) == [200] * 4  # trusted: no tokens move
        assert guard.clients.get(("10.0.0.1", _fp(GOOD))).tokens == 3
        assert (await _get(guard, key=GOOD, path="/bad")).status_code == 400  # 2 tokens left
        got = sorted(
            (await asyncio.gather(*(_get(guard, key=GOOD, path="/bad") for _ in range(10)))),
            key=lambda r: r.status_code,
        )
        assert [r.status_code for r in got] == [400] * 2 + [429] * 8
        clock.now += 2.0
        assert await _statuses(guard, 2, key=GOOD) == [200, 200]  # paid up front, given back

    asyncio.run(run())


def test_the_tarpit_holds_a_refused_request_and_is_bounded_per_address():
    clock = Clock()
    guard = _guard(clock, tarpit_s=0.3, refusal_burst=1, max_tarpitted_per_address=2)

    async def run():
        assert (await _get(guard, key="Bearer wrong")).status_code == 401
        t0 = time.perf_counter()
        r = await _get(guard, key="Bearer wrong")
        assert r.status_code == 429 and time.perf_counter() - t0 >= 0.3

        # Past the bound, refused requests are answered at once.
        async def timed():
            t = time.perf_counter()
            r = await _get(guard, key="Bearer wrong")
            return r.status_code, time.perf_counter() - t

        got = await asyncio.gather(*(timed() for _ in range(6)))
        assert [status for status, _ in got] == [429] * 6 and guard.held == 0
        assert sum(1 for _, took in got if took >= 0.3) == 2

    asyncio.run(run())


def test_websocket_handshakes_and_session_close_codes_teach_the_guard():
    clock = Clock()
    guard = _guard(clock, address_refusal_burst=100)

    async def handshake(key: str | None, path: str = "/ws/1000", extensions=None) -> list[dict]:
        scope = {
            "type": "websocket",
            "path": path,
            "headers": [(b"authorization", key.encode())] if key else [],
            "client": ("10.0.0.1", 5000),
            "extensions": extensions or {},
        }
        sent: list[dict] = []

        async def receive():
            return {"type": "websocket.connect"}

        async def send(message):
            sent.append(message)

        await guard(scope, receive, send)
        return sent

    async def run():
        for _ in range(3):  # refused handshakes (a close before the accept: a 403)
            assert (await handshake(None))[-1]["code"] == 4401
        assert (await handshake(None))[-1] == {"type": "websocket.close", "code": 1008, "reason": "too_many_refusals"}
        denial = await handshake(None, extensions={"websocket.http.response": {}})
        assert denial[0]["type"] == "websocket.http.response.start" and denial[0]["status"] == 429
        for _ in range(5):  # sessions that end normally cost nothing
            assert [m["type"] for m in await handshake(GOOD, "/ws/1000")] == ["websocket.accept", "websocket.close"]
        # A session accepted, then closed by the service with a 44xx code, was refused too.
        for _ in range(3):
            assert (await handshake(GOOD, "/ws/4413"))[0]["type"] == "websocket.accept"
        assert (await handshake(GOOD, "/ws/4413"))[-1]["code"] == 1008
        assert guard.refused["client"] == 3  # the no-key client twice, the good key once

    asyncio.run(run())


def test_memory_is_bounded_by_max_clients():
    clock = Clock()
    guard = _guard(clock, max_clients=16)

    async def run():
        for i in range(50):
            await _get(guard, key=f"Bearer k{i}", address=f"10.1.0.{i}")
        assert len(guard.clients) <= 16 and len(guard.addresses) <= 16

    asyncio.run(run())


def test_public_pages_never_make_a_credential_served():
    """Made-up keys each seen once on /healthz (200 to anyone) stay unknown: their refusals still
    spend the address's budget (before: each became "served" and its 401s bypassed it)."""
    clock = Clock()
    guard = _guard(clock, refusal_burst=20, address_refusal_burst=5)
    keys = [f"Bearer made-up-{i}" for i in range(50)]

    async def run():
        for key in keys:
            assert (await _get(guard, key=key, path="/healthz")).status_code == 200
        got = [(await _get(guard, key=key)).status_code for key in keys for _ in range(20)]
        assert got.count(401) == 5 and got.count(429) == 995  # the address's burst, not 50 x 20
        assert len(guard.clients.served) == 0
        # The Ingress's mark never reaches the client; a real key is served on it.
        r = await _get(guard, key=GOOD, address="10.0.0.9")
        assert r.status_code == 200 and AUTH_HEADER not in r.headers
        assert len(guard.clients.served) == 1

    asyncio.run(run())


def test_a_keys_off_answer_or_a_marked_public_page_makes_no_one_served():
    """Only the value ``key`` counts: with keys off the Ingress marks ``open`` (the caller is its
    address), and a credential is not an identity."""

    async def open_service(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(AUTH_HEADER.encode(), b"open")]})
        await send({"type": "http.response.body", "body": b"{}"})

    guard = FrontGuard(open_service, FrontGuardConfig(tarpit_s=0), clock=Clock())

    async def run():
        transport = httpx.ASGITransport(app=guard, client=("10.0.0.1", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.get("/v1/models", headers={"Authorization": "Bearer anything"})
        assert r.status_code == 200 and AUTH_HEADER not in r.headers and len(guard.clients.served) == 0

    asyncio.run(run())


def test_a_flood_of_unknown_credentials_never_evicts_a_served_key():
    """Unknown credentials churn their own table: a served key keeps its standing (before: pushed
    out by 16 made-up keys it paid the address's empty budget, 429 on every path)."""
    clock = Clock()
    guard = _guard(clock, max_clients=16, max_served_clients=16, address_refusal_burst=5)

    async def run():
        assert (await _get(guard, key=GOOD)).status_code == 200  # served
        got = [(await _get(guard, key=f"Bearer made-up-{i}")).status_code for i in range(200)]
        assert got.count(401) == 5 and got.count(429) == 195
        assert len(guard.clients.unknown) <= 16 and len(guard.clients.served) == 1
        assert await _statuses(guard, 5, key=GOOD) == [200] * 5  # its own bucket, not the address's
        # Served clients push out only served ones, least recently seen first.
        for i in range(20):
            guard.clients.mark_served(("10.2.0.1", f"k{i}"), guard.clients.get(("10.2.0.1", f"k{i}")))
        assert len(guard.clients.served) == 16

    asyncio.run(run())


def test_disabled_passes_everything_and_the_ray_hook_builds_it(monkeypatch):
    clock = Clock()
    guard = _guard(clock, enabled=False)
    assert asyncio.run(_statuses(guard, 10, key="Bearer wrong")) == [401] * 10
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)  # the hook sets it: restored after the test
    monkeypatch.delenv("RAY_SERVE_ENABLE_HA_PROXY", raising=False)
    monkeypatch.setenv("CHATTTS_FRONT_GUARD", json.dumps({"tarpit_s": 0.5, "refusal_burst": 7}))
    assert settings_from_env().refusal_burst == 7
    from deployments.proxy.flow_acks import FlowAcksMiddleware
    from serve_app.http.loop_watch import LoopWatchMiddleware

    # Ray wraps in list order, the last outermost: the proxy's loop watch, the client's end of
    # back-pressure, the guard, then the edge cache (its 408s and hits seen by the guard; the
    # Ingress's mark seen by it).
    edge_mw, guard_mw, flow_mw, watch_mw = middlewares()
    assert guard_mw.cls is FrontGuard and guard_mw.kwargs["settings"].tarpit_s == 0.5
    assert flow_mw.cls is FlowAcksMiddleware and watch_mw.cls is LoopWatchMiddleware
    monkeypatch.setenv("CHATTTS_FRONT_GUARD", '{"tarpit_s": -1}')
    with pytest.raises(ValueError):
        settings_from_env()
    assert (HOOK_ENV, IMPORT_PATH) == (
        "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH",
        "deployments.proxy.front_guard:middlewares",
    )


# ---------------------------------------------------------------- the HAProxy front door's client address

HAPROXY_CFG = """global
    maxconn 64
defaults
    mode http
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend prometheus
    bind 127.0.0.1:18081
    no log
frontend http_frontend
    bind 127.0.0.1:18082
    acl healthcheck path -i /-/healthz
    use_backend app if { path_beg / }
backend app
    server r1 127.0.0.1:9 check
"""


def test_the_front_door_config_drops_what_a_client_sent_and_sets_its_own_address(tmp_path, monkeypatch):
    """The wrapper's copy of Ray's config: the rules right after http_frontend's bind (and nowhere
    else), once; the bundled HAProxy accepts it (``-c``)."""
    import subprocess

    from deployments.proxy import front_door

    patched = front_door.patch_config(HAPROXY_CFG)
    lines = patched.splitlines()
    at = lines.index("    bind 127.0.0.1:18082", lines.index("frontend http_frontend"))
    assert [line.strip() for line in lines[at + 2 : at + 2 + len(front_door.RULES)]] == list(front_door.RULES)
    assert "set-header X-Forwarded-For %[src]" in lines[at + 5] and patched.count(front_door.MARK) == 1
    assert front_door.patch_config(patched) == patched  # a reload of an already patched file
    assert front_door.patch_config("frontend other\n    bind :1\n") == "frontend other\n    bind :1\n"
    source = tmp_path / "haproxy.cfg"
    source.write_text(HAPROXY_CFG)
    args = front_door.rewrite_args(["-db", "-f", str(source), "-sf", "123"])
    assert args[:2] == ["-db", "-f"] and args[3:] == ["-sf", "123"] and source.read_text() == HAPROXY_CFG
    assert Path(args[2]).read_text() == patched
    check = subprocess.run([front_door.real_binary(), "-c", "-f", args[2]], capture_output=True, text=True, timeout=30)
    assert check.returncode == 0, check.stdout + check.stderr
    # The installed wrapper: an executable Ray accepts as RAY_SERVE_HAPROXY_BINARY_PATH, that runs
    # the bundled binary on the patched copy.
    wrapper = front_door.install(tmp_path / "bin")
    assert os.access(wrapper, os.X_OK) and front_door.is_wrapper(str(wrapper))
    monkeypatch.setenv("RAY_SERVE_HAPROXY_BINARY_PATH", str(wrapper))  # as Ray's processes have it
    assert not front_door.is_wrapper(front_door.real_binary())  # never itself
    assert os.environ["RAY_SERVE_HAPROXY_BINARY_PATH"] == str(wrapper)
    check = subprocess.run([str(wrapper), "-c", "-f", str(source)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_forwarded_for_is_believed_only_from_the_front_door(tmp_path, monkeypatch):
    """uvicorn's trust, pinned by the hook before Ray builds the server: the setting, or no one
    behind an HAProxy the wrapper does not run (before: 127.0.0.1, where HAProxy connects from)."""
    from deployments.proxy import front_door

    wrapper = front_door.install(tmp_path)
    env: dict[str, str] = {}
    assert front_door.pin_forwarded_allow_ips("127.0.0.1,::1", env) == "127.0.0.1,::1"  # Serve's proxy
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1"}
    assert front_door.pin_forwarded_allow_ips("127.0.0.1,::1", env) == "" and env["FORWARDED_ALLOW_IPS"] == ""
    env["RAY_SERVE_HAPROXY_BINARY_PATH"] = str(wrapper)
    assert front_door.pin_forwarded_allow_ips("127.0.0.1,::1,10.0.0.0/8", env) == "127.0.0.1,::1,10.0.0.0/8"
    # The hook does it in the process it runs in.
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    monkeypatch.delenv("RAY_SERVE_HAPROXY_BINARY_PATH", raising=False)
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    middlewares()
    assert os.environ["FORWARDED_ALLOW_IPS"] == ""
    # And uvicorn, so pinned, names the peer whatever the header says.
    from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

    seen = []

    async def app(scope, receive, send):
        seen.append(scope["client"][0])

    asyncio.run(
        ProxyHeadersMiddleware(app, trusted_hosts="")(
            {"type": "http", "client": ("127.0.0.1", 1), "headers": [(b"x-forwarded-for", b"6.6.6.6")]}, None, None
        )
    )
    assert seen == ["127.0.0.1"]
