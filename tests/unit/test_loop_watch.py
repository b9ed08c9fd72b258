"""The event-loop watch (serve_app/http/loop_watch.py): a loop held by synchronous work is seen,
measured and warned about once; a free loop shows nothing."""

from __future__ import annotations

import asyncio
import logging
import time

from serve_app.http.loop_watch import LoopWatch, LoopWatchMiddleware


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_a_held_loop_is_measured_and_warned_about_once(caplog):
    watch = LoopWatch("test", interval_s=0.01, warn_s=0.1).start()
    await asyncio.sleep(0.1)
    assert watch.longest_busy_s < 0.1  # a free loop
    with caplog.at_level(logging.WARNING, logger="serve_app.http.loop_watch"):
        _spin(0.25)  # synchronous work on the loop: every task waits
        await asyncio.sleep(0.05)
        _spin(0.15)
        await asyncio.sleep(0.05)
    watch.stop()
    assert 0.2 <= watch.longest_s < 1.0
    assert watch.stalls >= 2  # (a loaded host may add a late wake of its own)
    warnings = [r.getMessage() for r in caplog.records if "stood still" in r.getMessage()]
    assert len(warnings) == 1  # at most one a warn_every_s
    reported_ms = float(warnings[0].split("stood still for ")[1].split(" ms")[0])
    longest, busy = watch.reset()
    assert reported_ms >= 100 and longest * 1e3 >= reported_ms - 1 and watch.longest_s == 0.0  # (printed rounded)
    assert busy >= 0.15  # the process itself ran through most of it (a busy CI box may take some)


def test_a_late_wake_without_the_process_running_is_not_busy():
    """A host with every core taken wakes the ticker late though nothing held the loop."""
    watch = LoopWatch("test")
    watch.record(0.3, cpu_s=0.01)  # 300 ms late, the process ran 10 ms of it
    watch.record(0.12, cpu_s=0.15)  # held: the process ran throughout
    assert watch.longest_s == 0.3 and watch.longest_busy_s == 0.12


async def test_the_proxys_watch_starts_with_its_first_request():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["path"])

    mw = LoopWatchMiddleware(app)
    assert mw.watch._task is None  # built before the proxy's loop runs: nothing started
    await mw({"type": "http", "path": "/x"}, None, None)
    await mw({"type": "http", "path": "/y"}, None, None)
    assert seen == ["/x", "/y"] and mw.watch._task is not None and not mw.watch._task.done()
    mw.watch.stop()
