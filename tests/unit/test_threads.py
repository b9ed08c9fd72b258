"""serve_app/engine/threads.py: where torch work runs (one OpenMP team per process)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading

import pytest
import torch

from serve_app.engine.threads import TorchThread, on_new_thread


def test_on_new_thread_returns_and_raises_on_the_caller():
    caller = threading.get_ident()
    ident, value = on_new_thread(lambda x: (threading.get_ident(), x * 2), 21)
    assert value == 42 and ident != caller

    def boom():
        raise ValueError("bad weights")

    with pytest.raises(ValueError, match="bad weights"):
        on_new_thread(boom)


def test_on_new_thread_exits_so_its_openmp_team_goes_with_it():
    seen = []
    on_new_thread(lambda: seen.append(threading.current_thread()))
    seen[0].join(timeout=5)
    assert not seen[0].is_alive()


def test_torch_thread_runs_everything_on_one_thread_with_its_own_thread_count():
    before = torch.get_num_threads()
    worker = TorchThread("test", threads=1)
    try:
        idents = {worker.call(threading.get_ident) for _ in range(5)}

        async def many():
            return await asyncio.gather(*(worker.acall(threading.get_ident) for _ in range(5)))

        idents |= set(asyncio.run(many()))
        assert len(idents) == 1 and threading.get_ident() not in idents
        assert worker.call(torch.get_num_threads) == 1
        assert worker.call(torch.is_grad_enabled) is False
        with pytest.raises(ZeroDivisionError):
            worker.call(lambda: 1 / 0)
        assert worker.call(lambda: 3) == 3  # the thread survives a failed call
    finally:
        worker.shutdown()
        torch.set_num_threads(before)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _queued_order(worker: TorchThread, clock: FakeClock, calls: list) -> list[str]:
    """Hold the thread with a first call, queue ``calls`` ((name, slack or None, time queued)),
    release it at the clock's time then, and the names in the order they ran."""
    ran: list[str] = []
    gate = threading.Event()
    started = threading.Event()
    blocker = worker.submit(lambda: (started.set(), gate.wait(10)))
    assert started.wait(10)
    futures = []
    for name, slack, at in calls:
        clock.t = at
        futures.append(worker.submit_within(slack, ran.append, name))
    gate.set()
    blocker.result(timeout=10)
    for f in futures:
        f.result(timeout=10)
    return ran


def test_torch_thread_runs_least_slack_first_then_calls_without_one_in_order():
    """A Vocoder window of a stream about to run dry goes before one far ahead and before work
    without a deadline (a voice encoding); equal deadlines keep the order they came in."""
    clock = FakeClock()
    worker = TorchThread("order", threads=1, clock=clock)
    try:
        order = _queued_order(
            worker,
            clock,
            [
                ("untimed-1", None, 100.0),
                ("far", 5.0, 100.0),
                ("late", -0.5, 100.0),
                ("soon", 0.5, 100.0),
                ("untimed-2", None, 100.0),
                ("soon-again", 0.5, 100.0),
                ("same-deadline", 0.25, 100.25),
            ],
        )
        assert order == ["late", "soon", "soon-again", "same-deadline", "far", "untimed-1", "untimed-2"]
        # Without slacks it is FIFO, as before.
        assert _queued_order(worker, clock, [(str(i), None, 100.0) for i in range(5)]) == list("01234")
    finally:
        worker.shutdown()


def test_a_call_without_a_deadline_is_not_starved_by_a_stream_of_late_ones():
    """Once a call without a slack has waited UNTIMED_WAIT_S it is due since then: calls queued
    later, however late their streams (a slack floored at LATE_FLOOR_S), run after it."""
    from serve_app.engine.threads import LATE_FLOOR_S, UNTIMED_WAIT_S

    clock = FakeClock()
    worker = TorchThread("starve", threads=1, clock=clock)
    try:
        later = 100.0 + UNTIMED_WAIT_S - LATE_FLOOR_S + 0.1  # due after the untimed call, even at -1000 s
        calls = [("untimed", None, 100.0), ("late-early", -1000.0, 100.0), ("late-later", -1000.0, later)]
        # Released before the untimed call has waited its time: the late calls go first ...
        assert _queued_order(worker, clock, [calls[0], calls[1]]) == ["late-early", "untimed"]
        # ... and once it has (the clock at release is past its wait), it goes before any call due later.
        assert _queued_order(worker, clock, calls) == ["late-early", "untimed", "late-later"]
    finally:
        worker.shutdown()


def test_torch_thread_shutdown_drops_queued_calls_and_refuses_new_ones():
    worker = TorchThread("stop", threads=1)
    gate, started = threading.Event(), threading.Event()
    running = worker.submit(lambda: (started.set(), gate.wait(10))[1])
    assert started.wait(10)
    queued = worker.submit_within(0.0, lambda: 1)
    worker.shutdown()
    gate.set()
    assert running.result(timeout=10) is True
    assert queued.cancelled()
    with pytest.raises(RuntimeError, match="shutdown"):
        worker.submit(lambda: 1)


# Run in a process of its own: two torch threads (the suite's processes use one, which makes no
# team at all) and a thread count no other test has moved.
_ENGINE_BUILT_HERE = """
import os, sys, time
from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import AcousticConfig, ModelConfig, WeightsConfig
from serve_app.engine.threads import on_new_thread
from serve_app.engine.weights.loading import load_model

def threads():
    # Settled: a thread that has returned, and its team's workers, leave a moment later.
    last, same = -1, 0
    while same < 3:
        n = len(os.listdir("/proc/self/task"))
        same, last = (same + 1 if n == last else 0), n
        time.sleep(0.1)
    return last

cfg = ModelConfig(weights=WeightsConfig(source="random-tiny", cache_dir=sys.argv[1]), device="cpu", torch_threads=2)
model = on_new_thread(load_model, cfg)  # as every stage loads it
before = threads()
engine = AcousticEngine(model, AcousticConfig())
print(before, threads())
"""


def _thread_counts(script: str, weights) -> list[int]:
    """The thread counts ``script`` prints, run in a process of its own with two torch threads."""
    from serve_app.engine.weights.sources import resolve_weights

    resolve_weights(weights)  # built (or found) here, not timed in the child
    out = subprocess.run(
        [sys.executable, "-c", script, weights.cache_dir],
        env={**os.environ, "OMP_NUM_THREADS": "2"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return [int(n) for n in out.stdout.split()]


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_an_engine_built_on_a_long_lived_thread_leaves_it_no_openmp_team(tiny_weights_config):
    """A replica builds its engine on its init thread, which lives on: whatever the engine
    computes there (the heads' weight norm, dual-layout copies) must not give that thread an
    OpenMP team, or the process holds two and the decode thread's every barrier sleeps on a
    futex (libgomp throttles its spin once its threads outnumber the CPUs): the Acoustic replica
    decoded at about half its in-process speed. A team shows as libgomp's worker threads."""
    before, after = _thread_counts(_ENGINE_BUILT_HERE, tiny_weights_config)
    assert after == before, f"building the engine left {after - before} thread(s) behind"


_PIPELINE_BUILT_HERE = (
    _ENGINE_BUILT_HERE.split("cfg = ")[0]
    + """
from serve_app.engine.config import EngineConfig
from serve_app.engine.types import SynthesisOptions
from serve_app.pipeline.local import LocalPipeline

cfg = ModelConfig(weights=WeightsConfig(source="random-tiny", cache_dir=sys.argv[1]), device="cpu", torch_threads=2)
model = on_new_thread(load_model, cfg)  # (the tokenizer's own pool starts here)
before = threads()
pipeline = LocalPipeline.from_config(EngineConfig(model=cfg), model=model)
built = threads()
import asyncio

async def speak():
    plan = await pipeline.plan("Hello there.", SynthesisOptions())
    await pipeline.speak(plan, "wav")

asyncio.run(speak())
print(before, built, threads())
"""
)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_an_in_process_pipeline_keeps_one_openmp_team(tiny_weights_config):
    """``LocalPipeline.from_config`` (bulk synthesis's actors, the CLI's ``say``) builds on the
    caller's thread, which lives on: it must start the decode thread and the vocoder thread and
    nothing else, and speaking gives the decode thread its team (one worker beside it, with two
    torch threads) and the single-threaded vocoder none. The vocoder built on the caller's thread
    left it a team, and bulk synthesis decoded a third slower."""
    before, built, spoken = _thread_counts(_PIPELINE_BUILT_HERE, tiny_weights_config)
    assert (built - before, spoken - before) == (2, 3), (before, built, spoken)
