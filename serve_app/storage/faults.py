"""What a store's failure is, for every store (records, the job store): a write that found no room,
and a fault that passes (worth waiting out and trying the same call again).

Known by the exception's type alone, and Redis' errors by their class names, so that this module
imports no client (a store on another backend never needs redis-py)."""

from __future__ import annotations

import errno

__all__ = ["out_of_space", "passing_fault"]

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


def passing_fault(exc: BaseException) -> bool:
    """A store call that failed for a while, not for what it asked: no room (an operator makes
    some), the disk or network store failing an I/O (``OSError``: a mount gone, a timeout), Redis
    stopped or restarting. The same call may work later; anything else (a bug, a refusal) will not."""
    return isinstance(exc, OSError) or out_of_space(exc) or _named(exc, _REDIS_PASSING)
