"""A stage's admission of real-time streams by its measured rate (engine/stream_gate.py)."""

from __future__ import annotations

import asyncio

import pytest

from serve_app.engine.errors import CapacityExhausted
from serve_app.engine.stream_gate import StreamGate


def test_the_rate_is_audio_over_busy_time_and_capacity_keeps_headroom():
    gate = StreamGate(headroom=0.15, wait_s=0.1)
    assert gate.capacity_streams is None  # nothing measured: every stream enters
    gate.measure(0.0, 0.0)
    gate.measure(0.2, 2.0)
    assert gate.rate is None  # too little busy time to trust
    gate.measure(1.0, 10.0)
    assert gate.rate == pytest.approx(10.0) and gate.capacity_streams == 8  # floor(10 * 0.85)
    gate.measure(7.0, 40.0)  # the window moves on: the recent rate
    assert gate.rate == pytest.approx(5.0, rel=0.01) and gate.capacity_streams == 4
    gate.measure(7.0, 41.0)  # no busy time passed: nothing to learn
    assert gate.rate == pytest.approx(5.0, rel=0.01)


async def test_streams_past_capacity_wait_then_enter_or_are_refused():
    gate = StreamGate(headroom=0.0, wait_s=0.2)
    gate.measure(0.0, 0.0)
    gate.measure(1.0, 2.0)  # 2 streams at 1x
    await gate.enter()
    await gate.enter()
    with pytest.raises(CapacityExhausted, match="acoustic.capacity_wait_s"):
        await gate.enter()  # nobody leaves within 0.2 s
    assert gate.refused == 1 and gate.inside == 2
    waiting = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.leave()  # a place frees: the waiter takes it
    await asyncio.wait_for(waiting, 1.0)
    assert gate.inside == 2
    await gate.enter(continuing=True)  # a stream already in goes on whatever the count
    assert gate.inside == 3


async def test_a_waiter_that_goes_away_leaves_no_place_taken():
    gate = StreamGate(headroom=0.0, wait_s=5.0)
    gate.measure(0.0, 0.0)
    gate.measure(1.0, 1.0)
    await gate.enter()
    waiting = asyncio.ensure_future(gate.enter())
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    gate.leave()
    assert gate.inside == 0
    await asyncio.wait_for(gate.enter(), 1.0)  # the place is free, not held for the one that left
    assert gate.inside == 1
