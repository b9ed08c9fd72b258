"""Admission by real-time capacity through Serve, with real streaming clients past it: an app whose
Vocoder is slowed on purpose (each window sleeps, so it keeps about two streams at 1x) in front of
the session app's TextNormalizer and Acoustic stages. Listeners who play pcm at 1x after half a
second: every stream answered 200 plays without a stall worth the name, every other client is
told 503 ``capacity_exhausted`` (OpenAI body, Retry-After) within a second or two of asking,
nothing else fails; the gate's rate and capacity are what the Vocoder reports."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from ray import serve
from support.app import APP_NAME, SERVE_APP_ARGS, wait_ready
from support.report import report

from serve_app.engine.playback import PlaybackClock
from serve_app.settings import AppConfig

pytestmark = [pytest.mark.serve, pytest.mark.timeout(300)]

NAME = "slowrt"
TEXTS = ["第一个问题的回答，请慢慢听。", "第二个回答也很长，请耐心听完。", "第三个回答，内容比较多。", "第四个回答。"]
SMOOTH_S = 0.25  # a stream whose listener heard no more silence than this is smooth
PCM_BYTES_PER_S = 48000


@pytest.fixture(scope="module")
def slow_app(app_url):
    """The slowed app at /slowrt: its own Ingress (no keys, no cache) and Vocoder."""
    from support.slow_vocoder import SlowVocoder

    from deployments.ingress import Ingress

    args = SERVE_APP_ARGS
    stage = lambda d: serve.get_deployment_handle(d, app_name=APP_NAME)  # noqa: E731
    vocoder = SlowVocoder.options(ray_actor_options={"num_cpus": 0.1}, max_ongoing_requests=16).bind(
        stage("Acoustic"),
        model={**args["model"], "dtype": "float32"},
        vocoder=args.get("vocoder", {}),
        flow=args.get("flow", {}),
        capacity_wait_s=0.75,
        delay_s=0.12,
    )
    config = AppConfig.model_validate(
        {"ingress": {"warmup": False}, "voices": {"backend": "memory"}, "cache": {"backend": "none"}}
    )
    ingress = Ingress.options(num_replicas=1, ray_actor_options={"num_cpus": 0.05}, max_ongoing_requests=32)
    app = ingress.bind(stage("TextNormalizer"), vocoder, stage("Acoustic"), config=config.model_dump())
    serve.run(app, name=NAME, route_prefix=f"/{NAME}", blocking=False)
    url = f"{app_url}/{NAME}"
    try:
        wait_ready(url)
        yield url
    finally:
        serve.delete(NAME)


async def listen(client: httpx.AsyncClient, url: str, text: str) -> dict:
    """One listener: the answer's status (and when it came), its error code, the silence heard
    playing its pcm at 1x from half a second after its first bytes."""
    t0 = time.monotonic()
    clock = PlaybackClock(0.5)
    async with client.stream("POST", url + "/v1/audio/speech", json={"input": text, "response_format": "pcm"}) as r:
        out = {"status": r.status_code, "answered_s": time.monotonic() - t0}
        if r.status_code != 200:
            body = (await r.aread()).decode()
            out.update(body=body, retry_after=r.headers.get("retry-after"))
            return out
        async for data in r.aiter_bytes():
            clock.deliver(len(data) / PCM_BYTES_PER_S)
    out.update(stall_s=clock.stall_s, audio_s=clock.delivered_s)
    return out


async def test_past_capacity_every_listener_plays_smoothly_or_is_told_at_once(slow_app, ray_session):
    async with httpx.AsyncClient(timeout=120) as client:
        first = await listen(client, slow_app, "你好，先让声码器量一下自己的速度。")  # the gate measures its rate
        assert first["status"] == 200
        await asyncio.sleep(1.5)  # its report loop reads the rate every second
        results = await asyncio.gather(*(listen(client, slow_app, t) for t in TEXTS))
    report("realtime capacity: listeners past it", results)
    served = [r for r in results if r["status"] == 200]
    refused = [r for r in results if r["status"] == 503]
    assert len(served) + len(refused) == len(TEXTS), results  # nothing else: no other 5xx, no 4xx
    assert served, results
    for r in refused:
        assert '"code":"capacity_exhausted"' in r["body"].replace(" ", "") and r["retry_after"], r
        assert r["answered_s"] < 2.5, r  # told before any work, within the wait and a round trip
    for r in served:
        assert r["stall_s"] <= SMOOTH_S, r
    assert refused, "four streams through a vocoder that keeps about two at 1x: some must be told"
    # Operators see each refusal: the Vocoder's counter (exported within its report loop's second
    # and the metrics agent's export period).
    deadline = time.monotonic() + 30
    while True:
        counted = sum(
            float(line.rsplit(" ", 1)[1])
            for line in httpx.get(ray_session["metrics_url"], timeout=10).text.splitlines()
            if line.startswith("ray_tts_capacity_refusals_total{") and 'stage="vocoder"' in line
        )
        if counted >= len(refused) or time.monotonic() > deadline:
            break
        await asyncio.sleep(1)
    assert counted >= len(refused), (counted, len(refused))
