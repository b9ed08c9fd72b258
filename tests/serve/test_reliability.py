"""Overload, faults and bad input against the running app (real Serve, real HTTP, loopback only).

Runtime switches are flipped through the deployments' ``reconfigure`` (the same code path as a
``user_config`` change) and always put back, so the shared app is left as it was found.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from support.app import (
    acoustic_config,
    acoustic_stats,
    app_args,
    ingress_log_lines,
    ingress_settings,
    replica_actor_name,
    replica_pids,
    rss_mb,
    session_logs,
    wait_idle,
)
from support.engine import expected_samples
from support.http import is_error_body as _is_error_body
from support.http import is_error_head as _is_error_head
from support.http import speech_body as _speech
from support.report import report
from support.waiting import wait_until, wait_until_async

from serve_app.engine.planner import Planner
from serve_app.engine.types import SynthesisOptions

pytestmark = pytest.mark.timeout(600)

LONG_TEXT = "。".join(["今天天气很好，我们一起去公园散步吧"] * 12) + "。"  # 12 segments, ~45 s of audio
# Two segments (~5 s of audio): with one decode slot, one such request keeps a row waiting for seconds.
BUSY_TEXT = "今天天气很好，我们一起去公园散步吧。公园里有很多花。"


# --------------------------------------------------------------------------- back-pressure


async def test_overload_answers_fast_with_retry_after_and_admitted_requests_finish(app_url):
    """A full acoustic queue answers 503 + Retry-After at once; what was admitted completes."""
    with acoustic_config(max_rows=1, max_queued_rows=2):
        async with httpx.AsyncClient(base_url=app_url, timeout=120) as client:

            async def one(i: int):
                t0 = time.monotonic()
                r = await client.post("/v1/audio/speech", json=_speech(f"第{i}个请求，测试排队。"))
                return r, time.monotonic() - t0

            results = await asyncio.gather(*[one(i) for i in range(10)])
    ok = [r for r, _ in results if r.status_code == 200]
    busy = [(r, dt) for r, dt in results if r.status_code == 503]
    assert ok, [r.status_code for r, _ in results]
    assert busy, "no request was refused although the queue holds 2 rows"
    assert len(ok) + len(busy) == len(results), [r.status_code for r, _ in results]
    for r, dt in busy:
        assert r.headers.get("retry-after"), r.headers
        assert _is_error_body(r) and r.json()["error"]["code"] == "overloaded"
        assert dt < 5.0, f"refusal took {dt:.1f}s"
    for r in ok:
        assert r.content[:4] == b"RIFF" and len(r.content) > 44


async def test_busy_switch_answers_429(app_url):
    """With ``busy_queue_rows`` set, a request is refused with 429 "busy" while the decode queue is
    that long, and the requests already admitted finish (or were refused the same way)."""
    with ingress_settings(busy_queue_rows=1), acoustic_config(max_rows=1):
        async with httpx.AsyncClient(base_url=app_url, timeout=120) as client:

            async def refused_as_busy() -> bool:
                # Nothing to speak: 429 while the ingress counts the queue as busy (it polls the
                # queue's length), else the planner's 400 at once: no synthesis either way.
                r = await client.post("/v1/audio/speech", json=_speech("。。。!!!"))
                assert r.status_code in (400, 429), r.text
                return r.status_code == 429

            await wait_until_async(
                refused_as_busy, 30, until=lambda busy: not busy, what="the ingress seeing an idle queue"
            )
            first = [asyncio.create_task(client.post("/v1/audio/speech", json=_speech(BUSY_TEXT))) for _ in range(3)]
            await wait_until_async(refused_as_busy, 60, what="the ingress seeing the queue fill")
            probe = await client.post("/v1/audio/speech", json=_speech("忙吗？"))
            done = await asyncio.gather(*first)
    assert probe.status_code == 429, probe.text
    assert probe.headers.get("retry-after") and probe.json()["error"]["code"] == "busy"
    assert all(r.status_code in (200, 429) for r in done)


def test_request_timeout_ends_a_request(app_url):
    with ingress_settings(request_timeout_s=0.3):
        r = httpx.post(app_url + "/v1/audio/speech", json=_speech(LONG_TEXT), timeout=60)
    # Either no audio came in time (504) or the stream was cut at the deadline (short body).
    if r.status_code == 504:
        assert _is_error_body(r) and r.json()["error"]["code"] == "timeout"
    else:  # shorter than the whole answer (random weights: its length is known, see support.engine)
        assert r.status_code == 200
        assert len(r.content) < 44 + 2 * expected_samples(
            Planner(app_args().segments).plan(LONG_TEXT, SynthesisOptions())
        )


# --------------------------------------------------------------------------- cancellation


def _disconnect_after_first_chunk(url: str, text: str) -> None:
    with httpx.Client(timeout=60) as client:
        with client.stream("POST", url + "/v1/audio/speech", json=_speech(text)) as r:
            assert r.status_code == 200
            chunks = r.iter_raw()
            next(chunks)
    # leaving the block closes the connection mid-stream


def _timed_request(url: str) -> float:
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/audio/speech", json=_speech("你好，这是一个计时请求。"), timeout=120)
    assert r.status_code == 200
    return time.monotonic() - t0


def test_fifty_disconnects_free_their_work(app_url):
    pids = replica_pids()
    before_s = min(_timed_request(app_url) for _ in range(3))
    rss0 = rss_mb(pids)
    cancelled0 = acoustic_stats()["rows_cancelled"]
    with ThreadPoolExecutor(5) as pool:  # five clients at a time, each leaving after its first chunk
        list(pool.map(lambda _: _disconnect_after_first_chunk(app_url, LONG_TEXT), range(50)))
    s = wait_idle(30)
    assert s["rows_cancelled"] - cancelled0 >= 50  # every disconnect freed its rows
    after_s = min(_timed_request(app_url) for _ in range(3))
    rss1 = rss_mb(pids)
    growth = {k: (rss1[k] - rss0[k]) / rss0[k] for k in rss0}
    report("50 disconnects: request time before/after", f"{before_s:.2f} s / {after_s:.2f} s")
    report("50 disconnects: RSS growth per replica", ", ".join(f"{k} {100 * g:+.1f}%" for k, g in growth.items()))
    # A request's cancelled calls must not wedge the stream-slot counter (the replica would then
    # wait out every call to it before counting alone: ~2 s on every request).
    assert not ingress_log_lines("slot counter unreachable")
    assert after_s < before_s * 1.5 + 0.2
    assert all(g < 0.05 for g in growth.values()), growth


# --------------------------------------------------------------------------- bad input


RAW_CASES = [
    ("non-UTF-8 bytes", b'{"input": "\xff\xfe\xfa"}', "application/json", 400),
    ("deeply nested JSON", b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}", "application/json", 400),
    ("wrong content type", b"input=hello", "application/x-www-form-urlencoded", 400),
    ("JSON array body", b'["hello"]', "application/json", 400),
    ("empty body", b"", "application/json", 400),
]


@pytest.mark.parametrize("name,body,ctype,status", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_raw_bad_bodies(app_url, name, body, ctype, status):
    r = httpx.post(app_url + "/v1/audio/speech", content=body, headers={"content-type": ctype}, timeout=30)
    assert r.status_code == status, (name, r.status_code, r.text[:300])
    assert _is_error_body(r), r.text[:300]


TEXT_CASES = [
    ("only punctuation", "。，！？...!!!", 400),
    ("only tags", "[uv_break][laugh_0][break_6]", 400),
    ("control characters", "你好\x01\x02\x1b[31m世界\u200b\u202e", 200),
    ("emoji and mixed scripts", "Hello 👋🏽 你好 Привет مرحبا 123 ½ ∑", 200),
    ("one very long word", "a" * 300, 200),  # no break point: cut every max_chars (120), 3 rows
    ("internal tokens are not injected", "[spk_emb][Stts]你好[Ptts][empty_spk]", 200),
]


@pytest.mark.parametrize("name,text,status", TEXT_CASES, ids=[c[0] for c in TEXT_CASES])
def test_awkward_text(app_url, name, text, status):
    r = httpx.post(app_url + "/v1/audio/speech", json=_speech(text), timeout=180)
    assert r.status_code == status, (name, r.text[:300])
    if status == 200:
        assert r.content[:4] == b"RIFF" and len(r.content) > 44
    else:
        assert _is_error_body(r)


def test_huge_declared_body_is_refused_without_reading_it(app_url):
    """413 comes back although the client never sends the (100 MB) body it announced."""
    import socket
    from urllib.parse import urlparse

    u = urlparse(app_url)
    with socket.create_connection((u.hostname, u.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 100000000\r\n\r\n{"input": "'
        )
        data = b""
        while b'"error"' not in data:  # headers and body may come in separate packets
            part = sock.recv(65536)
            if not part:
                break
            data += part
    assert data.startswith(b"HTTP/1.1 413"), data[:200]
    assert b'"error"' in data


def test_prompt_only_accepts_control_tags(app_url):
    r = httpx.post(app_url + "/v1/audio/speech", json=_speech("你好", prompt="[spk_emb]"), timeout=30)
    assert r.status_code == 400 and _is_error_body(r)
    ok = httpx.post(
        app_url + "/v1/audio/speech", json=_speech("你好", prompt="[oral_2][laugh_0][break_6]"), timeout=120
    )
    assert ok.status_code == 200


# --------------------------------------------------------------------------- fuzzing

schemathesis = pytest.importorskip("schemathesis")
FUZZ_CASES = int(os.environ.get("CHATTTS_FUZZ_CASES", "40"))


def test_fuzz_openapi_schema(app_url):
    """Schemathesis-generated requests (valid and invalid) against every operation, the voices
    API's included (JSON and multipart bodies, ids, names, speaker strings, seeds): never a 5xx,
    never a hang, every error body OpenAI-shaped."""
    from hypothesis import HealthCheck, settings

    schema = schemathesis.openapi.from_url(app_url + "/openapi.json")
    seen = {"cases": 0}
    per_operation: dict[str, int] = {}
    failures: list[str] = []

    @settings(max_examples=FUZZ_CASES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    def check(case):
        seen["cases"] += 1
        name = f"{case.method} {case.operation.path}"
        per_operation[name] = per_operation.get(name, 0) + 1
        if case.body is not None and isinstance(case.body, dict) and isinstance(case.body.get("input"), str):
            case.body["input"] = case.body["input"][:200]  # keep generated audio short
        r = case.call(timeout=120)
        if r.status_code >= 500:
            failures.append(f"{case.method} {case.path} -> {r.status_code}: {r.text[:200]}")
        elif r.status_code >= 400 and not (_is_error_body(r) if case.method != "HEAD" else _is_error_head(r)):
            failures.append(f"{case.method} {case.path} -> {r.status_code} malformed error body: {r.text[:200]}")

    for op in schema.get_all_operations():
        op.ok().as_strategy  # noqa: B018 - raise early if the schema cannot be parsed
        strategy = op.ok().as_strategy()

        from hypothesis import given

        given(strategy)(check)()
    # Jobs the fuzzer made would go on speaking beside the later tests: cancel them all.
    for job in httpx.get(app_url + "/v1/audio/jobs", timeout=30).json().get("data", []):
        httpx.delete(app_url + f"/v1/audio/jobs/{job['id']}", timeout=30)
    # And lexicons (a default one would apply to every later request without a key).
    for lexicon in httpx.get(app_url + "/v1/audio/lexicons", timeout=30).json().get("data", []):
        httpx.delete(app_url + f"/v1/audio/lexicons/{lexicon['id']}", timeout=30)
    report(
        "fuzz: schemathesis cases",
        f"{seen['cases']} ({', '.join(f'{k}: {v}' for k, v in sorted(per_operation.items()))})",
    )
    assert not failures, failures[:10]
    voices = [op for op in per_operation if "/v1/audio/voices" in op]
    assert {
        "POST /v1/audio/voices",
        "GET /v1/audio/voices",
        "GET /v1/audio/voices/{voice_id}",
        "DELETE /v1/audio/voices/{voice_id}",
    } <= set(voices), per_operation


# --------------------------------------------------------------------------- security and logs


def test_api_keys(app_url, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("# team keys\nsk-test-one\nsk-test-two\n")
    security = {"api_keys_env": None, "api_keys_file": str(keys), "max_streams_per_key": 0, "cors_origins": []}
    with ingress_settings(security=security):
        url = app_url + "/v1/audio/speech"
        none = httpx.post(url, json=_speech("你好"), timeout=30)
        wrong = httpx.post(url, json=_speech("你好"), headers={"Authorization": "Bearer sk-nope"}, timeout=30)
        good = httpx.post(url, json=_speech("你好"), headers={"Authorization": "Bearer sk-test-two"}, timeout=120)
        models = httpx.get(app_url + "/v1/models", timeout=30)
        health = httpx.get(app_url + "/healthz", timeout=30)
    for r in (none, wrong, models):
        assert r.status_code == 401 and _is_error_body(r) and r.json()["error"]["code"] == "invalid_api_key"
    assert good.status_code == 200 and good.content[:4] == b"RIFF"
    assert health.status_code == 200  # probes need no key
    assert httpx.get(app_url + "/v1/models", timeout=30).status_code == 200  # keys off again


def test_streams_per_key_limit(app_url):
    security = {"api_keys_env": None, "api_keys_file": None, "max_streams_per_key": 1, "cors_origins": []}
    with ingress_settings(security=security), httpx.Client(timeout=120) as client:
        with client.stream("POST", app_url + "/v1/audio/speech", json=_speech(LONG_TEXT)) as first:
            assert first.status_code == 200
            chunks = first.iter_raw()  # keep the iterator: dropping it closes the connection
            next(chunks)
            second = httpx.post(app_url + "/v1/audio/speech", json=_speech("你好"), timeout=30)
        assert second.status_code == 429 and second.headers.get("retry-after")
        assert second.json()["error"]["code"] == "too_many_streams"


def test_cors_off_by_default_and_configurable(app_url):
    pre = {"Origin": "https://app.example", "Access-Control-Request-Method": "POST"}
    off = httpx.options(app_url + "/v1/audio/speech", headers=pre, timeout=30)
    assert "access-control-allow-origin" not in off.headers
    security = {
        "api_keys_env": None,
        "api_keys_file": None,
        "max_streams_per_key": 0,
        "cors_origins": ["https://app.example"],
    }
    with ingress_settings(security=security):
        on = httpx.options(app_url + "/v1/audio/speech", headers=pre, timeout=30)
    assert on.headers.get("access-control-allow-origin") == "https://app.example"


def test_one_json_log_line_per_request_without_text(app_url, ray_session):
    secret = f"私密文本{uuid.uuid4().hex[:6]}"
    r = httpx.post(
        app_url + "/v1/audio/speech",
        json=_speech(secret),
        headers={"X-Request-Id": "log-test-" + uuid.uuid4().hex[:8]},
        timeout=120,
    )
    assert r.status_code == 200
    rid = r.headers["x-request-id"]

    def speech_lines() -> list[dict]:
        return [json.loads(line[line.index("{") :]) for line in ingress_log_lines(rid) if '"event": "speech"' in line]

    lines = wait_until(speech_lines, 20, 0.5, what=f"the speech log line of {rid}")
    assert len(lines) == 1, lines
    rec = lines[0]
    for k in ("request_id", "voice", "chars", "format", "caller", "status", "ttfb_s", "total_s", "batch_rows"):
        assert k in rec
    assert rec["status"] == "200" and rec["chars"] == len(secret) and rec["caller"].startswith("ip:")
    text_hits = [f for f in session_logs().rglob("*") if f.is_file() and secret in f.read_text(errors="replace")]
    assert not text_hits, text_hits


# --------------------------------------------------------------------------- faults (last: it restarts replicas)


@pytest.mark.parametrize("stage", ["Acoustic", "Vocoder"])
async def test_killed_replica_fails_only_its_requests_and_is_replaced(app_url, stage):
    import ray

    pids_before = replica_pids()
    async with httpx.AsyncClient(base_url=app_url, timeout=httpx.Timeout(120, read=60)) as client:
        streaming = [asyncio.Event() for _ in range(3)]

        async def stream_one(i: int):
            try:
                async with client.stream("POST", "/v1/audio/speech", json=_speech(LONG_TEXT + str(i))) as r:
                    streaming[i].set()  # the ingress answers with its first audio chunk: mid-stream now
                    body = b"".join([b async for b in r.aiter_bytes()])
                    return r.status_code, len(body), None
            except httpx.HTTPError as exc:  # a cut stream is a clean failure, a hang is not
                return None, 0, exc.__class__.__name__
            finally:
                streaming[i].set()

        tasks = [asyncio.create_task(stream_one(i)) for i in range(3)]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in streaming)), timeout=120)
        t_kill = time.monotonic()
        actor = ray.get_actor(replica_actor_name(stage), namespace="serve")
        ray.kill(actor, no_restart=True)
        results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=120)  # none may hang
    # In-flight requests on the killed replica fail cleanly (5xx body or a cut stream).
    for status, _n, err in results:
        assert err is not None or status is not None

    def answers_with_audio() -> bool:
        try:
            r = httpx.post(app_url + "/v1/audio/speech", json=_speech("恢复了吗？"), timeout=60)
        except httpx.HTTPError:
            return False
        return r.status_code == 200 and r.content[:4] == b"RIFF"

    wait_until(answers_with_audio, 180, 0.25, what=f"a good response after the {stage} replica was killed")
    recovered = time.monotonic() - t_kill
    assert replica_pids().get(stage) != pids_before.get(stage)
    report(f"fault: {stage} replica killed -> first good response", f"{recovered:.1f} s")
