"""Waiting in tests: poll until a condition holds, up to a deadline.

For state a test cannot be notified of (a replica's counters, a log file, what a running server
currently answers). It returns as soon as the condition holds, so the timeout can be generous
without slowing a passing run; a sleep sized to some internal interval is either too short on a
loaded box (flaky) or longer than needed everywhere else.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, TypeVar, Union

T = TypeVar("T")
# What is awaited, for the failure message; a callable is called at the timeout (say, for stats).
What = Union[str, Callable[[], str]]


def _timed_out(what: What, timeout_s: float, last: object) -> AssertionError:
    text = what() if callable(what) else what
    return AssertionError(f"{text}: not met within {timeout_s:g} s (last: {last!r})")


def wait_until(
    probe: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.1,
    *,
    until: Callable[[T], Any] = bool,
    what: What = "condition",
) -> T:
    """Call ``probe`` every ``interval_s`` until ``until(value)`` holds; return that value.

    AssertionError with the last value after ``timeout_s`` (probed once more at the deadline).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        last = probe()
        if until(last):
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, last)
        time.sleep(interval_s)


async def wait_until_async(
    probe: Callable[[], Awaitable[T]],
    timeout_s: float,
    interval_s: float = 0.1,
    *,
    until: Callable[[T], Any] = bool,
    what: What = "condition",
) -> T:
    """``wait_until`` for a coroutine probe, awaited on the running loop (the waiting does not
    block it: the test's other tasks keep running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = await probe()
        if until(last):
            return last
        if time.monotonic() >= deadline:
            raise _timed_out(what, timeout_s, last)
        await asyncio.sleep(interval_s)
