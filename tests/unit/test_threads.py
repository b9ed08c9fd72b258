"""serve_app/engine/threads.py: where torch work runs (one OpenMP team per process)."""

from __future__ import annotations

import asyncio
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
