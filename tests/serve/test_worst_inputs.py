"""The costliest shapes each body-taking route admits, sent to the session's app one after another:
each is answered (an audio stream, or a clear 4xx) and the Ingress's event loop never stands still
for more than 100 ms meanwhile (``Ingress.loop_stall``): work proportional to a request's size is
linear and bounded, or off the loop. (Jobs, with their million characters, have their own test.)
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from serve_app.engine.text.ssml import MAX_DEPTH

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
    chattts_handle.loop_stall.remote(reset=True).result()

    def longest() -> float:
        return chattts_handle.loop_stall.remote().result()["longest_busy_ms"]

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
