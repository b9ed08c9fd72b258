"""The speech pipeline (serve_app/pipeline): one plan entry point, and a stream that stops every
stage's work on every way out; the admission step gives its stream slot back on every failure.

The stage handles here are stand-ins for Serve's (``.remote`` coroutines, a streaming call whose
generator has ``cancel()``), since no Ray runs in the unit tests; the in-process pipeline's test
runs the real engine (decode loop, vocoder, encoder) and checks its rows are dropped."""

from __future__ import annotations

import asyncio
from typing import Any, Optional

import pytest

from serve_app.callers import Caller, LocalSlots
from serve_app.engine.config import SegmentConfig
from serve_app.engine.types import ScriptPart, SynthesisOptions
from serve_app.engine.voices import VoiceResolver
from serve_app.errors import APIError, to_api_error
from serve_app.pipeline import Admission, HandlesPipeline
from serve_app.settings import VoiceStoreConfig
from serve_app.storage.voices import VoiceCatalog, make_voice_store

# ------------------------------------------------------------------ stand-ins for Serve's handles


class _Method:
    def __init__(self, fn: Any):
        self.fn = fn

    async def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


class _Handle:
    """A stage's handle: each attribute a method with ``.remote``; calls recorded by name."""

    def __init__(self, **methods: Any):
        self.calls: list[tuple[str, tuple, dict]] = []
        for name, fn in methods.items():
            setattr(self, name, _Method(self._recorded(name, fn)))

    def _recorded(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append((name, args, kwargs))
            return fn(*args, **kwargs)

        return call


class _VocoderStream:
    """What ``vocoder.options(stream=True).stream.remote(...)`` gives: items as they come (an
    exception item is raised), until the end; ``cancel()`` stops the producer."""

    def __init__(self, items: list[Any], gate: Optional[asyncio.Event] = None):
        self.items = list(items)
        self.gate = gate  # items after the first wait for it
        self.cancelled = 0
        self.sent = 0

    def __aiter__(self) -> "_VocoderStream":
        return self

    async def __anext__(self) -> Any:
        if self.sent and self.gate is not None:
            await self.gate.wait()
        if not self.items:
            raise StopAsyncIteration
        item = self.items.pop(0)
        self.sent += 1
        if isinstance(item, BaseException):
            raise item
        return item

    def cancel(self) -> None:
        self.cancelled += 1


class _Vocoder:
    def __init__(self, *streams: _VocoderStream):
        self.streams = list(streams)
        self.opened: list[tuple] = []
        self.stream = self  # vocoder.options(stream=True).stream.remote(...): the generator at once

    def remote(self, *args: Any) -> _VocoderStream:
        return self._open(*args)

    def options(self, stream: bool = False) -> "_Vocoder":
        assert stream
        return self

    def _open(self, plan: Any, response_format: str, flow_ref: Any) -> _VocoderStream:
        self.opened.append((plan, response_format, flow_ref))
        return self.streams.pop(0)


def _pipeline(*streams: _VocoderStream) -> HandlesPipeline:
    return HandlesPipeline(None, _Vocoder(*streams))


# ------------------------------------------------------------------ cancel on exit


async def test_a_stream_read_to_its_end_is_closed_not_cancelled():
    source = _VocoderStream([b"a", b"b"])
    async with _pipeline(source).audio("plan", "pcm") as stream:
        assert [item async for item in stream] == [b"a", b"b"]
    assert source.cancelled == 0


async def test_leaving_a_stream_early_cancels_every_stage_once():
    source = _VocoderStream([b"a", b"b", b"c"])
    async with _pipeline(source).audio("plan", "pcm") as stream:
        async for _ in stream:
            break  # a client gone, a barge-in
    assert source.cancelled == 1
    stream.cancel()  # the owner's own cleanup after the stream's: still once
    await stream.aclose()
    assert source.cancelled == 1


async def test_a_failing_stage_cancels_the_stream_and_its_error_reaches_the_reader():
    source = _VocoderStream([b"a", RuntimeError("vocoder died")])
    stream = _pipeline(source).audio("plan", "pcm")
    assert await stream.__anext__() == b"a"
    with pytest.raises(RuntimeError, match="vocoder died"):
        await stream.__anext__()  # no context manager: the failed read itself cancels
    assert source.cancelled == 1


async def test_a_reader_cancelled_or_timed_out_while_waiting_cancels_the_stream():
    for stop in ("cancel", "timeout"):
        source = _VocoderStream([b"a", b"b"], gate=asyncio.Event())  # the second item never comes
        stream = _pipeline(source).audio("plan", "pcm")

        async def read(stream: Any = stream) -> list:
            return [item async for item in stream]

        if stop == "cancel":
            task = asyncio.ensure_future(read())
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        else:
            assert await stream.__anext__() == b"a"
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(stream.__anext__(), 0.01)
        assert source.cancelled == 1, stop


async def test_a_stream_reports_its_flow_on_the_edge_it_was_given():
    vocoder = _Vocoder(_VocoderStream([b"a"]))
    async with HandlesPipeline(None, vocoder).audio("plan", "mp3", None) as stream:
        assert [x async for x in stream] == [b"a"]
    assert vocoder.opened == [("plan", "mp3", None)]


async def test_the_in_process_pipeline_drops_its_rows_when_its_reader_leaves(tiny_model):
    from support.ws import EngineBackend

    backend = EngineBackend(tiny_model, SegmentConfig(max_chars=120, max_seconds=1.0))
    try:
        engine = backend.engine
        text = "The quick brown fox jumps high. Seven small birds sing today. A warm wind moves the tall trees."
        plan = await backend.pipeline.plan(text, SynthesisOptions(seed=3))
        assert len(plan.segments) == 3
        before = engine.stats.rows_cancelled
        async with backend.pipeline.audio(plan, "pcm") as stream:
            async for item in stream:
                if isinstance(item, bytes) and item:
                    break  # first audio, then gone
        for _ in range(500):
            if engine.running_rows + engine.waiting_rows == 0:
                break
            await asyncio.sleep(0.01)
        assert engine.running_rows + engine.waiting_rows == 0
        assert engine.stats.rows_cancelled > before
    finally:
        backend.close()


# ------------------------------------------------------------------ one plan entry point


def _plan_of(kind: str) -> Any:
    return lambda *args, **kwargs: (kind, args, kwargs)


async def test_plain_text_is_planned_and_refined_a_script_of_parts_never_is():
    normalizer = _Handle(plan=_plan_of("plan"), plan_script=_plan_of("script"), replan=_plan_of("replan"))
    acoustic = _Handle(refine=lambda texts, seed: [t.upper() for t in texts])
    pipeline = HandlesPipeline(normalizer, None, acoustic)
    options, voice = SynthesisOptions(), VoiceResolver().resolve("alloy")

    kind, args, kwargs = await pipeline.plan("hello", options, voice, "key1")
    assert (kind, args, kwargs) == ("plan", ("hello", options, voice), {"client": "key1"})

    class _Planned:  # what plan.remote gives: the refine pass reads its texts and first seed
        texts = ["hello"]
        segments = [type("Segment", (), {"seed": 7})()]

    normalizer.plan = _Method(lambda *a, **k: _Planned())
    kind, args, _ = await pipeline.plan("hello", options, voice, "key1", refine=True)
    assert (kind, args[0]) == ("replan", ["HELLO"]) and acoustic.calls == [("refine", (["hello"], 7), {})]

    parts = [ScriptPart("one", voice), ScriptPart("two", voice)]
    kind, args, kwargs = await pipeline.plan(parts, options, voice, "key1", refine=True)
    assert (kind, args, kwargs) == ("script", (parts, options), {"client": "key1"})
    assert len(acoustic.calls) == 1  # a script of parts is never refined


# ------------------------------------------------------------------ admission


def _caller(max_streams: int = 1, max_priority: int = 0) -> Caller:
    return Caller(id="key1", owner="key1", max_priority=max_priority, max_streams=max_streams, max_voices=None)


def _admission(slots: Any, busy: Any = lambda: None) -> Admission:
    return Admission(VoiceCatalog(make_voice_store(VoiceStoreConfig(backend="memory"))), slots, busy)


class _SlowSlots(LocalSlots):
    """The cluster-wide counter's round trip: a slot is held only after a while."""

    async def acquire(self, caller: Caller) -> Any:
        await asyncio.sleep(0.05)
        return await super().acquire(caller)


async def _settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0.02)


async def test_a_stream_admission_holds_one_slot_and_a_second_is_refused_holding_nothing():
    slots = LocalSlots()
    admission = _admission(slots)
    first = await admission.admit(_caller(), "chattts", "alloy", stream=True)
    assert first.voice.name == "alloy" and slots.held("key1") == 1
    with pytest.raises(APIError) as refused:
        await admission.admit(_caller(), "chattts", "alloy", stream=True)
    assert (refused.value.status, refused.value.code) == (429, "too_many_streams")
    assert slots.held("key1") == 1
    first.release()
    first.release()  # idempotent
    assert slots.held("key1") == 0


async def test_a_failure_after_admission_gives_the_slot_back_taken_or_still_being_taken():
    for slots in (LocalSlots(), _SlowSlots()):
        admission = _admission(slots)
        admitted = await admission.admit(_caller(), "chattts", "alloy", priority=0)
        admission.take_stream(admitted)  # taken while the door plans
        admitted.release()  # the plan failed before the slot was held
        await _settle()
        assert slots.held("key1") == 0, type(slots).__name__

        admitted = await admission.admit(_caller(), "chattts", "alloy")
        admission.take_stream(admitted)
        await admitted.held()
        assert slots.held("key1") == 1
        admitted.release()  # the first audio never came
        assert slots.held("key1") == 0


async def test_an_admission_cancelled_while_its_slot_is_taken_holds_nothing():
    slots = _SlowSlots()
    task = asyncio.ensure_future(_admission(slots).admit(_caller(), "chattts", "alloy", stream=True))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _settle()
    assert slots.held("key1") == 0


async def test_refusals_come_in_order_before_any_slot_is_taken():
    slots = LocalSlots()

    def busy() -> None:
        raise APIError(429, "server busy", code="busy")

    cases = [
        (dict(model="whisper-1", voice="no-such-voice"), (404, "model_not_found")),
        (dict(model="chattts", voice="no-such-voice", chars=(10, 5, "input")), (413, "input_too_long")),
        (dict(model="chattts", voice="no-such-voice", priority=3), (403, "priority_not_allowed")),
        (dict(model="chattts", voice="no-such-voice"), (400, "voice_not_found")),
        (dict(model="chattts", voice="alloy"), (429, "busy")),
    ]
    for kwargs, expected in cases:
        model, voice = kwargs.pop("model"), kwargs.pop("voice")
        with pytest.raises(Exception) as info:
            await _admission(slots, busy).admit(_caller(), model, voice, stream=True, **kwargs)
        error = to_api_error(info.value)
        assert error is not None and (error.status, error.code) == expected, kwargs
        assert slots.held("key1") == 0
