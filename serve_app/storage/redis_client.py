"""The one way the stores open Redis, and the circuit breaker the response cache puts in front of it.

Every store that can live in Redis (the response cache, voices, lexicons, job states) builds its
client with ``open_redis``: the URL, one timeout for connecting and for each command, and either
redis-py's own retries (the stores, where a failure is a 503 and a retry may save it) or none
(``fail_fast``: the cache, where a failure is a miss and the breaker decides when to try again).
The async client serves the Ingress's stores; the job runner's state store is sync (``sync=True``:
its calls already run on worker threads).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

__all__ = ["CircuitBreaker", "open_redis", "safe_url"]


def open_redis(url: str, timeout_s: float, *, sync: bool = False, fail_fast: bool = False) -> Any:
    """A Redis client for ``url`` (``redis.asyncio.Redis``; ``sync``: ``redis.Redis``) whose connect
    and every command time out after ``timeout_s``. ``fail_fast``: no client-side retries and no
    health checks (redis-py >= 6 retries 3x by default), for a caller that treats a failure as a
    miss. Imported here so that a module using another backend never needs the client."""
    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if sync:
        import redis

        client_cls = redis.Redis
        from redis.retry import Retry
    else:
        from redis.asyncio import Redis as client_cls  # noqa: N813 - the class, under one name for both
        from redis.asyncio.retry import Retry
    if fail_fast:
        from redis.backoff import NoBackoff

        options.update(retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
    return client_cls.from_url(url, **options)


def safe_url(url: str) -> str:
    """``url`` without its credentials, for logs."""
    return url.split("@")[-1]


class CircuitBreaker:
    """After a failure, skip the backend for ``backoff_s`` instead of paying its timeout on every
    call; then let one call probe (the others keep skipping): success closes the breaker, failure
    opens it again. One warning per outage, one line when it is back. Not thread-safe: one event
    loop's calls (a replica's)."""

    def __init__(
        self,
        what: str,
        where: str,
        backoff_s: float,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger = log,
    ):
        self.log = logger  # the store's own logger: its lines keep their name
        self.what = what  # "redis cache": how the log names the backend
        self.where = where  # its address, without credentials
        self.backoff_s = float(backoff_s)
        self._clock = clock
        self._open_until = 0.0  # skip the backend until this clock time; 0: closed

    @property
    def is_open(self) -> bool:
        return self._open_until != 0.0

    def allow(self) -> bool:
        """Whether this call may use the backend (closed, or the half-open probe)."""
        if self._open_until == 0.0:
            return True
        now = self._clock()
        if now < self._open_until:
            return False
        self._open_until = now + self.backoff_s  # half-open: this call probes, others skip
        return True

    def succeeded(self) -> None:
        if self._open_until:
            self.log.info("%s at %s is back", self.what, self.where)
        self._open_until = 0.0

    def failed(self, op: str, exc: BaseException) -> None:
        if self._open_until == 0.0:  # log once per outage, not once per request
            self.log.warning(
                "%s %s failed (%s: %s); skipping redis for %.1fs",
                self.what,
                op,
                type(exc).__name__,
                exc,
                self.backoff_s,
            )
        self._open_until = self._clock() + self.backoff_s
