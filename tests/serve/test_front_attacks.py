"""Attacks on the front guard and the edge cache through ``serve run config/serve.yaml`` with API
keys and the README's hook, in one ``serve run`` for the module: each attacker gets its clear 4xx
while a polite client with another key is served within a bound of its unloaded latency.

Every client is on loopback, which Serve's proxy (uvicorn) believes about ``X-Forwarded-For``
(``FrontGuardConfig.forwarded_allow_ips``): each attack names its own address there, as a
front door on this host would, so their budgets do not mix."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from support.configs import chattts_app, load
from support.report import report
from support.serve_run import ServeRun

from bench.lib.procs import free_port
from serve_app.http.middleware import AUTH_HEADER
from serve_app.settings import HOOK_ENV, IMPORT_PATH, FrontGuardConfig

pytestmark = [pytest.mark.serve, pytest.mark.own_ray]  # its own `serve run`: after the session's Ray

POLITE_KEY = "polite-key-0123456789"
OTHER_KEY = "second-key-0123456789"
GUARD = FrontGuardConfig(max_clients=64)  # a small table of unknown clients: eviction within reach
EDGE_BODY_TIMEOUT_S = 3.0
SPEECH = {"model": "chattts", "input": "你好", "voice": "alloy", "response_format": "wav"}


@pytest.fixture(scope="module")
def keyed_run(chattts_cache_dir, tmp_path_factory, stopped_by_session_end):
    config = load("cpu")
    config["http_options"].update(host="127.0.0.1", port=free_port())
    chattts_app(config)["args"]["jobs"] = {"path": str(tmp_path_factory.mktemp("attack-jobs"))}
    # Voices and lexicons (which follow the voices' path) of this run only, not the user's.
    chattts_app(config)["args"]["voices"] = {"path": str(tmp_path_factory.mktemp("attack-voices"))}
    env = {
        HOOK_ENV: IMPORT_PATH,
        "CHATTTS_API_KEYS": f"{POLITE_KEY},{OTHER_KEY}",
        "CHATTTS_FRONT_GUARD": GUARD.model_dump_json(),
        "CHATTTS_EDGE_CACHE": json.dumps({"body_timeout_s": EDGE_BODY_TIMEOUT_S}),
    }
    run = ServeRun(config, tmp_path_factory.mktemp("serve-run-attacks"), chattts_cache_dir, env).start()
    try:
        yield run.wait_ready()
    finally:
        run.stop_in_background()  # Ctrl-C: its shutdown overlaps the next module's start-ups
        stopped_by_session_end.append(run)


class Polite:
    """A client with a real key: its unloaded latency first, then its latency under each attack."""

    def __init__(self, url: str, key: str = POLITE_KEY):
        self.url, self.headers = url, {"Authorization": f"Bearer {key}"}
        self.unloaded_s = min(self._once() for _ in range(3))

    def _once(self) -> float:
        t0 = time.perf_counter()
        r = httpx.post(
            self.url + "/v1/audio/speech",
            json={**SPEECH, "seed": 11},
            headers={**self.headers, "Cache-Control": "no-store"},
            timeout=60,
        )
        assert r.status_code == 200, r.text[:300]
        assert AUTH_HEADER not in r.headers  # the guard takes the Ingress's mark off
        return time.perf_counter() - t0

    async def during(self, attack_running: asyncio.Event, n: int = 3) -> list[float]:
        await attack_running.wait()
        return [await asyncio.to_thread(self._once) for _ in range(n)]

    def bound_s(self) -> float:
        return 3 * self.unloaded_s + 1.5

    def check(self, took: list[float], what: str) -> None:
        assert max(took) < self.bound_s(), f"{what}: polite client took {took}, unloaded {self.unloaded_s:.2f} s"
        report(
            f"front attacks: polite client during {what}",
            f"{max(took):.2f} s worst of {len(took)} (unloaded {self.unloaded_s:.2f} s, bound {self.bound_s():.2f} s)",
        )


@pytest.fixture(scope="module")
def polite(keyed_run):
    return Polite(keyed_run.url)


@pytest.mark.timeout(420)
def test_made_up_keys_seen_on_a_public_page_still_share_their_address_budget(keyed_run, polite):
    """50 made-up keys, each seen once on /healthz (200 to anyone), then 20 requests each: only
    the address's burst (plus its refill) reaches the service as 401; the rest are the guard's
    429. Before, each key was "served" by its /healthz answer and all 1000 reached the Ingress."""
    address = {"X-Forwarded-For": "198.51.100.1"}
    keys = [f"Bearer made-up-{i}" for i in range(50)]

    async def attack():
        running = asyncio.Event()
        async with httpx.AsyncClient(
            base_url=keyed_run.url, timeout=120, limits=httpx.Limits(max_connections=250)
        ) as client:
            for key in keys:
                assert (await client.get("/healthz", headers={**address, "Authorization": key})).status_code == 200

            async def one(key):
                r = await client.get("/v1/models", headers={**address, "Authorization": key})
                running.set()
                return r.status_code, r.json()["error"]["code"]

            t0 = time.perf_counter()
            answers, took = await asyncio.gather(
                asyncio.gather(*(one(k) for k in keys for _ in range(20))), polite.during(running)
            )
            return answers, took, time.perf_counter() - t0

    answers, took, elapsed = asyncio.run(attack())
    reached = sum(1 for status, _ in answers if status == 401)
    assert {code for status, code in answers if status == 401} <= {"invalid_api_key"}
    assert sum(1 for status, code in answers if (status, code) == (429, "too_many_refusals")) == 1000 - reached
    allowance = GUARD.address_refusal_burst + GUARD.address_refusals_per_s * elapsed
    assert reached <= allowance, (reached, allowance)
    polite.check(took, "1000 made-up-key requests")
    report(
        "front attacks: 50 made-up keys seen on /healthz, 1000 requests",
        f"{reached} reached the service as 401 (allowance {allowance:.0f} in {elapsed:.1f} s; before: 1000), the rest 429",
    )


@pytest.mark.timeout(420)
def test_a_flood_of_unknown_credentials_never_evicts_a_served_key(keyed_run, polite):
    """A served key at an address, then more unknown credentials from it than the guard's table
    of unknown clients holds: the key is still served on every path (before: pushed out, it paid
    the address's empty budget and got 429 everywhere)."""
    address = {"X-Forwarded-For": "198.51.100.2"}
    served = {**address, "Authorization": f"Bearer {OTHER_KEY}"}

    async def attack():
        running = asyncio.Event()
        async with httpx.AsyncClient(
            base_url=keyed_run.url, timeout=120, limits=httpx.Limits(max_connections=250)
        ) as client:
            assert (await client.get("/v1/models", headers=served)).status_code == 200  # served

            async def one(i):
                r = await client.get("/v1/models", headers={**address, "Authorization": f"Bearer churn-{i}"})
                running.set()
                return r.status_code

            statuses, took = await asyncio.gather(
                asyncio.gather(*(one(i) for i in range(4 * GUARD.max_clients))), polite.during(running)
            )
            after = [(await client.get(path, headers=served)).status_code for path in ("/v1/models", "/v1/voices")]
            return statuses, took, after

    statuses, took, after = asyncio.run(attack())
    assert set(statuses) <= {401, 429} and statuses.count(401) <= GUARD.address_refusal_burst + 60
    assert after == [200, 200], after
    polite.check(took, f"{len(statuses)} unknown credentials")
    report(
        "front attacks: a served key after a churn of unknown credentials",
        f"{len(statuses)} unknown credentials ({statuses.count(401)} 401, {statuses.count(429)} 429) through a table of "
        f"{GUARD.max_clients}: the served key still 200 on {len(after)} paths (before: 429)",
    )


async def _slow_sender(port: int, authorization: str | None, address: str) -> tuple[float, bytes]:
    """A speech POST that declares 1000 bytes and sends one byte a second: (seconds to the answer,
    the answer), or the time it gave up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n"
        f"X-Forwarded-For: {address}\r\n" + (f"Authorization: {authorization}\r\n" if authorization else "") + "\r\n"
    )
    t0 = time.perf_counter()
    writer.write(head.encode() + b"{")
    await writer.drain()
    answer = b""
    try:
        while time.perf_counter() - t0 < 30:
            try:
                answer = await asyncio.wait_for(reader.read(4096), 1.0)
                seconds = time.perf_counter() - t0
                return seconds, answer + await _rest(reader)
            except asyncio.TimeoutError:
                writer.write(b" ")  # a byte now and then
                await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        writer.close()
    return time.perf_counter() - t0, answer


async def _rest(reader: asyncio.StreamReader) -> bytes:
    """What follows an answer's first bytes (its body may come in a later segment), for 2 s at most."""
    rest = b""
    try:
        while chunk := await asyncio.wait_for(reader.read(4096), 2.0):
            rest += chunk
            if rest.rstrip().endswith(b"}"):
                break
    except (asyncio.TimeoutError, ConnectionError, OSError):
        pass
    return rest


@pytest.mark.timeout(420)
def test_slow_bodies_are_answered_408_within_the_deadline_and_keyless_ones_are_never_read(keyed_run, polite):
    """Sockets that send a speech body a byte a second: with a credential the edge cache answers
    408 ``body_timeout`` at its deadline (before: held as long as they kept sending, no status for
    the guard); without one the request is not read at the edge and the Ingress answers 401 from
    the headers at once."""
    port = int(keyed_run.url.rsplit(":", 1)[1])

    async def attack():
        running = asyncio.Event()

        async def all_senders():
            running.set()
            return await asyncio.gather(
                *(_slow_sender(port, f"Bearer slow-{i}", "198.51.100.3") for i in range(20)),
                *(_slow_sender(port, None, "198.51.100.4") for _ in range(10)),
            )

        return await asyncio.gather(all_senders(), polite.during(running))

    answers, took = asyncio.run(attack())
    keyed, keyless = answers[:20], answers[20:]
    for seconds, answer in keyed:
        assert answer.startswith(b"HTTP/1.1 408") and b"body_timeout" in answer, answer[:300]
        assert EDGE_BODY_TIMEOUT_S - 0.2 <= seconds < EDGE_BODY_TIMEOUT_S + 3, seconds
    for seconds, answer in keyless:
        assert answer.startswith(b"HTTP/1.1 401") and b"invalid_api_key" in answer and seconds < 3, (
            seconds,
            answer[:300],
        )
    polite.check(took, "30 slow bodies")
    report(
        "front attacks: slow bodies",
        f"20 with made-up keys 408 after {min(s for s, _ in keyed):.1f}-{max(s for s, _ in keyed):.1f} s "
        f"(deadline {EDGE_BODY_TIMEOUT_S:g} s; before: held while they sent), 10 without a key 401 in "
        f"{max(s for s, _ in keyless):.2f} s, unread",
    )


def _healthz_s(url: str) -> float:
    t0 = time.perf_counter()
    assert httpx.get(url + "/healthz", timeout=30).status_code == 200
    return time.perf_counter() - t0


@pytest.mark.timeout(420)
def test_the_new_surfaces_answer_their_costliest_inputs_clearly(keyed_run, polite):
    """Jobs, dialogues, SSML and the cache, as an attacker with a real key uses them: each gets a
    clear answer while /healthz and a polite key stay prompt. Before: a job of 200,000 full stops
    froze the Ingress's loop (quadratic sentence cutting: 20,000 dots took 4.3 s), a dialogue of
    breaks had 1,560 s of silence with a 200, a say-as date of thousands of digits and two
    instructions of 4,096 characters were 500s, and one key's cached answer answered another's."""
    attacker = {"Authorization": f"Bearer {OTHER_KEY}", "X-Forwarded-For": "198.51.100.5"}
    url = keyed_run.url

    def post(path: str, body: dict, **kw) -> httpx.Response:
        return httpx.post(url + path, json=body, headers={**attacker, **kw.pop("headers", {})}, timeout=120, **kw)

    async def attack() -> tuple[dict, list[float], list[float]]:
        running = asyncio.Event()
        got: dict = {}

        async def attacks() -> None:
            running.set()
            dots = await asyncio.to_thread(post, "/v1/audio/jobs", {"input": "." * 200_000 + "好"})
            got["dot job"] = (dots.status_code, dots.json())
            # 10 turns of twelve 10 s breaks: each turn within SSML's own 120 s, 1,200 s in all.
            breaks = [{"voice": "alloy", "input": "<speak>" + "嗯<break time='10s'/>" * 12 + "</speak>"}] * 10
            got["silence dialogue"] = (await asyncio.to_thread(post, "/v1/audio/dialogue", {"turns": breaks})).json()
            date = '<speak><say-as interpret-as="date" format="ymd">' + "9" * 4000 + "-01-01</say-as></speak>"
            got["say-as digits"] = (await asyncio.to_thread(post, "/v1/audio/speech", {"input": date})).json()
            turns = [{"voice": "alloy", "input": "你好。", "instructions": "cheerful " * 100}]  # joined: over 4,096
            instructed = await asyncio.to_thread(
                post, "/v1/audio/dialogue", {"turns": turns, "instructions": "slowly " * 585, "response_format": "pcm"}
            )
            got["instructions"] = instructed.status_code

        async def prompt_health() -> list[float]:
            await running.wait()
            out = []
            while len(out) < 40 and "instructions" not in got:
                out.append(await asyncio.to_thread(_healthz_s, url))
                await asyncio.sleep(0.05)
            return out

        _, took, health = await asyncio.gather(attacks(), polite.during(running), prompt_health())
        return got, took, health

    got, took, health = asyncio.run(attack())
    status, job = got["dot job"]
    assert status == 202 or status in (400, 409, 413, 429), (status, job)
    if status == 202:  # within the key's reservation: cancelled, not left to run
        assert httpx.post(f"{url}/v1/audio/jobs/{job['id']}/cancel", headers=attacker, timeout=30).status_code == 200
    assert got["silence dialogue"]["error"]["code"] == "request_too_large"
    assert "max_silence_seconds" in got["silence dialogue"]["error"]["message"]
    assert got["say-as digits"]["error"]["code"] == "invalid_ssml"
    assert got["instructions"] == 200
    assert max(health) < 0.5, health
    polite.check(took, "dot jobs, silence dialogues, SSML digits, long instructions")

    # The cache: an SSML-looking text spoken as text by one key is not another key's answer.
    ssml = "<speak>缓存<break time='300ms'/>隔离</speak>"
    first = post("/v1/audio/speech", {"input": ssml, "input_format": "text", "response_format": "pcm", "seed": 5})
    assert (first.status_code, first.headers["x-cache"]) == (200, "miss")
    mine = httpx.post(
        url + "/v1/audio/speech",
        json={"input": ssml, "response_format": "pcm", "seed": 5},
        headers=polite.headers,
        timeout=120,
    )
    assert mine.status_code == 200 and mine.headers["x-cache"] == "miss" and mine.content != first.content
    report(
        "front attacks: new surfaces",
        f"dot job {status}; silence dialogue 413; say-as digits 400; "
        f"instructions 200; /healthz worst {max(health) * 1000:.0f} ms over {len(health)} probes",
    )


@pytest.mark.timeout(420)
def test_the_edge_never_answers_with_audio_of_a_lexicon_that_changed(keyed_run):
    """Through the README's hook, with keys: a key's default lexicon replaced or deleted, and the
    same body is spoken under the new one at once (before: the edge gave the old audio for
    ``ttl_s``); a deleted lexicon's id is 400 at once (before: 200 from the edge). An answer only
    the request decides (``lexicon: "none"``) is still the edge's."""
    url, key = keyed_run.url, {"Authorization": f"Bearer {POLITE_KEY}"}
    lexicons = url + "/v1/audio/lexicons"

    def make(alias: str, default: bool = True) -> str:
        body = {"name": alias, "entries": [{"text": "苹果", "alias": alias}], "default": default}
        r = httpx.post(lexicons, json=body, headers=key, timeout=60)
        assert r.status_code == 200, r.text[:300]
        return r.json()["id"]

    def speak(**extra) -> httpx.Response:
        body = {**SPEECH, "input": "我喜欢苹果。", "seed": 21, "response_format": "pcm", **extra}
        return httpx.post(url + "/v1/audio/speech", json=body, headers=key, timeout=120)

    def twice(**extra) -> tuple[bytes, list[str]]:
        """The answer to the same body asked twice (the second a cache hit), and where each came from."""
        answers = [speak(**extra) for _ in range(2)]
        assert all(a.status_code == 200 for a in answers), answers[-1].text[:300]
        assert answers[0].content == answers[1].content
        return answers[1].content, [a.headers.get("x-edge-cache", "ingress") for a in answers]

    made = []
    try:
        made.append(make("香蕉"))
        banana, where = twice()
        assert where == ["ingress", "ingress"], where  # a key's default may change: never the edge's
        made.append(make("西瓜 西瓜 西瓜"))  # the newest default wins
        melon, _ = twice()
        assert melon != banana and len(melon) > len(banana)
        httpx.delete(f"{lexicons}/{made.pop()}", headers=key, timeout=30)  # the default gone: none left
        plain, _ = twice()
        assert plain not in (banana, melon)
        httpx.delete(f"{lexicons}/{made.pop()}", headers=key, timeout=30)
        named = make("香蕉", default=False)
        made.append(named)
        assert twice(lexicon=named)[0] == banana
        httpx.delete(f"{lexicons}/{made.pop()}", headers=key, timeout=30)
        gone = speak(lexicon=named)
        assert gone.status_code == 400 and gone.json()["error"]["code"] == "lexicon_not_found", gone.text[:300]
        # What no lexicon can change is still given by the edge.
        none, none_where = twice(lexicon="none")
        assert none == plain and none_where == ["ingress", "hit"], none_where
    finally:
        for lexicon_id in made:
            httpx.delete(f"{lexicons}/{lexicon_id}", headers=key, timeout=30)
    report(
        "front attacks: edge cache and lexicons",
        "a replaced and a deleted default lexicon heard at once, a deleted lexicon's id 400 (before: the edge's "
        f"old audio for ttl_s); lexicon 'none' from the edge: {none_where}",
    )
