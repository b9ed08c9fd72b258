"""Waiting for state nobody can be notified of (a server answering, a replica's counters, a log
line, processes gone): poll until a condition holds, up to a deadline. The one wait of the bench
and the tests (tests/support/waiting.py re-exports it).

It returns as soon as the condition holds, so the timeout can be generous without slowing a
passing run; a sleep sized to some internal interval is either too short on a loaded box (flaky)
or longer than needed everywhere else.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, TypeVar, Union

T = TypeVar("T")
# What is awaited, for the failure message; a callable is called at the timeout (say, for stats).
What = Union[str, Callable[[], str]]


class NotMet(AssertionError, TimeoutError):
    """A condition not met in time: a failed assertion to a test, a timeout to the bench."""


def _not_met(what: What, timeout_s: float, last: object) -> NotMet:
    text = what() if callable(what) else what
    return NotMet(f"{text}: not met within {timeout_s:g} s (last: {last!r})")


def wait_until(
    probe: Callable[[], T],
    timeout_s: float,
    interval_s: float = 0.1,
    *,
    until: Callable[[T], Any] = bool,
    what: What = "condition",
    retry_on: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``probe`` every ``interval_s`` until ``until(value)`` holds; return that value. An
    exception of ``retry_on`` from the probe counts as not yet (a server still starting).

    ``NotMet`` with the last value after ``timeout_s`` (probed once more at the deadline).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            last = probe()
        except retry_on as exc:
            last = exc
        else:
            if until(last):
                return last
        if time.monotonic() >= deadline:
            raise _not_met(what, timeout_s, last)
        time.sleep(interval_s)


def holds_within(pred: Callable[[], Any], timeout_s: float, interval_s: float = 0.5) -> bool:
    """``wait_until`` as a yes or no: whether ``pred`` came true within ``timeout_s``."""
    try:
        wait_until(pred, timeout_s, interval_s)
        return True
    except NotMet:
        return False


async def wait_until_async(
    probe: Callable[[], Awaitable[T]],
    timeout_s: float,
    interval_s: float = 0.1,
    *,
    until: Callable[[T], Any] = bool,
    what: What = "condition",
) -> T:
    """``wait_until`` for a coroutine probe, awaited on the running loop (the waiting does not
    block it: the caller's other tasks keep running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = await probe()
        if until(last):
            return last
        if time.monotonic() >= deadline:
            raise _not_met(what, timeout_s, last)
        await asyncio.sleep(interval_s)
