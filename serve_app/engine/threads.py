"""Which threads run torch: one multi-threaded OpenMP team per process.

PyTorch on Linux runs its intra-op parallelism on libgomp. Every thread that ever runs a
parallel region keeps its own team of OpenMP threads until it exits, and libgomp counts them all.
Once that count exceeds the CPUs, every team waits at each barrier on a futex instead of
spinning ("throttled" spin), and a GPT forward has a few hundred barriers, so a forward on a
second thread sleeps at nearly every one of them and runs markedly slower than on the thread
that loaded the model (bench/README.md, "Measurements behind code choices"). A Serve replica
hits this by default: ``__init__`` loads the model on one thread and the work runs on another
(the decode thread, ``asyncio.to_thread``'s pool).

So the multi-threaded torch work of a process runs on one long-lived thread (the Acoustic
engine's decode thread, or a ``TorchThread``); set-up runs on a thread that exits
(``on_new_thread``), which frees its team; side work runs with one torch thread (no team).
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import heapq
import itertools
import threading
import time
from typing import Any, Callable, NamedTuple, Optional, TypeVar

T = TypeVar("T")


def apply_torch_threads(n: int) -> None:
    """Give the calling thread ``n`` intra-op threads, for good.

    torch initialises a thread's count lazily, on its first parallel op, from the count set last
    by any thread; reading it first uses up that one-time step, so a later ``set_num_threads``
    elsewhere cannot change this thread's count. (The call also changes the default of threads
    that have not started torch work yet.)"""
    import torch

    torch.get_num_threads()
    torch.set_num_threads(n)


def on_new_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a thread of its own that exits afterwards (frees its OpenMP
    team); returns the result or raises the exception, on the calling thread."""
    result: list = []

    def run() -> None:
        try:
            result.append((True, fn(*args, **kwargs)))
        except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
            result.append((False, exc))

    t = threading.Thread(target=run, name=f"setup-{getattr(fn, '__name__', 'fn')}", daemon=True)
    t.start()
    t.join()
    ok, value = result[0]
    if not ok:
        raise value
    return value


# The order of a TorchThread's calls (``submit_within``): a call's deadline is when it was queued
# plus its slack, floored at LATE_FLOOR_S (a stream long in silence is as late as one just late, so
# a run of them cannot keep other calls waiting for ever). A call without a slack waits behind those
# with one until it has waited UNTIMED_WAIT_S; then it is due since then.
LATE_FLOOR_S = -1.0
UNTIMED_WAIT_S = 1.0


class TorchThread:
    """One thread for a process's (or a component's) torch work: calls run one at a time.
    ``threads`` sets that thread's intra-op threads (None: the process's count); use 1 for side
    work next to a multi-threaded loop, so it adds no OpenMP team.

    Order: calls given a slack (``submit_within`` / ``acall_within``: seconds before the stream
    they serve runs dry, e.g. its listener's ``playback.PlaybackClock.slack``) run earliest deadline
    first (queued at + slack, floored at ``LATE_FLOOR_S``), equal deadlines in the order queued;
    calls without one (``call``, ``submit``, ``acall``) come after those, in the order queued,
    until one has waited ``UNTIMED_WAIT_S``: then it is due since then, so it goes before every
    call due later, and nothing waits for ever. Without slacks, this is plain FIFO. ``clock``: the
    time deadlines are measured on (tests inject one)."""

    def __init__(self, name: str = "torch", threads: Optional[int] = None, clock: Callable[[], float] = time.monotonic):
        self._name = name
        self._threads = threads
        self._clock = clock
        self._ident: Optional[int] = None
        self._cv = threading.Condition()
        self._timed: list[tuple[float, int, _Call]] = []  # heap: (deadline, seq, call)
        self._untimed: collections.deque[tuple[float, int, _Call]] = collections.deque()  # (queued at, seq, call)
        self._seq = itertools.count()
        self._thread: Optional[threading.Thread] = None  # started by the first call
        self._closed = False
        self.busy_s = 0.0  # seconds spent in calls (wall time: what the thread got of the machine, too)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        import torch

        self._ident = threading.get_ident()
        torch.set_grad_enabled(False)
        if self._threads is not None:
            apply_torch_threads(self._threads)
        while True:
            with self._cv:
                while not self._timed and not self._untimed and not self._closed:
                    self._cv.wait()
                if not self._timed and not self._untimed:
                    return  # shut down
                call = self._next()
            if not call.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            t0 = time.perf_counter()
            try:
                result = call.fn(*call.args, **call.kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                call.future.set_exception(exc)
            else:
                call.future.set_result(result)
            finally:
                self.busy_s += time.perf_counter() - t0
            del call

    def _next(self) -> "_Call":
        """The call to run now (under the lock; at least one is queued)."""
        if self._untimed:
            queued, seq, call = self._untimed[0]
            due = queued + UNTIMED_WAIT_S
            if not self._timed or (self._clock() >= due and (due, seq) < self._timed[0][:2]):
                self._untimed.popleft()
                return call
        return heapq.heappop(self._timed)[2]

    def _queue(
        self, slack_s: Optional[float], fn: Callable[..., T], args: tuple, kwargs: dict
    ) -> "concurrent.futures.Future[T]":
        future: concurrent.futures.Future = concurrent.futures.Future()
        call = _Call(future, fn, args, kwargs)
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after shutdown")
            now = self._clock()
            if slack_s is None:
                self._untimed.append((now, next(self._seq), call))
            else:
                heapq.heappush(self._timed, (now + max(slack_s, LATE_FLOOR_S), next(self._seq), call))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self._name}_0", daemon=True)
                self._thread.start()
            self._cv.notify()
        return future

    # ------------------------------------------------------------------ callers

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the torch thread and wait for it (inline when already on it)."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._queue(None, fn, args, kwargs).result()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> "concurrent.futures.Future[T]":
        """Queue a call on the torch thread; its future (``cancel()`` drops it while still queued)."""
        return self._queue(None, fn, args, kwargs)

    def submit_within(
        self, slack_s: Optional[float], fn: Callable[..., T], *args: Any, **kwargs: Any
    ) -> "concurrent.futures.Future[T]":
        """Queue a call due within ``slack_s`` seconds (None: no deadline); see the class's order."""
        return self._queue(slack_s, fn, args, kwargs)

    async def acall(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the torch thread without blocking the event loop."""
        return await asyncio.wrap_future(self._queue(None, fn, args, kwargs))

    async def acall_within(self, slack_s: Optional[float], fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``acall`` due within ``slack_s`` seconds (None: no deadline)."""
        return await asyncio.wrap_future(self._queue(slack_s, fn, args, kwargs))

    def shutdown(self) -> None:
        """Finish the call in flight, drop queued ones; later calls raise RuntimeError."""
        with self._cv:
            self._closed = True
            dropped = [c for _, _, c in self._timed] + [c for _, _, c in self._untimed]
            self._timed.clear()
            self._untimed.clear()
            self._cv.notify_all()
        for call in dropped:
            call.future.cancel()


class _Call(NamedTuple):
    future: concurrent.futures.Future
    fn: Callable[..., Any]
    args: tuple
    kwargs: dict
