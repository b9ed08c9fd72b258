"""A job submission's work off the event loop, on the jobs' own threads.

Everything proportional to a submission's size (its body, script, cutting and plan) runs here, a
bounded piece per call, on an executor of the jobs' own (``jobs.max_submissions_at_once``
threads, each with its own planner: no key's submission waits behind another's on a shared lock,
and none waits behind the rest of the Ingress's work in the loop's default pool). When the
submission is cancelled (its client left), the call in flight is told (``cancelled``: the planner
checks it at every chunk) and awaited before the cancellation goes on: the key's submission slot,
released by the caller on its way out, is never free while work of that submission still runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")


class SubmissionCancelled(Exception):
    """Raised in a submission's work once its submission was cancelled (its client left)."""


class SubmissionWork:
    def __init__(self, executor: concurrent.futures.Executor):
        self._executor = executor
        self.cancelled = threading.Event()

    def check(self) -> None:
        """In the work: stop here if the submission was cancelled."""
        if self.cancelled.is_set():
            raise SubmissionCancelled()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the jobs' executor; a cancellation waits for it (told to stop) first."""
        future = asyncio.get_running_loop().run_in_executor(self._executor, functools.partial(fn, *args))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            self.cancelled.set()
            try:
                await future
            except BaseException:  # noqa: BLE001 - it stopped (SubmissionCancelled) or failed: over either way
                pass
            raise
