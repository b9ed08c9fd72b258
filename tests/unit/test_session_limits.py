"""What a WebSocket session may cost while it waits or talks, in-process over a backend that only
records what it is asked (no engine): the first message's deadline, the idle timeout, a bounded
number of planning calls for a flush flood (its text kept whole and in order), empty appends
refused; and what /readyz shows of a failed warm-up (nothing but "failed")."""

from __future__ import annotations

import asyncio
import json
import time
from typing import AsyncIterator, Union

from support.ws import MemoryTransport

from serve_app.engine.types import Plan, SegmentRequest, StreamSummary, Voice
from serve_app.http.health import Readiness
from serve_app.protocol import SessionCreated, SessionStart
from serve_app.realtime import SessionLimits, serve_session


class RecordingBackend:
    """Plans each cut as one segment (after ``plan_s``) and speaks it as 100 bytes; records the cuts."""

    def __init__(self, plan_s: float = 0.0):
        self.plan_s = plan_s
        self.cuts: list[str] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def plan(self, text: str, options) -> Plan:
        self.cuts.append(text)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.plan_s)
        finally:
            self.in_flight -= 1
        return Plan(
            Voice("alloy", 2222),
            [SegmentRequest(text=text, spk_emb=None, spk_seed=2222, seed=1, max_new_tokens=8)],
            [text],
        )

    async def audio(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        yield b"\0" * 100
        yield StreamSummary(0.01, 1, 1, 0.0, 0.0)


async def _admit(start: SessionStart) -> SessionCreated:
    return SessionCreated(id="t", response_format=start.response_format, sample_rate=24000, weights="random")


async def _events(t: MemoryTransport, timeout: float = 10) -> list:
    out = []
    while True:
        item = await t.next(timeout)
        out.append(item)
        if isinstance(item, tuple):  # ("close", code)
            return out


async def test_no_session_start_in_time_is_408_and_a_close():
    t = MemoryTransport()
    t0 = time.perf_counter()
    task = asyncio.ensure_future(serve_session(t, RecordingBackend(), _admit, SessionLimits(first_message_s=0.2)))
    events = await _events(t)
    assert events[0]["type"] == "error" and events[0]["error"]["code"] == "timeout" and events[-1] == ("close", 4408)
    assert time.perf_counter() - t0 < 2
    start, stats = await task
    assert start is None and stats.status == "408"


async def test_an_idle_session_is_closed_but_a_speaking_one_is_not():
    backend = RecordingBackend(plan_s=0.4)  # planning + speaking outlast idle_s: not idle
    t = MemoryTransport()
    task = asyncio.ensure_future(serve_session(t, backend, _admit, SessionLimits(idle_s=0.3)))
    t.send(type="session.start", response_format="pcm")
    assert (await t.next())["type"] == "session.created"
    t.send(type="text.append", text="你好。")
    events = await _events(t)
    kinds = [e["type"] if isinstance(e, dict) else ("audio" if isinstance(e, bytes) else e) for e in events]
    assert kinds[:4] == ["segment.start", "audio", "segment.done", "error"], kinds
    assert events[-2]["error"]["code"] == "idle_timeout" and events[-1] == ("close", 4408)
    await task


async def test_a_flush_flood_makes_few_planning_calls_and_keeps_its_text():
    backend = RecordingBackend(plan_s=0.05)
    t = MemoryTransport()
    task = asyncio.ensure_future(serve_session(t, backend, _admit, SessionLimits(max_pending_cuts=2)))
    t.send(type="session.start", response_format="pcm")
    await t.next()
    text = "".join(chr(0x4E00 + i) for i in range(300))
    for ch in text:
        t.send(type="text.append", text=ch)
        t.send(type="text.flush")
    t.send(type="close")
    events = await _events(t, 30)
    assert events[-1] == ("close", 1000), events[-3:]
    assert backend.most_in_flight <= 2
    assert "".join(backend.cuts) == text  # every character, once, in order
    assert len(backend.cuts) < 60, len(backend.cuts)
    (_, stats) = await task
    assert stats.segments == len(backend.cuts)


async def test_an_empty_append_is_refused():
    t = MemoryTransport()
    task = asyncio.ensure_future(serve_session(t, RecordingBackend(), _admit, SessionLimits()))
    t.send(type="session.start", response_format="pcm")
    await t.next()
    t.send(type="text.append", text="")
    events = await _events(t)
    assert events[0]["error"]["code"] == "invalid_value" and events[0]["error"]["param"] == "text"
    assert events[-1] == ("close", 4400)
    await task


async def test_readyz_says_failed_and_nothing_more():
    async def warmup():
        raise RuntimeError("CUDA error: secret internals at /opt/model")

    readiness = Readiness(warmup)
    await asyncio.sleep(0.05)
    answer = readiness.answer("random")
    assert answer.status_code == 503
    assert json.loads(answer.body) == {"status": "failed"}
