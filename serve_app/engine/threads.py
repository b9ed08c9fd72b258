"""Which threads run torch: one long-lived OpenMP team per process.

PyTorch on Linux runs its intra-op parallelism on libgomp. Every thread that ever runs a
parallel region keeps its own team of OpenMP threads until it exits, and libgomp counts them all.
Once that count exceeds the CPUs, every team waits at each barrier on a futex instead of
spinning ("throttled" spin). A ChatTTS GPT step has ~300 barriers, so a step on a second thread
took 157 ms instead of 108 ms here (2 threads, batch 8; ~315 futex sleeps per forward against 0).
A Serve replica hits this by default: ``__init__`` loads the model on one thread and the work
then runs on another (the decode thread, ``asyncio.to_thread``'s pool).

So each process keeps one thread for its multi-threaded torch work: the Acoustic engine's decode
thread, or a ``TorchThread``. Set-up work runs on a thread that exits (``on_new_thread``),
which frees its team.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Optional, TypeVar

T = TypeVar("T")


def on_new_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a thread of its own that exits afterwards (frees its OpenMP
    team); returns the result or raises the exception."""
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
    """One thread for a process's torch work, so it keeps one OpenMP team (see module doc).

    ``threads`` sets the thread's torch intra-op threads (None keeps the process's count)."""

    def __init__(self, name: str = "torch", threads: Optional[int] = None):
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=name, initializer=self._init, initargs=(threads,)
        )

    @staticmethod
    def _init(threads: Optional[int]) -> None:
        import torch

        torch.set_grad_enabled(False)
        if threads is not None:
            torch.set_num_threads(threads)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the torch thread and wait for it (blocking)."""
        return self._pool.submit(fn, *args, **kwargs).result()

    async def acall(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run on the torch thread without blocking the event loop."""
        return await asyncio.wrap_future(self._pool.submit(fn, *args, **kwargs))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

