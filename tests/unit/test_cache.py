"""Result cache: keys, cacheability, the in-memory LRU/TTL cache and the Redis cache.

The Redis tests run against a real ``redis-server`` started here on a free loopback port (never
the system service); only a missing binary skips them.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support.redis_server import needs_redis
from support.speakers import encode_speaker
from support.waiting import wait_until_async

from bench.lib.procs import REPO_ROOT as REPO
from bench.lib.procs import free_port
from serve_app.engine.voices import VoiceResolver
from serve_app.protocol import SpeechRequest
from serve_app.settings import CacheConfig
from serve_app.storage.cache import (
    MemoryCache,
    NullCache,
    RedisCache,
    make_cache,
    request_key,
)

# A valid ChatTTS speaker string (768 float16 values), made without torch.
SPEAKER = encode_speaker(np.linspace(-1, 1, 768))
WEIGHTS = "random-tiny:abc"
BASE = dict(input="Hello world. 你好。", voice="alloy", response_format="mp3")

# The key of BASE, pinned: if it changes, every deployed cache is invalidated (bump KEY_VERSION).
GOLDEN_KEY = "chattts:v5:48c67cb6bfea64eb35735579131de4593c869f6c5b1dd553da0f9eabec54d132"


def key(**changes) -> str:
    req = SpeechRequest(**{**BASE, **changes})
    return request_key(req, VoiceResolver().resolve(req.voice), weights_id=WEIGHTS)


class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------


def test_key_format_and_golden_value():
    k = key()
    assert k.startswith("chattts:v5:") and len(k) == len("chattts:v5:") + 64
    assert k == key()
    assert k == GOLDEN_KEY


def test_key_same_in_another_process():
    code = (
        "import json, sys\n"
        "from serve_app.storage.cache import request_key\n"
        "from serve_app.engine.voices import VoiceResolver\n"
        "from serve_app.protocol import SpeechRequest\n"
        "req = SpeechRequest(**json.loads(sys.argv[1]))\n"
        "print(request_key(req, VoiceResolver().resolve(req.voice), weights_id=sys.argv[2]))\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code, json.dumps(BASE), WEIGHTS],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == key()


# One change per request field that determines the audio (every field not in NOT_IN_KEY).
CHANGES = {
    "input": "Hello world!",
    "voice": "echo",
    "seed": 7,
    "temperature": 0.31,
    "top_p": 0.71,
    "top_k": 21,
    "speed": 1.25,
    "prompt": "[oral_2]",
    "response_format": "wav",
    "lang": "en",
    "normalize": False,
    "text_normalization": "off",
    "refine_text": True,
    "volume": -3.0,
    "loudness": -16.0,
    "instructions": "speak cheerfully",
    "input_format": "text",
}
DIALOGUE = dict(turns=[{"voice": "alloy", "input": "你好。"}, {"voice": "echo", "input": "再见。"}])
DIALOGUE_CHANGES = {
    "turns": [{"voice": "alloy", "input": "你好。"}, {"voice": "nova", "input": "再见。"}],
    "pause_s": 1.5,
}


def _models():
    from serve_app.protocol import DialogueRequest, TimedSpeechRequest

    return [
        (SpeechRequest, BASE, CHANGES),
        (TimedSpeechRequest, BASE, CHANGES),
        # A dialogue's input is its turns written canonically (the model sets it): keyed through them.
        (DialogueRequest, {**BASE, **DIALOGUE}, {**CHANGES, **DIALOGUE_CHANGES, "input": None}),
    ]


@pytest.mark.parametrize("model, base, changes", _models(), ids=lambda m: getattr(m, "__name__", ""))
def test_every_request_field_is_keyed_or_named_as_not_changing_the_audio(model, base, changes):
    """A field added to a request model fails here until it has a change below (and so is
    shown to change the key) or a reason in NOT_IN_KEY."""
    from serve_app.storage.cache import NOT_IN_KEY

    unaccounted = set(model.model_fields) - set(changes) - set(NOT_IN_KEY)
    assert not unaccounted, f"fields neither keyed nor named in NOT_IN_KEY: {sorted(unaccounted)}"

    def k(**over) -> str:
        req = model(**{**base, **over})
        return request_key(req, VoiceResolver().resolve(req.voice), weights_id=WEIGHTS)

    keys = {k()}
    for field in set(model.model_fields) & {f for f, v in changes.items() if v is not None}:
        changed = k(**{field: changes[field]})
        assert changed not in keys, field
        keys.add(changed)


def test_every_field_changes_the_key():
    from serve_app.engine.types import SynthesisOptions

    # Every option that can change the audio is covered (priority only orders admission; the
    # lexicon is keyed by its resolved content: tests/unit/test_lexicon_api.py).
    assert set(SynthesisOptions.model_fields) - {"priority", "lexicon", "pronunciations"} <= set(CHANGES)
    base = key()
    req = SpeechRequest(**BASE)
    voice = VoiceResolver().resolve("alloy")
    assert request_key(req, voice, weights_id="random-tiny:abd") != base
    assert request_key(req, voice, weights_id=WEIGHTS, version=6).startswith("chattts:v6:")


def test_ssml_looking_text_and_ssml_are_two_entries():
    """``input_format: text`` speaks the markup as written; the same input as SSML is other audio
    (once one key's text answer was given to another key's SSML request from the cache)."""
    ssml = "<speak>你好<break time='1s'/>再见</speak>"
    assert key(input=ssml, input_format="text") != key(input=ssml)
    assert key(input=ssml, input_format="ssml") != key(input=ssml, input_format="text")


def test_the_scope_separates_keys():
    req = SpeechRequest(**BASE)
    voice = VoiceResolver().resolve("alloy")
    mine, theirs = (request_key(req, voice, weights_id=WEIGHTS, scope=s) for s in ("key:a", "key:b"))
    assert mine != theirs and request_key(req, voice, weights_id=WEIGHTS, scope="key:a") == mine


def test_key_canonicalisation():
    base = key()
    # Float noise and int/float spellings are the same setting.
    assert key(temperature=0.1 + 0.2) == base
    assert key(speed=1) == base
    # What does not change the audio is not in the key.
    assert key(priority=5, stream_format="sse", model="tts-1") == base
    # Voice spellings the resolver treats as one speaker with one seed.
    assert key(voice=" Alloy ") == base
    assert key(voice="seed:2222") == base
    assert key(seed=2222) == base  # alloy's own seed, given explicitly
    # A raw speaker string without a seed decodes with seed 0 (the planner's effective seed).
    assert key(voice=SPEAKER) == key(voice=SPEAKER, seed=0)
    other = encode_speaker(np.linspace(1, -1, 768))
    assert key(voice=SPEAKER) != key(voice=other)


# ---------------------------------------------------------------------------------------------
# MemoryCache
# ---------------------------------------------------------------------------------------------


async def test_memory_hit_miss_and_stats():
    c = MemoryCache(max_bytes=1000, ttl_s=60)
    assert await c.get("k") is None
    await c.put("k", b"\x00\xffaudio")
    assert await c.get("k") == b"\x00\xffaudio"
    await c.put("k", b"new")  # replace: bytes accounted once
    assert await c.get("k") == b"new"
    s = c.stats()
    assert (s["hits"], s["misses"], s["errors"], s["entries"], s["bytes"]) == (2, 1, 0, 1, 3)
    await c.close()
    assert c.stats()["entries"] == 0


def test_memory_lru_eviction_under_byte_budget():
    c = MemoryCache(max_bytes=30, ttl_s=60)
    for k in "abc":
        c.put_sync(k, k.encode() * 10)
    assert c.get_sync("a") is not None  # a is now the most recent: b is the LRU
    c.put_sync("d", b"d" * 10)
    assert c.get_sync("b") is None
    # A 20-byte item needs two slots: evicts c, then a (least recently used first), keeps d.
    c.put_sync("e", b"e" * 20)
    assert c.get_sync("c") is None and c.get_sync("a") is None
    assert c.get_sync("d") == b"d" * 10 and c.get_sync("e") == b"e" * 20
    s = c.stats()
    assert s["bytes"] == 30 and s["entries"] == 2 and s["evictions"] == 3


def test_memory_oversize_items_skipped():
    c = MemoryCache(max_bytes=100, ttl_s=60, max_item_bytes=10)
    c.put_sync("small", b"x" * 10)
    c.put_sync("big", b"x" * 11)
    assert c.get_sync("big") is None and c.get_sync("small") == b"x" * 10
    # Larger than the whole budget: skipped, and the cache is not flushed for it.
    c2 = MemoryCache(max_bytes=20, ttl_s=60)
    c2.put_sync("a", b"a" * 10)
    c2.put_sync("huge", b"h" * 21)
    assert c2.get_sync("a") == b"a" * 10 and c2.get_sync("huge") is None
    assert c.stats()["skipped"] == 1 and c2.stats()["skipped"] == 1


def test_memory_ttl_expiry_with_fake_clock():
    clock = FakeClock()
    c = MemoryCache(max_bytes=100, ttl_s=10, jitter=0.0, clock=clock)
    c.put_sync("k", b"v")
    clock.t += 9.99
    assert c.get_sync("k") == b"v"  # a hit does not extend the TTL
    clock.t += 0.01
    assert c.get_sync("k") is None
    s = c.stats()
    assert s["expired"] == 1 and s["entries"] == 0 and s["bytes"] == 0


def test_memory_expired_entries_make_room_before_live_ones():
    clock = FakeClock()
    c = MemoryCache(max_bytes=30, ttl_s=10, jitter=0.0, clock=clock)
    c.put_sync("old", b"o" * 10)
    clock.t += 5
    c.put_sync("a", b"a" * 10)
    c.put_sync("b", b"b" * 10)
    assert c.get_sync("old") == b"o" * 10  # now the most recent, but it expires first
    clock.t += 5
    c.put_sync("c", b"c" * 10)  # full: the expired entry goes, not the least recently used a
    assert c.get_sync("a") == b"a" * 10 and c.get_sync("b") == b"b" * 10 and c.get_sync("c") == b"c" * 10
    c.put_sync("a", b"A" * 5)  # a replacement is not an eviction
    assert c.ttl("a") == pytest.approx(10) and c.ttl("old") is None
    s = c.stats()
    assert (s["expired"], s["evictions"], s["entries"], s["bytes"]) == (1, 0, 3, 25)


def test_memory_jitter_spreads_expiries():
    clock = FakeClock()
    ttl, j, n = 100.0, 0.1, 500
    c = MemoryCache(max_bytes=10**6, ttl_s=ttl, jitter=j, clock=clock, rng=random.Random(1))
    for i in range(n):  # written in the same instant
        c.put_sync(f"k{i}", b"v")
    ttls = [c.ttl(f"k{i}") for i in range(n)]
    assert all(ttl * (1 - j) <= t <= ttl * (1 + j) for t in ttls)
    assert len(set(ttls)) == n
    assert max(ttls) - min(ttls) > 0.8 * 2 * j * ttl  # uses the whole window
    # At the nominal TTL only part of the burst has expired: no avalanche.
    clock.t += ttl
    alive = sum(c.get_sync(f"k{i}") is not None for i in range(n))
    assert 0.3 * n < alive < 0.7 * n


def test_memory_thread_safety():
    c = MemoryCache(max_bytes=5000, ttl_s=60, jitter=0.1)
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(3000):
                k = f"k{rng.randrange(200)}"
                if rng.random() < 0.5:
                    c.put_sync(k, k.encode() * rng.randrange(1, 20))
                else:
                    v = c.get_sync(k)
                    assert v is None or v.startswith(k.encode())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = c.stats()
    assert s["bytes"] == sum(len(v) for v, _ in c._items.values()) <= 5000
    assert s["hits"] + s["misses"] > 0


async def test_null_cache_and_config():
    n = NullCache()
    await n.put("k", b"v")
    assert await n.get("k") is None and n.stats()["misses"] == 1

    assert isinstance(make_cache(CacheConfig()), MemoryCache)
    assert isinstance(make_cache(CacheConfig(backend="none")), NullCache)
    cfg = CacheConfig(max_bytes=1234, ttl_s=5, jitter=0.2, max_item_bytes=100)
    m = make_cache(cfg)
    assert (m.max_bytes, m.ttl_s, m.jitter, m.max_item_bytes) == (1234, 5, 0.2, 100)
    r = make_cache(CacheConfig(backend="redis", redis_url="redis://127.0.0.1:1/0"))
    assert isinstance(r, RedisCache)
    await r.close()
    with pytest.raises(ValueError):
        CacheConfig(backend="redis")  # no url
    with pytest.raises(ValueError):
        CacheConfig(bogus=1)  # extra=forbid
    with pytest.raises(ValueError):
        CacheConfig(jitter=1.0)


# ---------------------------------------------------------------------------------------------
# RedisCache against a real redis-server
# ---------------------------------------------------------------------------------------------


@needs_redis
async def test_redis_round_trip_and_ttl(redis_server):
    c = RedisCache(redis_server.url, ttl_s=100, jitter=0.1)
    data = bytes(range(256)) * 100  # binary, with NULs and high bytes
    assert await c.get("chattts:v1:k") is None
    await c.put("chattts:v1:k", data)
    assert await c.get("chattts:v1:k") == data
    for i in range(50):
        await c.put(f"chattts:v1:j{i}", b"x")
    r = redis_server.client()
    assert 89 <= r.ttl("chattts:v1:k") <= 110
    pttls = [r.pttl(f"chattts:v1:j{i}") for i in range(50)]
    assert all(89_000 <= t <= 110_000 for t in pttls)
    assert len(set(pttls)) > 40  # jittered, not one shared expiry
    s = c.stats()
    assert (s["hits"], s["misses"], s["errors"], s["puts"]) == (1, 1, 0, 51)
    await c.put("chattts:v1:big", b"x" * (16 * 1024 * 1024 + 1))  # over max_item_bytes: skipped
    assert r.exists("chattts:v1:big") == 0
    r.close()
    await c.close()


async def test_redis_nothing_listening_is_a_fast_miss():
    c = RedisCache(f"redis://127.0.0.1:{free_port()}/0", ttl_s=60, timeout_s=0.2, backoff_s=30)
    t0 = time.monotonic()
    for _ in range(20):
        assert await c.get("k") is None
        await c.put("k", b"v")
    assert time.monotonic() - t0 < 2
    s = c.stats()
    assert s["errors"] == 1 and s["breaker_open"]  # one real attempt, then the breaker skips
    assert s["skipped"] == 39 and s["misses"] == 20
    await c.close()


async def _timed(coro) -> tuple[object, float]:
    t0 = time.monotonic()
    res = await coro
    return res, time.monotonic() - t0


@needs_redis
async def test_redis_outage_and_recovery(redis_server):
    backoff = 0.5
    c = RedisCache(redis_server.url, ttl_s=60, timeout_s=0.2, backoff_s=backoff)
    await c.put("k", b"before")
    assert await c.get("k") == b"before"

    redis_server.stop()  # server gone mid-test, with a pooled connection open
    for _ in range(10):
        res, dt = await _timed(c.get("k"))
        assert res is None and dt < 0.5
        _, dt = await _timed(c.put("k", b"during"))
        assert dt < 0.5
    s = c.stats()
    assert s["errors"] >= 1 and s["breaker_open"] and s["skipped"] >= 18

    redis_server.start()  # same port, empty (no persistence)

    async def stores_again() -> bool:
        await c.put("k", b"after")
        return await c.get("k") == b"after"

    await wait_until_async(stores_again, backoff + 3, 0.05, what=lambda: f"recovery, stats {c.stats()}")
    assert not c.stats()["breaker_open"]
    await c.close()


@needs_redis
async def test_redis_hung_server_times_out_then_breaker_skips(redis_server):
    c = RedisCache(redis_server.url, ttl_s=60, timeout_s=0.2, backoff_s=0.5)
    await c.put("k", b"v")
    redis_server.pause()
    try:
        res, dt = await _timed(c.get("k"))
        assert res is None and dt < 1.0  # bounded by the timeout, not hanging
        res, dt = await _timed(c.get("k"))
        assert res is None and dt < 0.1  # breaker open: no second timeout
        _, dt = await _timed(c.put("k", b"w"))
        assert dt < 0.1
        assert c.stats()["errors"] == 1
    finally:
        redis_server.resume()
    # None (skipped) while the breaker is open, then one call probes the server.
    await wait_until_async(
        lambda: c.get("k"), 0.5 + 3, 0.05, until=lambda v: v == b"v", what=lambda: f"recovery, stats {c.stats()}"
    )
    await c.close()
