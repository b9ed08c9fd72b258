"""Batching changes the speed, never the speech, in the shipped precision (int8 on CPU), through
the session's Serve app with the shipped chunking (early chunks when a listener would run dry):
a request decoded alone and beside seven others streaming at the same time is the same audio,
bit for bit (the vocoder's windows fall where the tokens put them, not where chunks did); a
cache hit of audio made under load is what a fresh synthesis alone makes; a dialogue's turns
are what each turn says as a request of its own. The engine's side (bit-identical rows at the
model's real depth): tests/unit/test_batch_invariance.py."""

from __future__ import annotations

import base64
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
from support.audio import snr_db
from support.report import report

from serve_app.engine.planner import segment_seed

pytestmark = pytest.mark.serve

SR = 24000
OTHERS = [
    ("今天天气很好，我们出去走走吧，顺便买点东西回来。", "echo"),
    ("Batching changes the speed of a step, never its speech.", "nova"),
    ("一二三四五六七八九十。", "onyx"),
    ("The quick brown fox jumps over the lazy dog.", "sage"),
    ("你好。", "coral"),
    ("Seven requests share the acoustic stage's steps with this one.", "ash"),
    ("长长的句子，短短的句子，都在同一个批次里解码。", "verse"),
]
TARGET = {"input": "同一个请求，单独解码和在批次里解码，声音一样。", "voice": "shimmer", "seed": 77}


def post(url: str, body: dict, cache: str = "no-store", path: str = "/v1/audio/speech") -> httpx.Response:
    r = httpx.post(
        url + path,
        json={"response_format": "pcm", **body},
        headers={"Cache-Control": cache},
        timeout=180,
    )
    assert r.status_code == 200, r.text[:300]
    return r


def pcm(r: httpx.Response) -> np.ndarray:
    return np.frombuffer(r.content, "<i2")


def same_audio(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert len(a) == len(b), (what, len(a), len(b))
    identical = np.array_equal(a, b)
    snr = float("inf") if identical else snr_db(a.astype(np.float64), b.astype(np.float64))
    report(f"same speech: {what}", "bit-identical" if identical else f"SNR {snr:.1f} dB")
    assert identical, f"{what}: SNR {snr:.1f} dB, {int(np.sum(a != b))} samples differ"


def test_a_request_alone_and_beside_seven_others_is_the_same_audio(app_url):
    alone = pcm(post(app_url, TARGET))
    with ThreadPoolExecutor(8) as pool:
        others = [
            pool.submit(post, app_url, {"input": text, "voice": voice, "seed": 100 + i})
            for i, (text, voice) in enumerate(OTHERS)
        ]
        # Cached: the hit below replays audio decoded beside the others.
        loaded = pool.submit(post, app_url, TARGET, "no-cache").result()
        assert all(f.result().status_code == 200 for f in others)
    assert loaded.headers.get("x-cache") == "miss"
    same_audio(alone, pcm(loaded), "beside seven others")
    hit = post(app_url, TARGET, cache="max-age=3600")
    assert hit.headers.get("x-cache") == "hit"
    same_audio(alone, pcm(hit), "a cache hit of audio decoded under load")


def test_a_dialogues_turns_are_what_each_turn_says_alone(app_url):
    turns = [
        {"voice": "alloy", "input": "Hello, welcome to the show."},
        {"voice": "echo", "input": "谢谢，很高兴来到这里。"},
    ]
    r = post(app_url, {"turns": turns, "seed": 9, "pause_s": 0.3}, path="/v1/audio/dialogue/with-timestamps")
    answer = r.json()
    audio = np.frombuffer(base64.b64decode(answer["audio"]), "<i2")
    segments = answer["segments"]
    for t, turn in enumerate(turns):
        first = next(i for i, s in enumerate(segments) if s["turn"] == t)
        spans = [s for s in segments if s["turn"] == t]
        start, end = round(spans[0]["start"] * SR), round(spans[-1]["end"] * SR)
        # A script's segments are seeded by their place in it: the request whose first segment
        # gets this turn's seed.
        own = pcm(post(app_url, {**turn, "seed": segment_seed(9, first)}))
        same_audio(own, audio[start : start + len(own)], f"turn {t}")
        assert abs(end - (start + len(own))) <= 1
