"""The one Redis client factory every store uses (``open_redis``) and the circuit breaker in front
of the response cache's Redis; a real ``redis-server`` (skipped without one)."""

from __future__ import annotations

import logging

import pytest
from support.redis_server import needs_redis  # noqa: F401 - the marker's module registers redis_server

from serve_app.settings import JobsConfig, LexiconStoreConfig, VoiceStoreConfig
from serve_app.storage.jobs.redis_states import RedisStates
from serve_app.storage.lexicons import make_lexicon_store
from serve_app.storage.redis_client import CircuitBreaker, open_redis
from serve_app.storage.voices import make_voice_store


async def test_the_clients_the_stores_open(redis_server):
    import redis
    import redis.asyncio

    fast = open_redis(redis_server.url, 0.25, fail_fast=True)
    kind = fast.connection_pool.connection_kwargs
    assert isinstance(fast, redis.asyncio.Redis)
    assert kind["socket_timeout"] == kind["socket_connect_timeout"] == 0.25
    assert kind["retry"].get_retries() == 0 and kind["health_check_interval"] == 0  # the breaker decides
    assert await fast.ping()
    await fast.aclose()
    sync = open_redis(redis_server.url, 0.5, sync=True)
    assert isinstance(sync, redis.Redis) and sync.ping()
    assert sync.connection_pool.connection_kwargs["socket_timeout"] == 0.5
    sync.close()
    # Each Redis store opens its client there, with its config's URL and timeout.
    voices = make_voice_store(VoiceStoreConfig(backend="redis", redis_url=redis_server.url, redis_timeout_s=0.7))
    lexicons = make_lexicon_store(LexiconStoreConfig(backend="redis", redis_url=redis_server.url, redis_timeout_s=0.8))
    states = RedisStates(JobsConfig(redis_url=redis_server.url, redis_timeout_s=0.9))
    timeouts = [s._redis.connection_pool.connection_kwargs["socket_timeout"] for s in (voices, lexicons, states)]
    assert timeouts == [0.7, 0.8, 0.9] and isinstance(states._redis, redis.Redis)
    await voices.close()
    await lexicons.close()


def test_the_breaker_skips_then_probes_once_then_closes(caplog):
    now = [0.0]
    breaker = CircuitBreaker("redis cache", "127.0.0.1:1/0", backoff_s=5, clock=lambda: now[0])
    assert breaker.allow() and not breaker.is_open
    with caplog.at_level(logging.INFO):
        breaker.failed("get", ConnectionError("refused"))
        breaker.failed("put", ConnectionError("refused"))  # one warning per outage
        assert breaker.is_open and not breaker.allow()
        now[0] = 5.0
        assert breaker.allow() and not breaker.allow()  # one probe; the others keep skipping
        breaker.succeeded()
    assert breaker.allow() and not breaker.is_open
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "redis cache get failed (ConnectionError: refused); skipping redis for 5.0s",
        "redis cache at 127.0.0.1:1/0 is back",
    ]


@pytest.mark.parametrize("backend", ["nosuch"])
def test_an_unknown_backend_is_refused_by_name(backend):
    from serve_app.storage.factory import open_store

    with pytest.raises(ValueError, match="nosuch"):
        open_store({"memory": dict}, VoiceStoreConfig(), backend)
