"""What a store's failure is, for every store (records, the job store): a write that found no room,
a fault that passes (worth waiting out and trying the same call again), and what a client is
answered for either (``failure``: 507 with no room, else 503).

Known by the exception's type alone, and Redis' errors by their class names, so that this module
imports no client (a store on another backend never needs redis-py)."""

from __future__ import annotations

import errno

from ..errors import APIError

__all__ = ["failure", "insufficient_storage", "out_of_space", "passing_fault", "store_unavailable"]

# A write that found no room: the disk is full (ENOSPC), a disk quota (EDQUOT), a file size limit
# (EFBIG); Redis past its maxmemory answers OOM (redis-py's OutOfMemoryError).
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# Redis stopped, restarting, loading its data, failing over or slow: redis-py's errors for those.
_REDIS_PASSING = {"ConnectionError", "TimeoutError", "BusyLoadingError", "TryAgainError", "MasterDownError"}


def _named(exc: BaseException, names: set[str]) -> bool:
    return any(c.__name__ in names for c in type(exc).__mro__ if c.__module__.startswith("redis"))


def out_of_space(exc: BaseException) -> bool:
    if isinstance(exc, OSError) and exc.errno in _NO_SPACE:
        return True
    return _named(exc, {"OutOfMemoryError"})


def insufficient_storage(noun: str) -> APIError:
    """507: the ``noun`` store had no room for a write. Nothing was stored; the same request works
    once there is room again."""
    return APIError(
        507,
        f"the {noun} store is out of space; nothing was stored. Retry once an operator has made room",
        type="server_error",
        code="insufficient_storage",
    )


def store_unavailable(noun: str) -> APIError:
    """503: the ``noun`` store failed otherwise (down, restarting, an I/O error); retry shortly."""
    return APIError(
        503,
        f"{noun} store unavailable; retry shortly",
        type="server_error",
        code=f"{noun}_store_unavailable",
        headers={"Retry-After": "2"},
    )


def failure(noun: str, exc: BaseException) -> APIError:
    """What a client is answered when the ``noun`` store failed with ``exc``."""
    return insufficient_storage(noun) if out_of_space(exc) else store_unavailable(noun)


def passing_fault(exc: BaseException) -> bool:
    """A store call that failed for a while, not for what it asked: no room (an operator makes
    some), the disk or network store failing an I/O (``OSError``: a mount gone, a timeout), Redis
    stopped or restarting. The same call may work later; anything else (a bug, a refusal) will not."""
    return isinstance(exc, OSError) or out_of_space(exc) or _named(exc, _REDIS_PASSING)
