"""refine_text bounded and cancellable (serve_app/engine/refine.py), on the random-tiny model, no
Ray: ChatTTS's own output, the per-call limits, the wait for the refiner, a cancel that stops a
running generation before its next token, and other calls' batches taking turns."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from serve_app.engine.config import AcousticConfig
from serve_app.engine.errors import RefineBusy, RefineCancelled, RequestTooLarge
from serve_app.engine.refine import TextRefiner, _join_cjk, refine_async, refine_token_cap
from serve_app.engine.threads import TorchThread
from serve_app.errors import to_api_error

SHORT = ["你好。", "Hi."]
LONG = "这是一个很长的句子，用来让生成跑得久一点。" * 4  # ~100 tokens of generation at most


class CountingEvent(threading.Event):
    """An event that sets itself after ``after`` checks: a cancel arriving mid-generation, at a
    known step."""

    def __init__(self, after: int):
        super().__init__()
        self.after = after
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        if self.checks > self.after:
            self.set()
        return super().is_set()


class Recording(TextRefiner):
    """Records each generation's texts (the order in which batches ran)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.ran: list[list[str]] = []

    def _generate(self, texts, *args, **kwargs):
        self.ran.append(list(texts))
        return super()._generate(texts, *args, **kwargs)


@pytest.fixture(scope="module")
def refine_thread():
    thread = TorchThread("refine-test", threads=1)
    yield thread
    thread.shutdown()


def test_refine_is_chattts_own_refine_text(tiny_model):
    """The same prompt, processors and seeded sampling as ``Chat._refine_text``: the same text."""
    chat = tiny_model.chat
    params = chat.RefineTextParams(
        temperature=0.7,
        top_P=0.7,
        top_K=20,
        show_tqdm=False,
        manual_seed=7,
        max_new_token=max(refine_token_cap(t) for t in SHORT),
    )
    with torch.inference_mode():
        ref = chat._refine_text(list(SHORT), chat.device, params)
        expected = [
            _join_cjk(t) for t in chat.tokenizer.decode([i[i.less(chat.tokenizer.break_0_ids)] for i in ref.ids])
        ]
    refiner = TextRefiner(tiny_model)
    assert refiner.refine(SHORT, seed=7) == expected
    assert refiner.refine(SHORT, seed=7) == expected  # deterministic for a seed


def test_input_limits_name_the_limit_and_the_figure(tiny_model):
    refiner = TextRefiner(tiny_model, AcousticConfig(refine_max_texts=3, refine_max_chars=50))
    with pytest.raises(RequestTooLarge, match=r"4 segments; the limit is 3 \(refine_max_texts\)"):
        refiner.refine(["a"] * 4, seed=1)
    with pytest.raises(RequestTooLarge, match=r"60 characters .* the limit is 50 \(refine_max_chars\)") as err:
        refiner.refine(["x" * 30, "y" * 30], seed=1)
    api = to_api_error(err.value)
    assert (api.status, api.code, api.param) == (413, "request_too_large", "input")
    assert refiner.calls == 0  # refused before any generation


def test_cancel_stops_a_running_generation_before_its_next_token(tiny_model):
    refiner = TextRefiner(tiny_model)
    cancel = CountingEvent(after=3)  # set at its 4th check
    with pytest.raises(RefineCancelled):
        refiner.refine([LONG], seed=3, cancel=cancel)
    # One check before the generation, one before each token: two tokens, then the check before
    # the third raised (of the ~100 this text may take).
    assert cancel.checks == 4
    # Cancelled before it starts: no generation at all.
    calls = refiner.calls
    done = threading.Event()
    done.set()
    with pytest.raises(RefineCancelled):
        refiner.refine([LONG], seed=3, cancel=done)
    assert refiner.calls == calls


def test_cancel_from_another_thread_ends_it_within_a_fraction_of_a_second(tiny_model):
    refiner = TextRefiner(tiny_model)
    cancel = threading.Event()
    result: list = []
    worker = threading.Thread(target=lambda: result.append(_outcome(refiner.refine, [LONG], 5, cancel=cancel)))
    worker.start()
    time.sleep(0.5)  # mid-generation (~100 tokens at tens of ms each)
    t0 = time.perf_counter()
    cancel.set()
    worker.join(timeout=10)
    stopped_in = time.perf_counter() - t0
    assert isinstance(result[0], RefineCancelled), result
    assert stopped_in < 1.0, stopped_in  # one token step (tens of ms here; more on a loaded machine)


def test_a_waiting_call_gives_up_after_refine_wait_s(tiny_model):
    refiner = TextRefiner(tiny_model, AcousticConfig(refine_wait_s=0.2))
    refiner._lock.acquire()  # a generation in progress
    try:
        t0 = time.perf_counter()
        with pytest.raises(RefineBusy, match="within 0.2 s") as err:
            refiner.refine(SHORT, seed=1)
        assert 0.15 < time.perf_counter() - t0 < 2.0
    finally:
        refiner._lock.release()
    api = to_api_error(err.value)
    assert (api.status, api.code, api.headers.get("Retry-After")) == (503, "refine_busy", "2")


def test_refine_async_cancelled_task_stops_the_running_generation(tiny_model, refine_thread):
    """The Serve method awaits ``refine_async``; when that await is cancelled (client gone) the
    generation stops before its next token and the refine thread is free again at once."""
    refiner = TextRefiner(tiny_model)

    async def main() -> float:
        task = asyncio.ensure_future(refine_async(refiner, refine_thread, [LONG], 9))
        await asyncio.sleep(0.5)
        assert not task.done()
        t0 = time.perf_counter()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await refine_thread.acall(lambda: None)  # the thread has let go of the generation
        return time.perf_counter() - t0

    assert asyncio.run(main()) < 1.0


def test_refine_async_batches_take_turns_and_waiters_give_up(tiny_model, refine_thread):
    """Two calls of two batches each run A1, B1, A2, B2 (arrival order per batch, not per call);
    a third call that cannot start within refine_wait_s gets RefineBusy, and its batches never run."""
    refiner = Recording(tiny_model)
    refiner.batch = 1  # two batches per call of two segments (short generations: a slow CPU here)
    a, b = ["甲。", "甲乙。"], ["乙。", "乙甲。"]

    async def both() -> tuple[list[str], list[str]]:
        ta = asyncio.ensure_future(refine_async(refiner, refine_thread, a, 1))
        await asyncio.sleep(0)  # A's first batch is queued first
        tb = asyncio.ensure_future(refine_async(refiner, refine_thread, b, 2))
        return await ta, await tb

    out_a, out_b = asyncio.run(both())
    assert len(out_a) == len(a) and len(out_b) == len(b)
    assert [batch[0][0] for batch in refiner.ran] == ["甲", "乙", "甲", "乙"]

    refiner.ran.clear()
    refiner.configure(AcousticConfig(refine_wait_s=0.3))

    async def busy() -> None:
        long_call = asyncio.ensure_future(refine_async(refiner, refine_thread, [LONG], 1))
        await asyncio.sleep(0.1)
        t0 = time.perf_counter()
        with pytest.raises(RefineBusy):
            await refine_async(refiner, refine_thread, ["等一下。"], 2)
        assert time.perf_counter() - t0 < 2.0
        long_call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await long_call
        await refine_thread.acall(lambda: None)

    asyncio.run(busy())
    assert [batch[0] for batch in refiner.ran] == [LONG]  # the refused call never generated


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001
        return exc
