"""The event-loop watch (serve_app/http/loop_watch.py): a loop held by synchronous work is seen,
measured and warned about once; a free loop shows nothing."""

from __future__ import annotations

import asyncio
import logging
import time

from serve_app.http.loop_watch import LoopWatch


async def test_a_held_loop_is_measured_and_warned_about_once(caplog):
    watch = LoopWatch("test", interval_s=0.01, warn_s=0.1).start()
    await asyncio.sleep(0.1)
    assert watch.longest_s < 0.1  # a free loop (a busy CI box may add a few ms)
    with caplog.at_level(logging.WARNING, logger="serve_app.http.loop_watch"):
        time.sleep(0.25)  # synchronous work on the loop: every task waits
        await asyncio.sleep(0.05)
        time.sleep(0.15)
        await asyncio.sleep(0.05)
    watch.stop()
    assert 0.2 <= watch.longest_s < 1.0
    assert watch.stalls == 2
    warnings = [r.getMessage() for r in caplog.records if "stood still" in r.getMessage()]
    assert len(warnings) == 1  # at most one a warn_every_s
    reported_ms = float(warnings[0].split("stood still for ")[1].split(" ms")[0])
    longest = watch.reset()
    assert abs(longest * 1e3 - reported_ms) < 1.0 and watch.longest_s == 0.0  # the first stall was the longest
