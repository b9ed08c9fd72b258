"""How long an event loop stood still: a ticker that asks to wake every ``interval_s`` and measures
how late it woke. Whatever ran on the loop in between (a parse, a regex, a JSON dump of a large
answer) held every other request of the process for that long.

One per process that serves requests: the Ingress replica and Serve's HTTP proxy (its hooks,
``front_guard.middlewares``). The longest stall is kept (``longest_s``, ``/metrics`` as
``tts_event_loop_stall_seconds``), and a stall above ``warn_s`` logs one WARNING (at most one a
``warn_every_s``): a stall names no request, but its time finds it in the request log.

A late wake has two causes: work that held the loop (or the GIL), or a host whose cores were all
taken and did not run the process. ``longest_busy_s`` keeps the first apart: the lateness up to
the CPU time the process itself spent meanwhile (any of its threads: one holding the GIL counts).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Callable, Optional

from .. import metrics

log = logging.getLogger(__name__)

STALL_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]


def _histogram() -> Optional[Callable[[float, str], None]]:
    """``tts_event_loop_stall_seconds{process}`` where a metrics backend is installed (a replica or
    the proxy: ``serve_app/metrics.py``)."""
    try:
        h = metrics.custom(
            "histogram",
            "tts_event_loop_stall_seconds",
            "How late an event loop's ticker woke (stalls over 5 ms).",
            ("process",),
            STALL_BUCKETS,
        )
        if h is metrics.NULL:
            return None
        return lambda seconds, process: h.observe(seconds, tags={"process": process})
    except Exception:  # noqa: BLE001 - outside a Ray worker the backend cannot make one
        return None


class LoopWatch:
    """Start with ``start()`` from the loop to watch (or ``ensure_started()`` from a request)."""

    def __init__(
        self,
        process: str,
        interval_s: float = 0.02,
        warn_s: float = 0.1,
        warn_every_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.process = process
        self.interval_s = interval_s
        self.warn_s = warn_s
        self.warn_every_s = warn_every_s
        self.clock = clock
        self.longest_s = 0.0
        self.longest_busy_s = 0.0
        self.stalls = 0  # ticks later than warn_s
        self._task: Optional[asyncio.Task] = None
        self._observe = None
        self._warned_at = float("-inf")

    def start(self) -> "LoopWatch":
        if self._task is None or self._task.done():
            self._observe = _histogram()
            # get_event_loop: a replica's constructor runs before its loop does (as other replica tasks start)
            self._task = asyncio.get_event_loop().create_task(self._run())
        return self

    def ensure_started(self) -> None:
        """From code that runs on the loop (a request), in processes whose start-up does not."""
        if self._task is None:
            self.start()

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def reset(self) -> tuple[float, float]:
        """The longest stall and longest busy stall since the last reset (or the start); start over."""
        out = (self.longest_s, self.longest_busy_s)
        self.longest_s = self.longest_busy_s = 0.0
        return out

    async def _run(self) -> None:
        while True:
            due = self.clock() + self.interval_s
            cpu = time.process_time()
            await asyncio.sleep(self.interval_s)
            self.record(self.clock() - due, time.process_time() - cpu)

    def record(self, late_s: float, cpu_s: float = float("inf")) -> None:
        if late_s <= 0.005:  # the timer's own jitter
            return
        self.longest_s = max(self.longest_s, late_s)
        self.longest_busy_s = max(self.longest_busy_s, min(late_s, cpu_s))
        if self._observe is not None:
            self._observe(late_s, self.process)
        if late_s >= self.warn_s:
            self.stalls += 1
            now = self.clock()
            if now - self._warned_at >= self.warn_every_s:
                self._warned_at = now
                log.warning(
                    "the %s's event loop stood still for %.0f ms (every request it holds waited; the process "
                    "ran %.0f ms of it); longest so far %.0f ms",
                    self.process,
                    late_s * 1e3,
                    min(late_s, cpu_s) * 1e3,
                    self.longest_s * 1e3,
                )


class LoopWatchMiddleware:
    """ASGI middleware that starts a ``LoopWatch`` on the first request: for Serve's HTTP proxy,
    whose hooks are built before its loop runs (``front_guard.middlewares``)."""

    def __init__(self, app, process: str = "proxy"):
        self.app = app
        self.watch = LoopWatch(process)

    async def __call__(self, scope, receive, send) -> None:
        self.watch.ensure_started()
        await self.app(scope, receive, send)
