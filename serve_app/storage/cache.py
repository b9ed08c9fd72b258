"""Result cache for synthesised audio: TTL + LRU, jittered expiry, Redis for many replicas.

Synthesis is deterministic: the same text, voice, seed, sampling parameters, speed, prompt,
format and model weights give the same bytes. So a finished response can be stored under a key
of those inputs and replayed.

- ``request_key`` hashes a canonical JSON of every input that determines the audio.
- ``MemoryCache``: one process, LRU under a byte budget, TTL with per-entry jitter.
- ``RedisCache``: shared by many replicas/nodes; any Redis failure is a miss, never an error,
  and a circuit breaker keeps a dead Redis from adding its timeout to every request.
- ``NullCache``: caching off.

Plain Python (no Ray, no HTTP): the async methods are safe to await from a FastAPI replica.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import random
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, Optional, Sequence

from cachetools import Cache, TLRUCache

from ..engine.types import Voice
from ..engine.voices import effective_seed
from ..settings import CacheConfig
from .factory import open_store
from .redis_client import CircuitBreaker, open_redis, safe_url

log = logging.getLogger(__name__)

KEY_PREFIX = "chattts"
KEY_VERSION = 5  # bump when the key's meaning changes: every deployed cache is invalidated
MiB = 1024 * 1024

# ---------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------

# The request fields that do not change the audio bytes, each with why. Every other field of the
# request model is in the key as validated, so a field added later is keyed by default: a field
# left out by mistake could only answer one request with another's audio, a field keyed in
# excess only costs a miss (tests/unit/test_cache_key.py enumerates the models' fields).
NOT_IN_KEY: dict[str, str] = {
    "model": "an alias of the same weights (weights_id is in the key)",
    "priority": "orders admission only",
    "stream_format": "framing the caller applies to the cached audio bytes",
    "timestamps": "the segments' timing is stored beside the audio",
    "captions": "made from the stored timing",
    "voice": "keyed as the resolved voice's content (Voice.cache_id)",
    "seed": "keyed as the seed the planner decodes with (effective_seed)",
    "lexicon": "keyed as the resolved lexicon's content (Pronunciations.content_hash), never its id",
    "pronunciations": "set by the Ingress only; keyed as its content hash",
}
# Options that are keyed through the request (or, resolved, as voice, seed and lexicon above).
_OPTIONS_NOT_IN_KEY = {"voice", "seed", "priority", "lexicon", "pronunciations"}


def _canon(value: Any) -> Any:
    # 0.3, 0.30000000000000004 and 3e-1 are one setting; strings keep JSON float printing out of it.
    if isinstance(value, float):
        return repr(round(value, 6))
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(v) for v in value]
    return value


def request_key(
    req: Any,
    voice: Voice,
    *,
    weights_id: str,
    version: int = KEY_VERSION,
    options: Any = None,
    voices: Sequence[str] = (),
    scope: str = "",
) -> str:
    """``chattts:v<version>:<sha256 hex>`` of everything that determines a request's audio bytes.

    ``req``: a validated request model (``SpeechRequest`` and its kin): every field but
    ``NOT_IN_KEY``'s. ``voice``: its voice as ``VoiceResolver`` resolved it, so spellings of one
    speaker ("Alloy", "seed:2222") share entries and the seed is the one the planner decodes with.
    ``options``: the options the audio is made with (``instructions`` applied; default
    ``req.to_options()``); ``voices``: the ``cache_id`` of every other voice it speaks in.
    ``weights_id`` identifies the weights and the engine code version. ``scope``: whose entries
    these are (the caller's owner when hits are not shared across keys; "" when they are).
    """
    opts = options if options is not None else req.to_options()
    doc = {
        "v": int(version),
        "request": _canon(req.model_dump(mode="json", exclude=set(NOT_IN_KEY))),
        "options": _canon(opts.model_dump(mode="json", exclude=_OPTIONS_NOT_IN_KEY)),
        "voice": voice.cache_id,
        "seed": effective_seed(voice, opts.seed),
        "voices": list(voices),  # the other voices a script speaks in (SSML <voice>, a dialogue's turns)
        # The lexicon applied (the request's or the key's default), by content: a lexicon made again
        # with other entries, or a new default, never answers with the old audio.
        "lexicon": opts.pronunciations.content_hash if getattr(opts, "pronunciations", None) else None,
        "weights": weights_id,
        "scope": scope,
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return f"{KEY_PREFIX}:v{int(version)}:{hashlib.sha256(blob).hexdigest()}"


def jittered_ttl(ttl_s: float, jitter: float, rng: random.Random | Any = random) -> float:
    """ttl * uniform(1 - jitter, 1 + jitter): entries written together (a burst, a warm-up) then
    expire spread out instead of all at once (cache avalanche)."""
    return ttl_s * rng.uniform(1.0 - jitter, 1.0 + jitter) if jitter else ttl_s


def _check_ttl(ttl_s: float, jitter: float) -> None:
    if ttl_s <= 0:
        raise ValueError("ttl_s must be > 0")
    if not 0.0 <= jitter < 1.0:
        raise ValueError("jitter must be in [0, 1)")


# ---------------------------------------------------------------------------------------------
# Backends
# ---------------------------------------------------------------------------------------------


class AudioCache(ABC):
    """Async key -> audio bytes store. Never raises for backend trouble: a failure is a miss."""

    @abstractmethod
    async def get(self, key: str) -> Optional[bytes]: ...

    @abstractmethod
    async def put(self, key: str, data: bytes) -> None: ...

    async def close(self) -> None:
        return None

    @abstractmethod
    def stats(self) -> dict[str, Any]: ...


class NullCache(AudioCache):
    """Caching disabled: every lookup misses, nothing is stored."""

    def __init__(self) -> None:
        self.misses = 0

    async def get(self, key: str) -> Optional[bytes]:
        self.misses += 1
        return None

    async def put(self, key: str, data: bytes) -> None:
        return None

    def stats(self) -> dict[str, Any]:
        return {"backend": "none", "hits": 0, "misses": self.misses, "errors": 0, "entries": 0, "bytes": 0}


def _entry_bytes(entry: tuple[bytes, float]) -> int:
    return len(entry[0])


class _CountingTLRU(TLRUCache):
    """cachetools' TLRUCache over ``(data, expires_at)`` entries that counts what it drops and
    can read an entry without making it the most recent."""

    def __init__(self, max_bytes: int, timer: Callable[[], float]):
        # Each entry carries its own (jittered) expiry, so ttl() can read it back.
        super().__init__(max_bytes, ttu=lambda _key, entry, _now: entry[1], timer=timer, getsizeof=_entry_bytes)
        self.evictions = self.expired = 0

    def expire(self, time: Optional[float] = None) -> list:
        gone = super().expire(time)
        self.expired += len(gone)
        return gone

    def popitem(self) -> tuple:
        # Cache.__setitem__ calls this to make room, after expire() dropped what had expired:
        # what goes here is the least recently used live entry.
        item = super().popitem()
        self.evictions += 1
        return item

    def peek(self, key: str) -> Optional[tuple[bytes, float]]:
        with self.timer:
            return Cache.__getitem__(self, key) if key in self else None


class MemoryCache(AudioCache):
    """In-process LRU under a byte budget, with a jittered TTL per entry.

    cachetools' TLRUCache keeps the recency order and the byte budget (evicting expired entries
    before live ones); a lock makes it safe from several threads (Serve replicas may call from a
    thread pool) as well as from one event loop.
    """

    def __init__(
        self,
        max_bytes: int,
        ttl_s: float,
        jitter: float = 0.1,
        max_item_bytes: Optional[int] = None,
        clock: Callable[[], float] = time.monotonic,
        rng: Optional[random.Random] = None,
    ):
        if max_bytes <= 0:
            raise ValueError("max_bytes must be > 0")
        _check_ttl(ttl_s, jitter)
        self.max_bytes = int(max_bytes)
        self.max_item_bytes = min(int(max_item_bytes), self.max_bytes) if max_item_bytes else self.max_bytes
        self.ttl_s = float(ttl_s)
        self.jitter = float(jitter)
        self._clock = clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._items = _CountingTLRU(self.max_bytes, clock)  # key -> (data, expires_at)
        self.hits = self.misses = self.skipped = 0

    @property
    def evictions(self) -> int:
        return self._items.evictions

    @property
    def expired(self) -> int:
        """Entries dropped because their TTL passed (purged on a miss, a write or stats())."""
        return self._items.expired

    # Sync API (for threads); the async API below just wraps it: nothing here blocks.
    def get_sync(self, key: str) -> Optional[bytes]:
        with self._lock:
            entry = self._items.get(key)  # None when absent or expired
            if entry is None:
                self._items.expire()  # frees an expired entry now, not at the next write
                self.misses += 1
                return None
            self.hits += 1
            return entry[0]

    def put_sync(self, key: str, data: bytes) -> None:
        size = len(data)
        if size > self.max_item_bytes:
            # One huge response must not flush the whole cache.
            self.skipped += 1
            return
        data = bytes(data)  # an immutable copy: callers may reuse their buffer
        # The timer context freezes the clock: the expiry and the cache's purge see one instant.
        with self._lock, self._items.timer as now:
            # Replacing is not an eviction: drop the old entry before room is made for the new.
            self._items.pop(key, None)
            self._items[key] = (data, now + jittered_ttl(self.ttl_s, self.jitter, self._rng))

    def ttl(self, key: str) -> Optional[float]:
        """Seconds until ``key`` expires (None if absent); does not touch recency or stats."""
        with self._lock, self._items.timer as now:
            entry = self._items.peek(key)
            return None if entry is None else entry[1] - now

    async def get(self, key: str) -> Optional[bytes]:
        return self.get_sync(key)

    async def put(self, key: str, data: bytes) -> None:
        self.put_sync(key, data)

    async def close(self) -> None:
        with self._lock:
            self._items.clear()

    def stats(self) -> dict[str, Any]:
        with self._lock:
            self._items.expire()
            return {
                "backend": "memory",
                "hits": self.hits,
                "misses": self.misses,
                "errors": 0,
                "entries": len(self._items),
                "bytes": self._items.currsize,
                "max_bytes": self.max_bytes,
                "evictions": self.evictions,
                "expired": self.expired,
                "skipped": self.skipped,
            }


class RedisCache(AudioCache):
    """Shared cache in Redis (``redis.asyncio``) for many replicas and nodes.

    Redis is an optimisation, never a dependency: every failure (refused, timeout, server gone)
    becomes a miss or a skipped put and is counted. After a failure the circuit breaker opens for
    ``backoff_s``: calls skip Redis at once instead of each paying ``timeout_s``. Then one call
    probes (the others keep skipping); success closes the breaker, failure re-opens it.
    Expiry is Redis's own (SET PX with a jittered TTL), so there is no LRU bookkeeping here:
    configure ``maxmemory`` + ``allkeys-lru`` on the server for a size bound.
    """

    def __init__(
        self,
        url: str,
        ttl_s: float,
        jitter: float = 0.1,
        timeout_s: float = 0.2,
        max_item_bytes: Optional[int] = 16 * MiB,
        backoff_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rng: Optional[random.Random] = None,
    ):
        _check_ttl(ttl_s, jitter)
        self.url = url
        self.ttl_s = float(ttl_s)
        self.jitter = float(jitter)
        self.timeout_s = float(timeout_s)
        self.max_item_bytes = max_item_bytes
        self.backoff_s = float(backoff_s)
        self._rng = rng or random.Random()
        # No client-side retries: the breaker decides when Redis is tried again.
        self._redis = open_redis(url, self.timeout_s, fail_fast=True)
        # Hard per-call deadline: connect + command + a large value's transfer, whatever the
        # socket timeouts do.
        self._deadline_s = 3 * self.timeout_s
        self._breaker = CircuitBreaker("redis cache", safe_url(url), self.backoff_s, clock, logger=log)
        self.hits = self.misses = self.errors = self.skipped = self.puts = 0

    def _fail(self, op: str, exc: BaseException) -> None:
        self.errors += 1
        self._breaker.failed(op, exc)

    async def get(self, key: str) -> Optional[bytes]:
        if not self._breaker.allow():
            self.skipped += 1
            self.misses += 1
            return None
        try:
            data = await asyncio.wait_for(self._redis.get(key), self._deadline_s)
        except Exception as exc:  # noqa: BLE001 - any failure is a miss (CancelledError still propagates)
            self._fail("get", exc)
            self.misses += 1
            return None
        self._breaker.succeeded()
        if data is None:
            self.misses += 1
            return None
        self.hits += 1
        return bytes(data)

    async def put(self, key: str, data: bytes) -> None:
        if self.max_item_bytes is not None and len(data) > self.max_item_bytes:
            self.skipped += 1
            return
        if not self._breaker.allow():
            self.skipped += 1
            return
        ttl_ms = max(1, int(jittered_ttl(self.ttl_s, self.jitter, self._rng) * 1000))
        try:
            await asyncio.wait_for(self._redis.set(key, bytes(data), px=ttl_ms), self._deadline_s)
        except Exception as exc:  # noqa: BLE001
            self._fail("put", exc)
            return
        self._breaker.succeeded()
        self.puts += 1

    async def close(self) -> None:
        try:
            await self._redis.aclose()
        except Exception:  # noqa: BLE001 - closing a dead connection is not an error worth raising
            pass

    def stats(self) -> dict[str, Any]:
        return {
            "backend": "redis",
            "hits": self.hits,
            "misses": self.misses,
            "errors": self.errors,
            "skipped": self.skipped,
            "puts": self.puts,
            "breaker_open": self._breaker.is_open,
        }


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------


def _memory_cache(cfg: CacheConfig) -> AudioCache:
    return MemoryCache(cfg.max_bytes, cfg.ttl_s, cfg.jitter, max_item_bytes=cfg.max_item_bytes)


def _redis_cache(cfg: CacheConfig) -> AudioCache:
    assert cfg.redis_url is not None
    return RedisCache(
        cfg.redis_url,
        cfg.ttl_s,
        cfg.jitter,
        timeout_s=cfg.redis_timeout_s,
        max_item_bytes=cfg.max_item_bytes,
        backoff_s=cfg.redis_backoff_s,
    )


_BACKENDS = {"memory": _memory_cache, "redis": _redis_cache, "none": lambda _cfg: NullCache()}


def make_cache(cfg: CacheConfig) -> AudioCache:
    return open_store(_BACKENDS, cfg)
