"""The costliest shapes each body-taking route admits, sent to the session's app one after another:
each is answered (an audio stream, or a clear 4xx) and the Ingress's event loop never stands still
for more than 100 ms meanwhile (``Ingress.loop_stall``): work proportional to a request's size is
linear and bounded, or off the loop. (Jobs, with their million characters, have their own test.)
The newest surfaces with two keys: a lexicon that multiplies the text, heavy lexicons listed by
many clients, a Wyoming flood of pinging sockets and deep headers from one host; meanwhile the
other key's first audio stays within 3x its unloaded time + 1.5 s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

import httpx
import pytest
from support.app import ingress_settings
from support.report import report
from wyoming.audio import AudioChunk
from wyoming.client import AsyncTcpClient
from wyoming.event import async_read_event, async_write_event
from wyoming.ping import Ping
from wyoming.tts import Synthesize

from serve_app.engine.text.ssml import MAX_DEPTH
from serve_app.settings import SecurityConfig
from serve_app.wyoming import WyomingConfig, WyomingServer

N = 4096  # ingress.max_input_chars
MAX_STALL_MS = 100.0


def _fill(unit: str, n: int = N) -> str:
    return (unit * (n // len(unit) + 1))[:n]


def _ssml(unit: str, n: int = N) -> str:
    """A document of ``unit`` repeated whole, ``n`` characters at most."""
    head, tail = "<speak>", "</speak>"
    return head + unit * ((n - len(head) - len(tail)) // len(unit)) + tail


def _nested(depth: int) -> str:
    # <speak> and <p> are two of the depth's levels.
    opened = '<prosody rate="fast">' * (depth - 3)
    closed = "</prosody>" * (depth - 3)
    body = _fill("嗯。", N - 30 - len(opened) - len(closed))
    return f"<speak><p>{opened}{body}{closed}</p></speak>"


PLAIN = {f"run of {c!r}": _fill(c) for c in [".", "1", "<", "&", "a", "语", "[", "😀", "-", ":", "/", "1,", "1.", " "]}
PLAIN["tags"] = _fill("[laugh]")
SSML = {
    "breaks": _ssml('<break time="10ms"/>嗯'),
    "dates": _ssml('<say-as interpret-as="date">2024-03-05</say-as>'),
    "empty elements": _ssml("<s></s>"),
    "deepest nesting": _nested(MAX_DEPTH),
    "entities": _ssml("&amp;&lt;"),
    "subs": _ssml('<sub alias="好">x</sub>'),
}


def _turns(unit: str, turns: int = 64) -> list[dict]:
    # The dialogue's canonical JSON is what the input limit counts: leave room for the framing.
    per = (N - turns * 60) // turns
    text = _ssml(unit, per) if unit.startswith("<") else _fill(unit, per)
    return [{"voice": ("alloy", "echo", "nova")[i % 3], "input": text} for i in range(turns)]


def _answered(resp: httpx.Response) -> None:
    assert resp.status_code == 200 or 400 <= resp.status_code < 500, (resp.status_code, resp.read()[:300])
    if resp.status_code != 200:
        body = json.loads(resp.read())
        assert body["error"]["code"], body


def _post(url: str, path: str, body: dict) -> None:
    # A stream closed after its headers: the parse and the plan are what is measured, not a synthesis.
    t0 = time.perf_counter()
    with httpx.stream("POST", url + path, json=body, headers={"Cache-Control": "no-store"}, timeout=300) as r:
        _answered(r)
    print(f"{path} {str(body)[:60]!r}: {r.status_code} in {time.perf_counter() - t0:.1f} s")


@pytest.fixture()
def stall(chattts_handle):
    def reset() -> None:
        chattts_handle.loop_stall.remote(reset=True).result(_skip_asyncio_check=True)

    def longest() -> float:
        return chattts_handle.loop_stall.remote().result(_skip_asyncio_check=True)["longest_busy_ms"]

    reset()
    longest.reset = reset
    return longest


def test_speech_never_holds_the_loop(app_url, stall):
    for text in PLAIN.values():
        _post(app_url, "/v1/audio/speech", {"input": text, "input_format": "text", "response_format": "pcm"})
    for text in SSML.values():
        _post(app_url, "/v1/audio/speech", {"input": text, "response_format": "pcm"})
    _post(
        app_url,
        "/v1/audio/speech",
        {"input": "你好。", "instructions": _fill("cheerful, ", 4096), "response_format": "pcm"},
    )
    assert stall() < MAX_STALL_MS


def test_a_long_timed_answer_never_holds_the_loop(app_url, stall):
    """The with-timestamps answer is the whole audio as base64 in one JSON body (tens of MB at
    the input limit: 576 ms of the loop when it was built there). Synthesised whole, so a
    quarter of the input limit keeps the test short: ~10 MB of answer. Of the SSML shapes, the
    one with the most segments (so the most caption cues): their parsing and planning, common
    to every route, is timed above without the 4-7 s of synthesis each costs here."""
    for text in (_fill("语", N // 4),):
        _post(app_url, "/v1/audio/speech/with-timestamps", {"input": text, "response_format": "wav", "captions": "vtt"})
    _post(app_url, "/v1/audio/speech/with-timestamps", {"input": SSML["breaks"], "response_format": "pcm"})
    assert stall() < MAX_STALL_MS


def test_dialogue_never_holds_the_loop(app_url, stall):
    for unit in ("1", ".", "语"):  # the most turns
        _post(app_url, "/v1/audio/dialogue", {"turns": _turns(unit), "response_format": "pcm"})
    _post(app_url, "/v1/audio/dialogue", {"turns": _turns('<break time="10ms"/>嗯', 16), "response_format": "pcm"})
    assert stall() < MAX_STALL_MS


# ------------------------------------------------------------------ lexicons and Wyoming, with keys

ATTACKER, POLITE = "sk-worst-attacker", "sk-worst-polite"
# One character read as 128 characters of 12-digit numbers (each ~10x longer read out).
ALIAS = " ".join(["123456789012"] * 10)[:128]


@contextlib.contextmanager
def _two_keys(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(f"{ATTACKER}\n{POLITE}\n")
    security = {**SecurityConfig().model_dump(), "api_keys_env": None, "api_keys_file": str(keys)}
    with ingress_settings(security=security):
        yield


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class PoliteKey:
    """Another key's first audio (a streamed request's first bytes), unloaded, then under attack."""

    def __init__(self, url: str):
        self.url = url
        self.n = 0
        self.unloaded_s = min(self.first_audio_s() for _ in range(3))

    def first_audio_s(self) -> float:
        self.n += 1
        body = {"input": f"第{self.n}次，你好。", "response_format": "pcm", "seed": 3}
        t0 = time.perf_counter()
        headers = {**_auth(POLITE), "Cache-Control": "no-store"}
        with httpx.stream("POST", self.url + "/v1/audio/speech", json=body, headers=headers, timeout=120) as r:
            assert r.status_code == 200, r.read()[:300]
            next(r.iter_raw())
            took = time.perf_counter() - t0
            r.close()
        return took

    def bound_s(self) -> float:
        return 3 * self.unloaded_s + 1.5

    async def during(self, running: asyncio.Event, n: int = 3) -> list[float]:
        await running.wait()
        return [await asyncio.to_thread(self.first_audio_s) for _ in range(n)]

    def check(self, took: list[float], what: str) -> None:
        assert max(took) < self.bound_s(), f"{what}: first audio {took}, unloaded {self.unloaded_s:.2f} s"
        report(
            f"worst inputs: another key's first audio during {what}",
            f"{max(took):.2f} s worst of {len(took)} (unloaded {self.unloaded_s:.2f} s, bound {self.bound_s():.2f} s)",
        )


def _make_lexicon(url: str, key: str, body: dict) -> str:
    r = httpx.post(url + "/v1/audio/lexicons", json=body, headers=_auth(key), timeout=120)
    assert r.status_code == 200, r.text[:300]
    return r.json()["id"]


def _delete_lexicons(url: str, key: str) -> None:
    for x in httpx.get(url + "/v1/audio/lexicons", headers=_auth(key), timeout=60).json()["data"]:
        httpx.delete(f"{url}/v1/audio/lexicons/{x['id']}", headers=_auth(key), timeout=60)


def test_a_lexicon_that_multiplies_the_text_never_holds_anyone(app_url, stall, tmp_path):
    """A key's default lexicon reads 的 as 128 characters of 12-digit numbers; then requests of
    4,096 的 (text, SSML, a dialogue): before, ~20 s of normalising each before a 413 (44 s seen),
    the TextNormalizer busy for everyone. Now 413 ``input_too_long`` as the text grows."""
    with _two_keys(tmp_path):
        polite = PoliteKey(app_url)
        _make_lexicon(app_url, ATTACKER, {"name": "x", "entries": [{"text": "的", "alias": ALIAS}], "default": True})
        bodies = [
            ("/v1/audio/speech", {"input": _fill("的"), "response_format": "pcm"}),
            ("/v1/audio/speech", {"input": _ssml("的"), "response_format": "pcm"}),
            ("/v1/audio/dialogue", {"turns": _turns("的", 8), "response_format": "pcm"}),
        ]

        def attack() -> list[dict]:
            got = []
            for path, body in bodies * 2:
                r = httpx.post(app_url + path, json=body, headers=_auth(ATTACKER), timeout=300)
                got.append((r.status_code, r.json()["error"]))
            return got

        async def both():
            running = asyncio.Event()

            async def attacking():
                running.set()
                return await asyncio.to_thread(attack)

            return await asyncio.gather(attacking(), polite.during(running))

        try:
            answers, took = asyncio.run(both())
        finally:
            _delete_lexicons(app_url, ATTACKER)
    for status, error in answers:
        assert (status, error["code"], error["param"]) == (413, "input_too_long", "input"), error
    polite.check(took, "requests a lexicon multiplies")
    longest = stall()
    report("worst inputs: Ingress loop's longest stall, requests a lexicon multiplies", f"{longest:.1f} ms")
    assert longest < MAX_STALL_MS


def test_listing_heavy_lexicons_by_many_clients_never_holds_the_loop(app_url, stall, tmp_path):
    """20 lexicons of 500 pinyin entries (a key's quota, each at the bounds), listed by 30 clients
    at once, three times: each listing re-validated every entry on the loop (~200 ms a GET)."""
    syllables = ["yin2", "hang2", "zhong1", "guo2", "ren2", "min2"]
    chars = [chr(0x4E00 + i) for i in range(2000)]
    with _two_keys(tmp_path):
        polite = PoliteKey(app_url)
        try:
            for n in range(20):
                entries = [
                    {
                        "text": chars[(n * 500 + i) % 2000] + chars[i % 7],
                        "pinyin": f"{syllables[i % 6]} {syllables[n % 6]}",
                    }
                    for i in range(500)
                ]
                _make_lexicon(app_url, ATTACKER, {"name": f"heavy-{n}", "entries": entries, "default": n == 19})

            async def listings() -> list[int]:
                async with httpx.AsyncClient(base_url=app_url, headers=_auth(ATTACKER), timeout=120) as client:
                    out = []
                    for _ in range(3):
                        got = await asyncio.gather(*(client.get("/v1/audio/lexicons") for _ in range(30)))
                        out += [len(r.json()["data"]) for r in got]
                    return out

            async def both():
                running = asyncio.Event()

                async def attacking():
                    running.set()
                    return await listings()

                return await asyncio.gather(attacking(), polite.during(running))

            stall.reset()  # the creates are not what is measured here
            counts, took = asyncio.run(both())
        finally:
            _delete_lexicons(app_url, ATTACKER)
    assert counts == [20] * 90
    polite.check(took, "90 listings of 20 heavy lexicons")
    longest = stall()
    report("worst inputs: Ingress loop's longest stall, 90 listings of 20 heavy lexicons", f"{longest:.1f} ms")
    assert longest < MAX_STALL_MS


async def _wyoming_first_audio(host: str, port: int, text: str) -> float:
    t0 = time.perf_counter()
    async with AsyncTcpClient(host, port) as client:
        await client.write_event(Synthesize(text=text).event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 60)
            assert event is not None and event.type != "error", event
            if AudioChunk.is_type(event.type):
                return time.perf_counter() - t0


async def test_a_wyoming_flood_of_pinging_sockets_and_deep_headers_never_locks_home_assistant_out(
    app_url, stall, tmp_path
):
    """One LAN host (127.0.0.2) opens 40 sockets and pings on every one it keeps, another (127.0.0.3)
    sends event headers nested 20,000 deep: before, the 32 pinging sockets took every connection
    (Home Assistant refused) and each deep header was a 500 with a traceback. Home Assistant (a
    third address, through the Wyoming server with its own key) is served within its bound."""
    with _two_keys(tmp_path):
        server = WyomingServer(WyomingConfig(uri="tcp://127.0.0.1:0", base_url=app_url, api_key=POLITE))
        host, port = (await server.start())[0][:2]
        try:
            unloaded = min([await _wyoming_first_audio(host, port, f"第{i}句。") for i in range(3)])
            stop = asyncio.Event()
            refused: list[str] = []
            deep_errors: list[str] = []

            async def pinging() -> None:
                try:
                    reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.2", 0))
                except OSError:
                    return
                try:
                    while not stop.is_set():
                        await async_write_event(Ping(text="x").event(), writer)
                        event = await asyncio.wait_for(async_read_event(reader), 10)
                        if event is None or event.type == "error":
                            refused.append(event.data.get("code") if event is not None else "closed")
                            return
                        await asyncio.sleep(0.2)
                except (OSError, asyncio.TimeoutError):
                    return
                finally:
                    writer.close()

            async def deep() -> None:
                header = b'{"type": "synthesize", "data": {"x": ' + b"[" * 20_000 + b"]" * 20_000 + b"}}\n"
                for _ in range(5):
                    reader, writer = await asyncio.open_connection(host, port, local_addr=("127.0.0.3", 0))
                    writer.write(header)
                    await writer.drain()
                    deep_errors.append((await asyncio.wait_for(reader.read(), 10)).decode(errors="replace"))
                    writer.close()

            flood = [asyncio.create_task(pinging()) for _ in range(40)]
            await asyncio.sleep(0.5)
            deep_task = asyncio.create_task(deep())
            took = [await _wyoming_first_audio(host, port, f"第{i}次来了。") for i in range(3)]
            await deep_task
            stop.set()
            await asyncio.gather(*flood)
        finally:
            await server.stop()
    bound = 3 * unloaded + 1.5
    assert max(took) < bound, (took, unloaded)
    assert len(refused) == 40 - 8 and set(refused) == {"too_many_connections_from_peer"}, refused
    assert len(deep_errors) == 5 and all("invalid_json" in e for e in deep_errors), deep_errors[:1]
    report(
        "worst inputs: Home Assistant's first audio through Wyoming during a flood from one host",
        f"{max(took):.2f} s worst of 3 (unloaded {unloaded:.2f} s, bound {bound:.2f} s); "
        f"{len(refused)} of 40 sockets refused per peer, 5 deep headers invalid_json",
    )
    assert (await asyncio.to_thread(stall)) < MAX_STALL_MS
