"""Back-pressure between the stages (pipeline/flow.py) in the session's Serve app: a client that
reads slowly, and a deliberately slowed Vocoder, make the stream's rows park in the decode loop
instead of every stage before them holding what they have not taken; others are served as
usual meanwhile; nothing of the slow stream is lost.
"""

from __future__ import annotations

import asyncio
import socket
import time

import httpx
import psutil
import pytest
from ray import serve
from support.app import APP_NAME, SERVE_APP_ARGS, wait_idle
from support.report import report
from support.waiting import wait_until_async

from bench.lib.corpus import expected_pcm_bytes

pytestmark = [pytest.mark.serve, pytest.mark.timeout(240)]

# ~600 s of speech (~28 MB of pcm): far more than a window of chunks and the sockets' buffers.
LONG_TEXT = "".join(f"第{i}段，今天的天气非常好，我们一起去公园散步，然后回家吃晚饭。" for i in range(1, 91))
POLITE_TEXT = "礼貌的请求。"


async def acoustic_stats() -> dict:
    return await serve.get_deployment_handle("Acoustic", app_name=APP_NAME).stats.remote()


async def _decode_stopped() -> dict | None:
    """The Acoustic counters once no decode step ran for 2 s (None before)."""
    first = await acoustic_stats()
    await asyncio.sleep(2.0)
    now = await acoustic_stats()
    return now if now["steps"] == first["steps"] else None


def _proxy_pid() -> int:
    for p in psutil.process_iter(["cmdline"]):
        if any("ProxyActor" in part for part in (p.info["cmdline"] or [])):
            return p.pid
    raise AssertionError("no Serve proxy process")


def _rss_mb(pids: list[int]) -> float:
    return sum(psutil.Process(pid).memory_info().rss for pid in pids) / 2**20


async def _ttfb(client: httpx.AsyncClient, url: str, text: str) -> float:
    t0 = time.perf_counter()
    async with client.stream(
        "POST",
        url + "/v1/audio/speech",
        json={"input": text, "response_format": "pcm"},
        headers={"Cache-Control": "no-store"},
    ) as r:
        assert r.status_code == 200
        took = None
        async for _ in r.aiter_raw():
            took = took or time.perf_counter() - t0
    return took


async def test_a_client_that_stops_reading_parks_its_rows_and_gets_everything_after(app_url):
    expected = expected_pcm_bytes((LONG_TEXT,), SERVE_APP_ARGS.get("segments"))[LONG_TEXT]
    await asyncio.to_thread(wait_idle)
    proxy = [_proxy_pid()]  # where a slow client's answer would pile up without back-pressure
    # A small receive buffer: the client's own socket holds little of what it does not read (the
    # server's send buffer still takes up to a few MiB: net.ipv4.tcp_wmem).
    transport = httpx.AsyncHTTPTransport(socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 32768)])
    async with httpx.AsyncClient(timeout=120, transport=transport) as client:
        alone = [await _ttfb(client, app_url, POLITE_TEXT) for _ in range(3)]
        before = await acoustic_stats()
        rss0 = _rss_mb(proxy)
        got = 0
        async with client.stream(
            "POST",
            app_url + "/v1/audio/speech",
            json={"input": LONG_TEXT, "response_format": "pcm"},
            headers={"Cache-Control": "no-store"},
        ) as r:
            assert r.status_code == 200
            chunks = r.aiter_raw()
            while got < 64 * 1024:
                got += len(await chunks.__anext__())
            # The client reads nothing now: the stages before it fill their windows (and the
            # sockets' buffers), then the decode of its request stops: its rows park or wait.
            t_pause = time.monotonic()
            paused = await wait_until_async(_decode_stopped, 60, 0.0, what="the slow reader's decode stopped")
            stopped_after = time.monotonic() - t_pause
            rss_paused = _rss_mb(proxy)
            beside = [await _ttfb(client, app_url, POLITE_TEXT) for _ in range(3)]
            async for data in chunks:  # and now everything, at full speed
                got += len(data)
        after = await acoustic_stats()
    decoded_while_paused = paused["row_steps"] - before["row_steps"]
    decoded_in_all = after["row_steps"] - before["row_steps"]
    report(
        "backpressure: slow reader, decode stopped after / row-steps decoded before it did",
        f"{stopped_after:.1f} s; {decoded_while_paused} of {decoded_in_all} row-steps ({paused['parked_rows']} rows parked, "
        f"{paused['waiting_rows']} waiting); proxy RSS +{rss_paused - rss0:.1f} MiB (answer {expected / 2**20:.1f} MiB)",
    )
    report(
        "backpressure: polite first audio alone / beside the parked stream",
        f"{sorted(alone)[1] * 1000:.0f} / {sorted(beside)[1] * 1000:.0f} ms",
    )
    assert got == expected  # nothing lost
    assert decoded_while_paused < 0.6 * decoded_in_all  # it stopped well before the request's end
    assert rss_paused - rss0 < 0.25 * expected / 2**20  # the proxy did not take the answer in
    assert after["rows_resumed"] > before["rows_resumed"]
    assert sorted(beside)[1] < max(3 * sorted(alone)[1], 0.5)


@pytest.fixture
def slow_vocoder(app_url):
    """A second app holding one Vocoder replica whose decode is slowed on purpose (every window
    sleeps), streaming from the session app's Acoustic stage over the other transport (Ray actor
    calls, items through the object store: ``args.flow.transport``), so both carry a parked stream."""
    from support.slow_vocoder import SlowVocoder

    name = "slow-vocoder"
    args = SERVE_APP_ARGS
    acoustic = serve.get_deployment_handle("Acoustic", app_name=APP_NAME)
    model = {**args["model"], "dtype": "float32"}
    app = SlowVocoder.options(ray_actor_options={"num_cpus": 0.1}).bind(
        acoustic,
        model=model,
        vocoder=args.get("vocoder", {}),
        flow={**args.get("flow", {}), "transport": "object_store"},
        delay_s=0.05,
    )
    serve.run(app, name=name, route_prefix=None, blocking=False)
    handle = serve.get_app_handle(name)
    try:
        yield handle
    finally:
        serve.delete(name)


async def test_a_slow_vocoder_parks_the_rows_it_cannot_keep_up_with(app_url, slow_vocoder):
    from serve_app.engine.types import SynthesisOptions

    normalizer = serve.get_deployment_handle("TextNormalizer", app_name=APP_NAME)
    text = LONG_TEXT[: len(LONG_TEXT) // 6]  # ~100 s of speech
    plan = await normalizer.plan.remote(text, SynthesisOptions(), None)
    expected = expected_pcm_bytes((text,), SERVE_APP_ARGS.get("segments"))[text]
    await asyncio.to_thread(wait_idle)
    async with httpx.AsyncClient(timeout=120) as client:
        alone = sorted([await _ttfb(client, app_url, POLITE_TEXT) for _ in range(3)])[1]
        before = await acoustic_stats()
        got = 0
        saw_parked = 0
        beside: list[float] = []
        gen = slow_vocoder.options(stream=True).stream.remote(plan, "pcm")
        async for item in gen:
            if isinstance(item, bytes):
                got += len(item)
            saw_parked = max(saw_parked, (await acoustic_stats())["parked_rows"])
            if saw_parked and len(beside) < 3:
                beside.append(await _ttfb(client, app_url, POLITE_TEXT))  # through the app's own Vocoder
    after = await acoustic_stats()
    polite = sorted(beside)[len(beside) // 2] if beside else None
    report(
        "backpressure: slowed Vocoder, rows parked / resumed; polite first audio alone / meanwhile",
        f"{after['rows_parked'] - before['rows_parked']} / {after['rows_resumed'] - before['rows_resumed']}; "
        f"{alone * 1000:.0f} / {(polite or 0) * 1000:.0f} ms",
    )
    assert got == expected  # nothing lost
    assert saw_parked >= 1 and after["rows_parked"] > before["rows_parked"]
    assert polite is not None and polite < max(3 * alone, 0.5)
