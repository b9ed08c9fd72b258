"""``serve run config/serve.yaml`` as a user runs it: a subprocess with its own local Ray
(``support.serve_run.ServeRun``), through Serve's proxy and through the HAProxy front door."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
import websockets
from support.audio import read_wav
from support.configs import chattts_app, load
from support.engine import expected_samples
from support.report import report
from support.serve_run import ServeRun

from bench.lib.procs import free_port
from serve_app.engine.wav import with_true_length
from serve_app.settings import HOOK_ENV, IMPORT_PATH, FrontGuardConfig

pytestmark = [pytest.mark.serve, pytest.mark.own_ray]  # its own `serve run`: after the session's Ray

README_BODY = {"model": "chattts", "input": "你好", "voice": "alloy", "response_format": "wav"}


def _expected_samples(config: dict, text: str) -> int:
    from serve_app.engine.config import SegmentConfig
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions

    limits = SegmentConfig.model_validate(chattts_app(config)["args"].get("segments", {}))
    return expected_samples(Planner(limits).plan(text, SynthesisOptions(voice="alloy")))


# HAProxy as docs/operations.md runs it. The Ingress replicas behind it hold open for Serve's
# direct-ingress drain (30 s by default: time for an outside load balancer to deregister them)
# before `serve run` can end; no balancer sits in front here, so 1 s (the docs say the same).
FRONT_DOORS = {
    "proxy": {},
    "haproxy": {
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_NBTHREAD": "1",
        "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "1",
    },
}
# The README's front guard, with its default settings.
GUARD_ENV = {HOOK_ENV: IMPORT_PATH}
GUARD_TARPIT_S = FrontGuardConfig().tarpit_s


@pytest.fixture(scope="module")
def serve_runs(chattts_cache_dir, tmp_path_factory):
    """``serve run`` of config/serve.yaml (port moved, loopback only) through each front door, both
    started at once: each starts its own Ray, and their start-ups and shutdowns (the HAProxy
    one waits 30 s for Serve's controller) overlap. The tests Ctrl-C each one; any left are
    stopped here."""
    runs = {}
    for name, env in FRONT_DOORS.items():
        config = load("cpu")
        config["http_options"].update(host="127.0.0.1", port=free_port())
        runs[name] = ServeRun(
            config, tmp_path_factory.mktemp(f"serve-run-{name}"), chattts_cache_dir, {**env, **GUARD_ENV}
        ).start()
    yield runs
    for run in runs.values():
        run.stop()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("front_door", FRONT_DOORS)
def test_front_guard_holds_a_refused_flood_while_another_client_is_served(serve_runs, front_door):
    """The README's front guard in the front door's process: 60 bad requests at once from one
    client (its own Authorization header; the loopback config ignores keys) reach the service
    only as far as its burst (400 each), the rest and its WebSocket handshake are held for the
    tarpit and answered 429 ``too_many_refusals`` by the guard; meanwhile another client's speech
    request is served before any of them is answered."""
    run = serve_runs[front_door].wait_ready()
    burst = FrontGuardConfig().refusal_burst
    flood = {"Authorization": "Bearer flood-client"}
    bad = {"model": "chattts", "input": "", "voice": "alloy"}

    async def attack():
        spent = asyncio.Event()  # the burst answered: the client's budget is gone
        answered_400 = 0

        async with httpx.AsyncClient(base_url=run.url, timeout=60, limits=httpx.Limits(max_connections=100)) as client:

            async def one():
                nonlocal answered_400
                r = await client.post("/v1/audio/speech", json=bad, headers=flood)
                if r.status_code == 400:
                    answered_400 += 1
                    if answered_400 >= burst:
                        spent.set()
                return r.status_code, r.json()["error"]["code"], time.perf_counter()

            async def handshake():
                await asyncio.wait_for(spent.wait(), 30)  # on a slow box the burst takes more than a second
                try:
                    async with websockets.connect(
                        run.url.replace("http", "ws") + "/v1/audio/speech/stream",
                        additional_headers=flood,
                        open_timeout=30,
                    ):
                        return None
                except websockets.InvalidStatus as exc:
                    return exc.response.status_code

            async def polite():
                await asyncio.sleep(1.0)  # the flood's burst is answered, the rest is held
                r = await client.post("/v1/audio/speech", json={**README_BODY, "seed": 77})
                return r.status_code, time.perf_counter()

            t0 = time.perf_counter()
            return t0, await asyncio.gather(asyncio.gather(*(one() for _ in range(60))), polite(), handshake())

    t0, (answers, (polite_status, polite_at), ws_status) = asyncio.run(attack())
    got = sorted((status, code) for status, code, _ in answers)
    assert got == [(400, "invalid_value")] * burst + [(429, "too_many_refusals")] * (60 - burst), got
    held = [at - t0 for status, _, at in answers if status == 429]
    assert min(held) >= GUARD_TARPIT_S - 0.1, f"answered before the tarpit ended: {min(held):.2f} s"
    assert polite_status == 200 and polite_at - t0 < min(held), (polite_at - t0, min(held))
    assert ws_status in (403, 429), ws_status  # a refused handshake (429 where the server can say so)
    report(
        f"front guard ({front_door}): 60 bad requests at once",
        f"{burst} reached the service, {60 - burst} held "
        f"{min(held):.1f}-{max(held):.1f} s and answered 429; another client served in {polite_at - t0 - 1.0:.2f} s meanwhile",
    )


@pytest.mark.timeout(420)
def test_a_client_cannot_pick_its_address_through_the_haproxy_front_door(serve_runs):
    """The README's HAProxy command: X-Forwarded-For reaches the replicas' own HTTP servers from
    HAProxy on 127.0.0.1, which uvicorn believed by default, so each request could name a new
    address and buy a fresh budget. The hook pins that trust to no one behind an HAProxy it does
    not wrap: 60 bad requests at once, each naming its own address, reach the service only as far
    as one client's burst (before: all 60)."""
    run = serve_runs["haproxy"].wait_ready()
    burst = FrontGuardConfig().refusal_burst
    bad = {"model": "chattts", "input": "", "voice": "alloy"}

    async def attack():
        async with httpx.AsyncClient(base_url=run.url, timeout=60, limits=httpx.Limits(max_connections=100)) as client:

            async def one(i):
                r = await client.post(
                    "/v1/audio/speech",
                    json=bad,
                    headers={"Authorization": "Bearer xff-client", "X-Forwarded-For": f"203.0.113.{i}"},
                )
                return r.status_code

            return await asyncio.gather(*(one(i) for i in range(60)))

    statuses = asyncio.run(attack())
    assert statuses.count(400) <= burst and statuses.count(429) == 60 - statuses.count(400), statuses
    report(
        "front guard (haproxy): 60 bad requests naming 60 addresses",
        f"{statuses.count(400)} reached the service (one client's burst: {burst}; before: 60), {statuses.count(429)} answered 429",
    )


@pytest.mark.timeout(420)
@pytest.mark.parametrize("front_door", FRONT_DOORS)
def test_serve_run_default_config(serve_runs, front_door):
    """``serve run`` of config/serve.yaml serves the README's curl request. It starts its own local
    Ray: no RAY_ADDRESS, its own RAY_TMPDIR, so it can never attach to the session's cluster
    (``ray.init()`` without an address only joins a cluster started by ``ray start``).
    ``haproxy``: the fast front door of docs/operations.md (Ray's bundled HAProxy in front of the
    Ingress replicas' own HTTP servers) streams and answers cache hits too. Then Ctrl-C."""
    run = serve_runs[front_door].wait_ready()
    url = run.url
    report(
        f"`serve run config/serve.yaml` ({front_door}) start-up to /readyz 200",
        f"{run.startup_s:.1f} s (own Ray, random-tiny weights, beside the other front door's)",
    )
    t1 = time.perf_counter()
    r = httpx.post(url + "/v1/audio/speech", json=README_BODY, timeout=120)
    first_request_s = time.perf_counter() - t1
    assert r.status_code == 200, r.text[:500]
    assert r.headers["content-type"] == "audio/wav"
    assert r.headers.get("x-weights") == "random"
    pcm = read_wav(r.content)
    # Random weights: exactly the planned tokens (512 samples each, less half a token).
    assert len(pcm) == _expected_samples(load("cpu"), README_BODY["input"]), f"{len(pcm)} samples"
    report(
        f"`serve run` ({front_door}): README curl request",
        f"{first_request_s:.2f} s, {len(pcm) / 24000:.2f} s of audio",
    )
    # Streamed in pieces, and a repeated seeded request is a cache hit, through this front door.
    body = {**README_BODY, "seed": 5}
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as resp:
        assert resp.status_code == 200 and resp.headers.get("x-cache") == "miss"
        pieces = [p for p in resp.iter_raw() if p]
    assert len(pieces) >= 2, len(pieces)
    hits: dict[str, list[float]] = {"ingress": [], "edge": []}
    with httpx.Client(base_url=url, timeout=30) as client:  # keep-alive, as a real client
        for _ in range(20):
            t2 = time.perf_counter()
            again = client.post("/v1/audio/speech", json=body)
            where = "edge" if again.headers.get("x-edge-cache") == "hit" else "ingress"
            hits[where].append(time.perf_counter() - t2)
            assert again.headers.get("x-cache") == "hit" and again.content == with_true_length(b"".join(pieces))
            assert "x-chattts-edge" not in again.headers
        # The edge cache (the README's hook) gives the Ingress's hit again from the front door's
        # process: every hit after the first; Cache-Control: no-cache still reaches the Ingress.
        fresh = client.post("/v1/audio/speech", json=body, headers={"Cache-Control": "no-cache"})
        assert fresh.headers.get("x-cache") == "miss" and "x-edge-cache" not in fresh.headers
    assert len(hits["ingress"]) == 1 and len(hits["edge"]) == 19, {k: len(v) for k, v in hits.items()}
    p50 = {k: 1000 * sorted(v)[len(v) // 2] for k, v in hits.items()}
    report(
        f"`serve run` ({front_door}): cache hit from the Ingress / from the edge cache",
        f"{p50['ingress']:.1f} / {p50['edge']:.1f} ms p50 ({len(again.content)} bytes)",
    )
    assert run.processes(), "no processes found for the serve run subprocess"
    run.stop_in_background()  # Ctrl-C: the next test checks how it ended


@pytest.mark.timeout(420)
@pytest.mark.parametrize("front_door", FRONT_DOORS)
def test_serve_run_ends_everything_it_started_on_ctrl_c(serve_runs, front_door):
    """After Ctrl-C ``serve run`` exits and leaves no process behind (found by the marker in
    their environment): nothing had to be killed."""
    run = serve_runs[front_door]
    run.stop()
    report(
        f"`serve run` ({front_door}) shutdown",
        f"{run.stop_s:.1f} s, exit code {run.returncode}; killed by the test: {run.killed or 'none'}",
    )
    assert not run.remaining, f"processes of the serve run subprocess survive SIGKILL: {run.remaining}"
    assert not run.killed, f"serve run left processes behind after Ctrl-C: {run.killed}"
