"""Back-pressure between stages (pipeline/flow.py): the board's table and long poll, and the
producer's window against consumers that keep up, fall behind, stop, or never report.

The board runs in-process here (its methods are plain async code); ``_LocalHandle`` gives it the
``method.remote(...)`` shape of its Ray actor handle, so the producer and consumer helpers run
unchanged. The real board inside Serve: tests/serve/test_backpressure.py.
"""

from __future__ import annotations

import asyncio

import pytest

from serve_app.pipeline import flow
from serve_app.pipeline.flow import AckedStream, FlowAcks, FlowBoard, FlowCredit, FlowRef, FlowTable, paced


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self.fn(*args))


class _LocalHandle:
    def __init__(self, board: FlowBoard):
        self.board = board

    def __getattr__(self, name):
        return _Method(getattr(self.board, name))


@pytest.fixture
def local_board(monkeypatch):
    board = FlowBoard()
    monkeypatch.setattr(flow, "_boards", {"flow:test": _LocalHandle(board)})
    return board


def test_table_wakes_a_waiter_only_once_its_count_is_reached():
    async def run():
        table = FlowTable()
        table.ack("s", 0, 0.0)
        fut = table.waiter("s", 5, 0.0)
        table.ack("s", 4, 1.0)
        assert not fut.done()
        table.ack("s", 3, 1.5)  # reports can arrive out of order: the count never goes back
        assert table.taken("s") == 4 and not fut.done()
        table.ack("s", 6, 2.0)
        assert fut.result() == 6
        table.close("s")
        assert not table.known("s") and len(table) == 0

    asyncio.run(run())


def test_table_forgets_idle_streams_but_not_waited_ones():
    async def run():
        table = FlowTable()
        table.ack("idle", 3, 0.0)
        table.ack("waited", 1, 0.0)
        table.waiter("waited", 9, 0.0)
        table.sweep(now=10_000.0, idle_s=900.0)
        assert not table.known("idle") and table.known("waited")

    asyncio.run(run())


def test_board_wait_answers_at_once_when_caught_up_else_when_the_consumer_reports():
    async def run():
        board = FlowBoard()
        await board.ack("s", 8)
        assert await board.wait("s", 8, 1.0) == (True, 8)
        waiting = asyncio.ensure_future(board.wait("s", 12, 5.0))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        await board.ack("s", 16)
        assert await asyncio.wait_for(waiting, 1.0) == (True, 16)
        # A stream nobody registered (a restarted board) is reported unknown after the poll.
        assert await board.wait("nobody", 1, 0.05) == (False, 0)
        # A consumer that registers late, within the poll, still counts.
        late = asyncio.ensure_future(board.wait("late", 2, 2.0))
        await asyncio.sleep(0.05)
        await board.ack("late", 2)
        assert await asyncio.wait_for(late, 1.0) == (True, 2)

    asyncio.run(run())


async def _push(ref, n, queue):
    """A producer as Serve runs one: it pushes every item it yields to the consumer's side (an
    unbounded queue), never waiting for the consumer to take them; only its credit holds it."""
    credit = FlowCredit(ref)
    for i in range(n):
        await credit.ready()
        queue.put_nowait(i)
    queue.put_nowait(None)


def test_a_producer_stays_within_its_window_of_a_slow_consumer_and_loses_nothing(local_board):
    async def run(window):
        ref = FlowRef.new("flow:test", window=window) if window else None
        acks = FlowAcks(ref)
        queue: asyncio.Queue = asyncio.Queue()
        producer = asyncio.ensure_future(_push(ref, 60, queue))
        got, unread = [], []
        while (item := await queue.get()) is not None:
            unread.append(queue.qsize())
            got.append(item)
            acks.took()
            await asyncio.sleep(0.002 if item % 10 else 0.05)  # a consumer that stalls now and then
        acks.close()
        await producer
        return got, max(unread)

    got, most_unread = asyncio.run(run(8))
    assert got == list(range(60))
    assert most_unread <= 8  # never more than a window sent and not taken
    got, most_unread = asyncio.run(run(None))  # without a window the same consumer falls far behind
    assert got == list(range(60)) and most_unread > 40


def test_a_consumer_that_stops_reading_stops_its_producer(local_board):
    async def run():
        ref = FlowRef.new("flow:test", window=6)
        acks = FlowAcks(ref)
        produced = 0

        async def producer():
            nonlocal produced
            credit = FlowCredit(ref)
            for _ in range(100):
                await credit.ready()
                produced += 1

        task = asyncio.ensure_future(producer())
        await asyncio.sleep(0.3)  # the consumer took nothing: the producer went a window ahead and waits
        assert produced == 6 and not task.done()
        acks.took(3)  # a report comes every step (3): the producer may send 3 more
        await asyncio.sleep(0.1)
        assert produced == 9 and not task.done()
        task.cancel()
        acks.close()

    asyncio.run(run())


def test_a_producer_goes_on_when_nobody_reports_the_stream(local_board, monkeypatch):
    monkeypatch.setattr(flow, "POLL_S", 0.1)

    async def run():
        ref = FlowRef.new("flow:test", window=2)  # no FlowAcks: the consumer never registered
        credit = FlowCredit(ref)
        for _ in range(5):
            await asyncio.wait_for(credit.ready(), 2.0)
        return credit

    credit = asyncio.run(run())
    assert credit.ref is None and credit.sent == 5  # sent without a window after one poll


def test_acked_stream_counts_only_what_the_producer_counts(local_board):
    async def source():
        for item in (b"a", b"b", "summary"):
            yield item

    class _Gen:
        def __init__(self):
            self.it = source()
            self.cancelled = False

        def __aiter__(self):
            return self

        async def __anext__(self):
            return await self.it.__anext__()

        def cancel(self):
            self.cancelled = True

    async def run():
        gen = _Gen()
        stream = AckedStream(gen, FlowRef.new("flow:test", window=2), counts=lambda x: isinstance(x, bytes))
        items = [x async for x in stream]
        stream.cancel()
        return items, stream.acks, gen

    items, acks, gen = asyncio.run(run())
    assert items == [b"a", b"b", "summary"] and acks.taken == 2 and gen.cancelled and acks.ref is None


def test_paced_waits_for_the_consumer_before_each_item(local_board):
    async def run():
        ref = FlowRef.new("flow:test", window=2)
        acks = FlowAcks(ref)

        async def items():
            for i in range(5):
                yield i

        gen = paced(items(), FlowCredit(ref))
        out = [await asyncio.wait_for(gen.__anext__(), 1.0) for _ in range(2)]
        third = asyncio.ensure_future(gen.__anext__())
        await asyncio.sleep(0.2)
        assert not third.done()  # 2 sent, none taken: the third waits
        acks.took(1)
        out.append(await asyncio.wait_for(third, 1.0))
        return out

    assert asyncio.run(run()) == [0, 1, 2]


def test_a_ref_survives_its_header_and_refuses_garbage():
    ref = FlowRef.new("flow:chattts", 16)
    assert FlowRef.from_header(ref.header()) == ref
    for bad in ("", "flow:x y", "nope abc 16", "flow:x abc sixteen", "flow:x a b c"):
        assert FlowRef.from_header(bad) is None
