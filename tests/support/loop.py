"""The event loop's longest stall while a block runs (``Watched``), for tests without Ray that
hold a route's work to the rule: linear and bounded on the loop, or off it."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from serve_app.http.loop_watch import LoopWatch

STALL_LIMIT_S = 0.1  # the Ingress's LoopWatch warns past it


class Watched:
    """The loop's longest stall while the block runs, while this process itself ran
    (``LoopWatch.longest_busy_s``: a host whose cores are taken wakes the ticker late too).

    The test process's own heap is collected first: with torch, Ray and the earlier tests'
    objects in it, one full collection walks it for ~190 ms with the GIL held, and one that
    happened to fall due inside the block measured the test worker, not the work."""

    def __init__(self) -> None:
        self.watch = LoopWatch("test", interval_s=0.005)

    @property
    def longest(self) -> float:
        return self.watch.longest_busy_s

    async def __aenter__(self) -> "Watched":
        gc.collect()
        self.watch.start()
        await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.watch.stop()
