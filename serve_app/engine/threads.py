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
import concurrent.futures
import threading
from typing import Any, Callable, Optional, TypeVar

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


class TorchThread:
    """One thread for a process's (or a component's) torch work: calls run one at a time, in
    order. ``threads`` sets that thread's intra-op threads (None: the process's count); use 1
    for side work next to a multi-threaded loop, so it adds no OpenMP team."""

    def __init__(self, name: str = "torch", threads: Optional[int] = None):
        self._ident: Optional[int] = None
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=self._init, initargs=(threads,)
        )

    def _init(self, threads: Optional[int]) -> None:
        import torch

        self._ident = threading.get_ident()
        torch.set_grad_enabled(False)
        if threads is not None:
            apply_torch_threads(threads)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the torch thread and wait for it (inline when already on it)."""
        if threading.get_ident() == self._ident:
            return fn(*args, **kwargs)
        return self._pool.submit(fn, *args, **kwargs).result()

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> "concurrent.futures.Future[T]":
        """Queue a call on the torch thread; its future (``cancel()`` drops it while still queued)."""
        return self._pool.submit(fn, *args, **kwargs)

    async def acall(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the torch thread without blocking the event loop."""
        return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))

    def shutdown(self) -> None:
        """Finish the call in flight, drop queued ones; later calls raise RuntimeError."""
        self._pool.shutdown(wait=False, cancel_futures=True)
