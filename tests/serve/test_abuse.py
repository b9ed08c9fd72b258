"""Impolite clients against the served app, each as an attack with what it must get: a clear 4xx
(or WebSocket close code) for the attacker, a polite client with another key served meanwhile
within a bound of its unloaded latency, and no replica's memory jumping.

The session's app is switched live (its Ingress ``user_config``) to API keys with grants and
short deadlines for this module, and back afterwards.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import statistics
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import httpx
import pytest
import websockets
from support.app import (
    APP_NAME,
    acoustic_stats,
    ingress_log_lines,
    ingress_settings,
    lone_ingress,
    replica_pids,
    rss_mb,
    wait_idle,
    wait_ready,
)
from support.hostile import ima_adpcm_wav, speaker_bombs
from support.http import assert_openai_error
from support.report import report
from support.waiting import wait_until

from serve_app.http.security import key_id

POLITE, ATTACKER, ADMIN = "polite-key-of-the-tests", "attacker-key-of-the-tests", "admin-key-of-the-tests"
ATTACKER_STREAMS = 2
POLITE_TEXT = "你好，欢迎使用语音合成服务。"
LONG_TEXT = "语音合成服务需要在异常输入面前保持稳定。" * 12  # ~40 s of speech: a stream that lasts
BODY_TIMEOUT_S = 2.0
FIRST_MESSAGE_S = 1.5
RSS_JUMP_MB = 150  # a replica's peak during an attack over its level before


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(app_url, tmp_path_factory) -> Iterator[str]:
    """The app with three keys (the attacker may hold 2 streams, the admin may ask priority 5)
    and short deadlines, for this module only."""
    path = tmp_path_factory.mktemp("abuse") / "keys"
    path.write_text(f"{POLITE}\n{ATTACKER}\n{ADMIN}\n")
    security = {
        "api_keys_env": None,
        "api_keys_file": str(path),
        "max_streams_per_key": 8,
        "keys": {
            key_id(ATTACKER): {"max_streams": ATTACKER_STREAMS},
            key_id(ADMIN): {"max_priority": 5, "admin": True},
        },
    }
    websocket = {
        "first_message_s": FIRST_MESSAGE_S,
        "idle_s": 3.0,
        "max_unstarted_per_client": 4,
        "max_pending_cuts": 4,
    }
    with ingress_settings(security=security, body_timeout_s=BODY_TIMEOUT_S, websocket=websocket):
        yield app_url


def _polite_ttfb(url: str, seed: int) -> float:
    body = {"input": POLITE_TEXT, "voice": "nova", "seed": seed, "response_format": "pcm"}
    headers = {**_auth(POLITE), "Cache-Control": "no-store"}
    t0 = time.perf_counter()
    ttfb = None
    with httpx.stream("POST", url + "/v1/audio/speech", json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()[:300]
        for chunk in r.iter_raw():
            if chunk and ttfb is None:
                ttfb = time.perf_counter() - t0
    assert ttfb is not None, "no audio"
    return ttfb


@pytest.fixture(scope="module")
def polite(keyed) -> "Polite":
    return Polite(keyed)


class Polite:
    """The polite client: its first-audio time alone, then checks against it during attacks."""

    def __init__(self, url: str):
        self.url = url
        self.seed = random.randrange(10**6)
        _polite_ttfb(url, self.next_seed())  # first-request costs
        self.alone = statistics.median(_polite_ttfb(url, self.next_seed()) for _ in range(3))
        report("abuse: polite first audio alone", f"{1000 * self.alone:.0f} ms")

    def next_seed(self) -> int:
        self.seed += 1
        return self.seed

    def bound(self) -> float:
        # Generous for a busy 2-core CI box: the engine's own fairness is measured by the bench.
        return max(4 * self.alone, self.alone + 3.0)

    def served(self, what: str) -> float:
        ttfb = _polite_ttfb(self.url, self.next_seed())
        report(f"abuse: polite first audio during {what}", f"{1000 * ttfb:.0f} ms (alone {1000 * self.alone:.0f} ms)")
        assert ttfb <= self.bound(), f"polite client took {ttfb:.2f} s during {what} (alone {self.alone:.2f} s)"
        return ttfb

    async def aserved(self, what: str) -> float:
        return await asyncio.to_thread(self.served, what)


@contextmanager
def memory_held(what: str) -> Iterator[None]:
    """No replica's RSS rises more than ``RSS_JUMP_MB`` over its level before (sampled every 50 ms)."""
    pids = replica_pids()
    before = rss_mb(pids)
    peak = dict(before)
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.05):
            try:
                for k, v in rss_mb(pids).items():
                    peak[k] = max(peak[k], v)
            except Exception:  # noqa: BLE001 - a replica restarting is caught by the tests' other checks
                pass

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()
    jumps = {k: round(peak[k] - before[k]) for k in before}
    report(f"abuse: RSS rise during {what} (MB)", json.dumps(jumps))
    assert all(j < RSS_JUMP_MB for j in jumps.values()), jumps


# ---------------------------------------------------------------------------------------- HTTP


def _raw_request(port: int, head: str) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(head.encode())
    return s


def _status(s: socket.socket, timeout: float) -> tuple[int, float]:
    s.settimeout(timeout)
    t0 = time.perf_counter()
    data = b""
    while b"\r\n" not in data:
        piece = s.recv(4096)
        if not piece:
            break
        data += piece
    return int(data.split()[1]), time.perf_counter() - t0


def test_the_key_is_checked_before_the_body_and_a_slow_body_gets_408(keyed, polite):
    port = int(keyed.rsplit(":", 1)[1])
    head = "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n{auth}\r\n"
    with memory_held("slow bodies"):
        # Without a key: refused from the headers, while the body is still unsent.
        s = _raw_request(port, head.format(auth=""))
        status, took = _status(s, 10)
        assert status == 401 and took < 2, (status, took)
        s.close()
        # With a key, a body that never comes: 408 at the deadline, whatever the proxy would allow.
        sockets = [
            _raw_request(port, head.format(auth=f"Authorization: Bearer {ATTACKER}\r\n") + '{"input": "')
            for _ in range(20)
        ]
        polite.served("20 slow bodies")
        for s in sockets:
            status, took = _status(s, BODY_TIMEOUT_S + 20)
            assert status == 408, status
            s.close()


def test_costly_requests_are_refused_before_the_work(keyed, polite):
    auth = _auth(ATTACKER)
    t0 = time.perf_counter()
    slow = httpx.post(keyed + "/v1/audio/speech", json={"input": "语" * 4096, "speed": 0.25}, headers=auth, timeout=60)
    err = assert_openai_error(slow, 413, "request_too_large")
    assert "max_request_seconds" in err["message"] or "seconds" in err["message"], err
    assert time.perf_counter() - t0 < 10
    high = httpx.post(keyed + "/v1/audio/speech", json={"input": "你好", "priority": 10}, headers=auth, timeout=60)
    assert assert_openai_error(high, 403, "priority_not_allowed")["param"] == "priority"
    admin = httpx.post(
        keyed + "/v1/audio/speech",
        json={"input": "你好", "priority": 5, "response_format": "pcm"},
        headers=_auth(ADMIN),
        timeout=60,
    )
    assert admin.status_code == 200  # a key granted priority 5 may ask for it
    # 4096 digits: the number rules read them digit by digit in linear time (an answer, not a hang).
    t0 = time.perf_counter()
    digits = httpx.post(keyed + "/v1/audio/speech", json={"input": "1" * 4096 + "美元"}, headers=auth, timeout=60)
    assert digits.status_code in (200, 413) and time.perf_counter() - t0 < 30, digits.status_code
    polite.served("costly requests")


def test_one_keys_answers_never_answer_another_key(keyed, polite):
    """The response cache is each key's own: an SSML-looking input sent by one key as plain text
    is not another key's SSML answer, and a hit never tells one key what another asked for."""
    ssml = "<speak>缓存<break time='300ms'/>隔离测试</speak>"
    body = {"input": ssml, "response_format": "pcm", "seed": 4242}
    first = httpx.post(
        keyed + "/v1/audio/speech", json={**body, "input_format": "text"}, headers=_auth(ATTACKER), timeout=60
    )
    again = httpx.post(
        keyed + "/v1/audio/speech", json={**body, "input_format": "text"}, headers=_auth(ATTACKER), timeout=60
    )
    assert (first.status_code, first.headers["x-cache"], again.headers["x-cache"]) == (200, "miss", "hit")
    # The same text by another key: its own miss (before: a hit with the attacker's audio).
    polite_text = httpx.post(
        keyed + "/v1/audio/speech", json={**body, "input_format": "text"}, headers=_auth(POLITE), timeout=60
    )
    assert polite_text.status_code == 200 and polite_text.headers["x-cache"] == "miss"
    as_ssml = httpx.post(keyed + "/v1/audio/speech", json=body, headers=_auth(POLITE), timeout=60)
    assert as_ssml.status_code == 200 and as_ssml.headers["x-cache"] == "miss"
    assert as_ssml.content != first.content  # the markup spoken as SSML, not read aloud
    polite.served("cache probes")


async def test_streams_past_a_keys_limit_are_429_and_slots_never_leak(keyed, polite):
    auth = {**_auth(ATTACKER), "Cache-Control": "no-store"}
    body = {"input": LONG_TEXT, "response_format": "pcm"}
    async with httpx.AsyncClient(base_url=keyed, timeout=120) as client:
        # Clients that leave before their first audio (or right after it), many times over.
        for i in range(12):
            req = client.build_request("POST", "/v1/audio/speech", json={**body, "seed": i}, headers=auth)
            resp = await client.send(req, stream=True)
            if i % 2:
                await resp.aiter_raw().__anext__()
            await resp.aclose()
        # A WebSocket session holds a slot too, and gives it back whatever the Ingress's settings
        # did meanwhile (a live change replaces what the replica holds, not the slots).
        async with websockets.connect(_ws(keyed), additional_headers=_auth(ATTACKER)) as ws:
            await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
            assert json.loads(await ws.recv())["type"] == "session.created"
            with ingress_settings(max_input_chars=4000):
                pass
        await asyncio.to_thread(wait_idle, 30)
        # ...leave no slot behind: the application's counter is back to none (each slot goes back
        # as its stream notices its client has gone), the key's two streams open, a third is refused.
        await asyncio.to_thread(
            lambda: wait_until(
                lambda: _held(key_id(ATTACKER)),
                15,
                0.1,
                until=lambda n: n == 0,
                what="the attacker's stream slots back",
            )
        )
        # The key's two streams at once. Each holds its slot from the Ingress's admission, before
        # its first audio: with other clients about, the engine runs two rows of one client at a
        # time (max_running_rows_per_client) and the first stream's segments take both, so the
        # second's first audio comes as the first ends (its ~40 s of pcm fit in the sockets'
        # buffers unread: seconds). So the third is asked as soon as both are held.
        opening = [
            asyncio.create_task(
                client.send(
                    client.build_request("POST", "/v1/audio/speech", json={**body, "seed": 100 + i}, headers=auth),
                    stream=True,
                )
            )
            for i in range(ATTACKER_STREAMS)
        ]
        try:
            await asyncio.to_thread(
                lambda: wait_until(
                    lambda: _held(key_id(ATTACKER)),
                    30,
                    0.05,
                    until=lambda n: n == ATTACKER_STREAMS,
                    what="the key's two streams admitted",
                )
            )
            third = await client.post("/v1/audio/speech", json={**body, "seed": 200}, headers=auth)
            assert third.status_code == 429 and third.json()["error"]["code"] == "too_many_streams"
            assert third.headers.get("retry-after")
            held = await asyncio.gather(*opening)
            assert [r.status_code for r in held] == [200] * ATTACKER_STREAMS
            await polite.aserved("a key holding its streams")
        finally:
            for task in opening:
                if not task.done():
                    task.cancel()
                elif not task.cancelled() and task.exception() is None:
                    await task.result().aclose()
    await asyncio.to_thread(wait_idle, 30)


def test_a_client_that_leaves_stops_its_work_whatever_its_headers_say(keyed):
    """``x-request-disconnect-disabled: ?1`` tells Serve's proxy not to cancel the request when
    the client leaves; the speech stream watches for that itself. ~5 minutes of speech: its rows
    would decode for far longer than the bound below if they were left running."""
    from support.app import app_args

    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions

    text = LONG_TEXT * 8
    segments = len(Planner(app_args().segments).plan(text, SynthesisOptions(voice="alloy")).segments)
    headers = {
        **_auth(ATTACKER),
        "x-request-disconnect-disabled": "?1",
        "x-request-timeout-seconds": "0",
        "Cache-Control": "no-store",
    }
    admitted0 = wait_idle(30)["rows_admitted"]
    with httpx.stream(
        "POST",
        keyed + "/v1/audio/speech",
        json={"input": text, "response_format": "pcm", "seed": 7},
        headers=headers,
        timeout=60,
    ) as r:
        assert r.status_code == 200
        # Read on (a client that stalls is another case) until its rows are seen decoding.
        got = 0
        for chunk in r.iter_raw():
            got += len(chunk)
            if acoustic_stats()["running_rows"] > 0:
                break
        assert 0 < got < 24000 * 2 * 60, f"{got} bytes read and no row of the stream seen running"
    t0 = time.perf_counter()
    admitted = wait_idle(5)["rows_admitted"] - admitted0
    assert admitted < segments, f"all {segments} segments were decoded after the client left"
    report(
        "abuse: rows freed after a client with disconnect-disabled left",
        f"{time.perf_counter() - t0:.2f} s; {admitted} of its {segments} segments had started",
    )


def test_a_client_cannot_lift_the_request_deadline(keyed):
    """``x-request-timeout-seconds: 0`` turns off the proxy's timeout, not the service's."""
    with ingress_settings(request_timeout_s=1.0):
        t0 = time.perf_counter()
        with httpx.stream(
            "POST",
            keyed + "/v1/audio/speech",
            timeout=60,
            json={"input": LONG_TEXT * 2, "response_format": "pcm", "seed": 8},
            headers={**_auth(ATTACKER), "x-request-timeout-seconds": "0", "Cache-Control": "no-store"},
        ) as r:
            got = sum(len(c) for c in r.iter_raw())
        took = time.perf_counter() - t0
    full = 2 * 24000 * 80  # ~80 s of audio at 24 kHz s16
    assert got < full / 2 and took < 10, (got, took)
    wait_idle(20)


@pytest.mark.parametrize("route", ["speech", "voices"])
def test_deeply_nested_json_is_a_400_not_a_500(keyed, route):
    doc = "[" * 20000 + "]" * 20000
    path = "/v1/audio/speech" if route == "speech" else "/v1/audio/voices"
    r = httpx.post(
        keyed + path, content=doc, headers={**_auth(ATTACKER), "Content-Type": "application/json"}, timeout=30
    )
    assert_openai_error(r, 400, "invalid_json")


def test_speaker_bombs_and_inflating_clips_are_refused_and_memory_holds(keyed, polite):
    bomb = speaker_bombs()["zeros 11 MiB"]
    with memory_held("speaker bombs and an inflating clip"):
        t0 = time.perf_counter()
        for _ in range(20):
            r = httpx.post(
                keyed + "/v1/audio/speech", json={"input": "你好", "voice": bomb}, headers=_auth(ATTACKER), timeout=30
            )
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_voice", r.text[:200]
        assert time.perf_counter() - t0 < 10
        made = httpx.post(
            keyed + "/v1/audio/voices", json={"name": "bomb", "speaker": bomb}, headers=_auth(ATTACKER), timeout=30
        )
        assert made.status_code == 400 and made.json()["error"]["code"] == "invalid_speaker"
        clip = httpx.post(
            keyed + "/v1/audio/voices",
            headers=_auth(ATTACKER),
            timeout=60,
            data={"name": "inflated", "transcript": "你好，这是参考音频。"},
            files={"audio": ("x.wav", ima_adpcm_wav(10), "audio/wav")},
        )
        assert_openai_error(clip, 400, "invalid_audio")
        polite.served("speaker bombs and clips")


# ---------------------------------------------------------------------------------------- WebSocket


def _held(client: str) -> int:
    import ray

    counter = ray.get_actor(f"stream-slots:{APP_NAME}", namespace="chattts_serve")
    return ray.get(counter.held.remote(client))


def _ws(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/audio/speech/stream"


async def test_sockets_that_never_speak_are_refused_or_closed(keyed, polite):
    accepted, refused = [], 0
    for _ in range(12):
        try:
            accepted.append(await websockets.connect(_ws(keyed), open_timeout=10))
        except websockets.InvalidStatus:
            refused += 1
    assert len(accepted) <= 4 and refused >= 8, (len(accepted), refused)
    await polite.aserved("idle sockets")
    codes = []
    for ws in accepted:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            event = json.loads(await asyncio.wait_for(ws.recv(), FIRST_MESSAGE_S + 10))
            assert event["type"] == "error" and event["error"]["code"] == "timeout", event
            await asyncio.wait_for(ws.recv(), 10)
        codes.append(closed.value.rcvd.code)
    assert set(codes) <= {4408}, codes
    # Their places are free again.
    async with websockets.connect(_ws(keyed), additional_headers=_auth(POLITE)) as ws:
        await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
        assert json.loads(await ws.recv())["type"] == "session.created"


async def test_an_idle_session_is_closed(keyed):
    async with websockets.connect(_ws(keyed), additional_headers=_auth(ATTACKER)) as ws:
        await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
        assert json.loads(await ws.recv())["type"] == "session.created"
        t0 = time.perf_counter()
        with pytest.raises(websockets.ConnectionClosed) as closed:
            while True:
                message = await asyncio.wait_for(ws.recv(), 20)
                if isinstance(message, str) and json.loads(message)["type"] == "error":
                    assert json.loads(message)["error"]["code"] == "idle_timeout"
        assert closed.value.rcvd.code == 4408 and time.perf_counter() - t0 < 15


async def test_a_flush_flood_costs_a_few_planning_calls(keyed, polite):
    async with websockets.connect(_ws(keyed), additional_headers=_auth(ATTACKER), max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
        assert json.loads(await ws.recv())["type"] == "session.created"
        for _ in range(300):
            await ws.send(json.dumps({"type": "text.append", "text": "啊"}))
            await ws.send(json.dumps({"type": "text.flush"}))
        await ws.send(json.dumps({"type": "text.append", "text": ""}))  # an empty append is refused...
        event = None
        while True:
            message = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(message, str):
                event = json.loads(message)
                if event["type"] in ("error", "done"):
                    break
        assert (
            event["type"] == "error" and event["error"]["code"] == "invalid_value" and event["error"]["param"] == "text"
        )
    # A flood that ends politely: few segments (cuts joined while 4 are being planned), all spoken.
    async with websockets.connect(_ws(keyed), additional_headers=_auth(ATTACKER), max_size=None) as ws:
        await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
        await ws.recv()
        for _ in range(300):
            await ws.send(json.dumps({"type": "text.append", "text": "啊"}))
            await ws.send(json.dumps({"type": "text.flush"}))
        await ws.send(json.dumps({"type": "close"}))
        served = asyncio.ensure_future(polite.aserved("a flush flood"))
        while True:
            message = await asyncio.wait_for(ws.recv(), 120)
            if isinstance(message, str) and json.loads(message)["type"] == "done":
                done = json.loads(message)
                break
        await served
    report("abuse: segments of a 300-flush flood", str(done["segments"]))
    assert 1 <= done["segments"] <= 100, done


def _fuzz_messages(rng: random.Random) -> list:
    kinds = ["session.start", "text.append", "text.flush", "cancel", "close", "nope", None, 7]
    values = ["", "你好。", "a" * 70000, None, 1e308, -1, [], {}, {"x": [1]}, "\x00", "[break_3]" * 50, True]
    out: list = []
    for _ in range(rng.randint(1, 12)):
        roll = rng.random()
        if roll < 0.1:
            out.append(bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 64))))
        elif roll < 0.2:
            out.append(
                rng.choice(
                    [
                        "{",
                        "not json",
                        "[" * 5000,
                        '{"type": "text.append", "text": "x"',
                        "\udcff".encode("utf-8", "surrogatepass").decode("utf-8", "replace"),
                    ]
                )
            )
        else:
            msg = {"type": rng.choice(kinds)}
            for field in rng.sample(
                ["text", "voice", "response_format", "speed", "seed", "priority", "api_key", "model", "extra"],
                rng.randint(0, 3),
            ):
                msg[field] = rng.choice(values)
            out.append(json.dumps(msg))
    return out


async def test_a_websocket_message_fuzzer_never_breaks_a_session_or_the_server(keyed, polite):
    rng = random.Random(20261201)
    outcomes: dict[str, int] = {}
    for _ in range(25):
        messages = _fuzz_messages(rng)
        headers = _auth(rng.choice([ATTACKER, POLITE, "wrong-key"])) if rng.random() < 0.8 else {}
        try:
            async with websockets.connect(_ws(keyed), additional_headers=headers, max_size=None, open_timeout=10) as ws:
                for m in messages:
                    await ws.send(m)
                while True:
                    message = await asyncio.wait_for(ws.recv(), 30)
                    if isinstance(message, str):
                        event = json.loads(message)
                        if event["type"] == "error":
                            assert event["error"]["type"] != "server_error" or event["error"]["code"] == "timeout", (
                                event
                            )
        except websockets.ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else None
            assert code in (1000, 4400, 4401, 4403, 4404, 4408, 4413, 4429), code
            outcomes[str(code)] = outcomes.get(str(code), 0) + 1
        except websockets.InvalidStatus as exc:  # refused at the handshake (a wrong key)
            outcomes[f"http {exc.response.status_code}"] = outcomes.get(f"http {exc.response.status_code}", 0) + 1
        except asyncio.TimeoutError:  # a session still open and quiet: valid messages that asked for nothing more
            outcomes["open"] = outcomes.get("open", 0) + 1
    report("abuse: WebSocket fuzz outcomes", json.dumps(outcomes, sort_keys=True))
    await polite.aserved("the WebSocket fuzzer")
    await asyncio.to_thread(wait_idle, 30)


# ---------------------------------------------------------------------------------------- the graph


def _lone_ingress(name: str, replicas: int, settings: dict):
    """An app of ``replicas`` Ingress replicas in front of the session app's stages, at /<name>."""
    return lone_ingress(replicas, ingress=settings, voices={"backend": "memory"})


def test_an_ingress_that_requires_keys_and_has_none_never_serves(keyed):
    from ray import serve

    app = _lone_ingress("nokeys", 1, {"security": {"auth": "required", "api_keys_env": "CHATTTS_TEST_NO_SUCH_VAR"}})
    try:
        with pytest.raises(RuntimeError, match="nokeys"):
            serve.run(app, name="nokeys", route_prefix="/nokeys")
        status = serve.status().applications["nokeys"]
        assert status.status == "DEPLOY_FAILED", status.status
        messages = json.dumps({k: v.message for k, v in status.deployments.items()})
        assert "security.auth is 'required' but no API key was loaded" in messages, messages
        r = httpx.get(keyed + "/nokeys/v1/models", timeout=10)
        assert r.status_code in (404, 503), r.status_code  # nothing served there
    finally:
        serve.delete("nokeys")


def test_a_keys_stream_limit_holds_across_two_ingress_replicas(keyed, tmp_path):
    """Two Ingress replicas, one count: a key that may hold 2 streams holds 2 in all, whichever
    replica each request reaches (per replica it would get 2 on each)."""
    from ray import serve

    keys = tmp_path / "keys"
    keys.write_text(f"{ATTACKER}\n")
    settings = {
        "security": {
            "api_keys_env": None,
            "api_keys_file": str(keys),
            "keys": {key_id(ATTACKER): {"max_streams": ATTACKER_STREAMS}},
        }
    }
    serve.run(_lone_ingress("twoingress", 2, settings), name="twoingress", route_prefix="/twoingress", blocking=False)
    base = keyed + "/twoingress"
    try:
        wait_ready(base, 120)
        headers = {**_auth(ATTACKER), "Cache-Control": "no-store"}
        # ~5 minutes of speech: each stream still holds its slot when the sixth request comes (one
        # of ~40 s could end before, on an engine and vocoder this fast).
        body = {"input": LONG_TEXT * 8, "response_format": "pcm"}
        opened, statuses = [], []
        with httpx.Client(base_url=base, timeout=120) as client:
            try:
                for i in range(6):  # held open one after another: Serve routes each to the less busy replica
                    r = client.send(
                        client.build_request(
                            "POST", "/v1/audio/speech", json={**body, "seed": 300 + i}, headers=headers
                        ),
                        stream=True,
                    )
                    statuses.append(r.status_code)
                    opened.append(r)
            finally:
                for r in opened:
                    r.close()
        report("abuse: six streams of a 2-stream key over two Ingress replicas", str(statuses))
        assert statuses.count(200) == ATTACKER_STREAMS and statuses.count(429) == 6 - ATTACKER_STREAMS, statuses
    finally:
        serve.delete("twoingress")
    wait_idle(30)


def test_no_page_loads_scripts_from_elsewhere(keyed):
    for path in ("/docs", "/redoc"):
        assert httpx.get(keyed + path, timeout=10).status_code in (401, 404)
    assert httpx.get(keyed + "/openapi.json", timeout=10).status_code == 200  # the schema, for any viewer


def test_the_stream_slot_counter_answered_throughout(keyed):
    """Every leaver above had its calls cancelled with its request: none may have wedged the
    application's slot counter (each replica would then count alone, after a timeout per request)."""
    assert not ingress_log_lines("slot counter unreachable")
