"""Back-pressure between stages: a stream's producer stays at most a window of items ahead of
what its consumer has taken.

Serve streams a replica's generator to its caller as fast as the generator yields, and its HTTP
proxy takes a replica's response as fast as it comes whatever the client reads: nothing tells a
producer that its consumer fell behind. A slow Vocoder, or a client that reads slowly, would make
every stage before it hold what it has not taken yet, up to a whole request's audio. So each
consumer reports how many items it has taken, and a producer, before it sends item ``n``, waits
until ``n - window`` have been taken. A waiting Acoustic stream stops reading its rows' chunks,
and the engine parks a row whose chunks are not read (``acoustic.max_stream_chunks``): the decode
stops for that stream instead of memory growing, and goes on where it left off.

The reports go through one small detached actor per application (``FlowBoard``, no CPU), as the
stream slots do. A consumer registers its stream when it opens it and reports every
``window // 2`` items (fire and forget); a producer asks only once it is a window ahead, and the
board answers when the consumer has caught up (a long poll). A stream shorter than a window never
waits. A producer whose board cannot be reached, or has forgotten the stream (a restart), goes on
without a window and says so in the log: the stream is served, unbounded as before.

Edges (``FlowRef`` travels with the call that opens the stream): Acoustic -> Vocoder (items:
hidden-state chunks), Vocoder -> Ingress (encoded byte blocks), and the Ingress's HTTP answer ->
the client, acknowledged by the flow middleware in Serve's proxy (``deployments/proxy/flow_acks.py``) as the
client's socket takes each block; with HAProxy's front door it runs in the Ingress replica, whose
own HTTP server already waits for the socket.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Optional

log = logging.getLogger("ray.serve")

NAMESPACE = "chattts_serve"
POLL_S = 5.0  # a producer's long poll; the board answers at the latest after this
CALL_TIMEOUT_S = 2.0  # on top of the poll: the board is down or far too slow
IDLE_S = 900.0  # a stream no call touched for this long is forgotten (its producer died)
WARN_EVERY_S = 60.0
# The HTTP edge (the Ingress's answer -> the client): the flow middleware in front of the Ingress
# marks each request it will report on, and takes the answer's edge from a response header.
ACKS_HEADER = "x-chattts-flow-acks"
REF_HEADER = "x-chattts-flow"


def board_name(app: str) -> str:
    return f"flow:{app}"


@dataclass(frozen=True)
class FlowRef:
    """One stream's edge between two stages: its board, its id and its window."""

    board: str
    stream: str
    window: int

    @classmethod
    def new(cls, board: str, window: int) -> "FlowRef":
        return cls(board, uuid.uuid4().hex, window)

    def header(self) -> str:
        return f"{self.board} {self.stream} {self.window}"

    @classmethod
    def from_header(cls, value: str) -> Optional["FlowRef"]:
        parts = value.split()
        if len(parts) != 3 or not parts[0].startswith("flow:") or not parts[2].isdigit():
            return None
        return cls(parts[0], parts[1][:64], max(2, int(parts[2])))

    @property
    def step(self) -> int:
        """A consumer reports every ``step`` items (a producer then runs between half a window and
        a window ahead)."""
        return max(1, self.window // 2)


class FlowTable:
    """The board's state, plain Python: stream -> items taken, and the producers waiting on it."""

    def __init__(self) -> None:
        self._taken: dict[str, int] = {}
        self._touched: dict[str, float] = {}
        self._waiters: dict[str, list[tuple[int, asyncio.Future]]] = {}

    def known(self, stream: str) -> bool:
        return stream in self._taken

    def taken(self, stream: str) -> Optional[int]:
        return self._taken.get(stream)

    def ack(self, stream: str, taken: int, now: float) -> None:
        self._taken[stream] = max(taken, self._taken.get(stream, 0))
        self._touched[stream] = now
        waiting = self._waiters.get(stream)
        if waiting:
            still = []
            for at_least, fut in waiting:
                if self._taken[stream] >= at_least:
                    if not fut.done():
                        fut.set_result(self._taken[stream])
                else:
                    still.append((at_least, fut))
            self._waiters[stream] = still

    def waiter(self, stream: str, at_least: int, now: float) -> asyncio.Future:
        fut = asyncio.get_running_loop().create_future()
        self._touched[stream] = now
        self._waiters.setdefault(stream, []).append((at_least, fut))
        return fut

    def forget_waiter(self, stream: str, fut: asyncio.Future) -> None:
        waiting = [w for w in self._waiters.get(stream, []) if w[1] is not fut]
        if waiting:
            self._waiters[stream] = waiting
        else:
            self._waiters.pop(stream, None)

    def close(self, stream: str) -> None:
        self._taken.pop(stream, None)
        self._touched.pop(stream, None)
        for _, fut in self._waiters.pop(stream, []):
            if not fut.done():
                fut.set_result(None)

    def sweep(self, now: float, idle_s: float = IDLE_S) -> None:
        for stream, at in list(self._touched.items()):
            if now - at > idle_s and not self._waiters.get(stream):
                self.close(stream)

    def __len__(self) -> int:
        return len(self._taken)


class FlowBoard:
    """The Ray actor around a ``FlowTable``: async (no call ordering to wedge when Ray cancels a
    request's calls), every method quick but ``wait``, a long poll."""

    def __init__(self) -> None:
        self.table = FlowTable()
        self._swept = time.monotonic()

    def _sweep(self, now: float) -> None:
        if now - self._swept > IDLE_S / 10:
            self._swept = now
            self.table.sweep(now)

    async def ack(self, stream: str, taken: int) -> None:
        now = time.monotonic()
        self.table.ack(stream, taken, now)
        self._sweep(now)

    async def wait(self, stream: str, at_least: int, timeout_s: float = POLL_S) -> tuple[bool, int]:
        """(known, taken) once ``taken >= at_least``, else after ``timeout_s``. ``known`` False: no
        consumer registered the stream here within the poll (the board restarted, or it ended)."""
        taken = self.table.taken(stream)
        if taken is not None and taken >= at_least:
            return True, taken
        fut = self.table.waiter(stream, at_least, time.monotonic())
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            self.table.forget_waiter(stream, fut)
        got = self.table.taken(stream)
        return got is not None, got or 0

    async def close(self, stream: str) -> None:
        self.table.close(stream)

    async def streams(self) -> int:
        return len(self.table)


_boards: dict[str, Any] = {}
# name -> a board's handle (its methods called with ``.remote``): installed by the Ray layer
# (deployments/backends.py: a detached actor per application), so nothing here imports Ray.
_open_board: Optional[Callable[[str], Any]] = None


def use_boards(open_board: Callable[[str], Any]) -> None:
    global _open_board
    _open_board = open_board


def board(name: str) -> Any:
    """The named board's handle (opened once per process)."""
    handle = _boards.get(name)
    if handle is None:
        if _open_board is None:
            raise RuntimeError("no flow boards in this process: importing deployments installs them")
        handle = _boards[name] = _open_board(name)
    return handle


class _Warn:
    last = -float("inf")

    @classmethod
    def once_a_while(cls, msg: str, *args: Any) -> None:
        now = time.monotonic()
        if now - cls.last > WARN_EVERY_S:
            cls.last = now
            log.warning(msg, *args)


class FlowCredit:
    """The producer's side of one edge: ``await ready()`` before sending each item."""

    def __init__(self, ref: Optional[FlowRef]):
        self.ref = ref
        self.sent = 0
        self.taken = 0
        self.waited_s = 0.0
        self._board = board(ref.board) if ref is not None else None

    async def ready(self) -> None:
        self.sent += 1
        ref = self.ref
        if ref is None or self.sent - self.taken <= ref.window:
            return
        need = self.sent - ref.window
        t0 = time.monotonic()
        try:
            while self.taken < need:
                known, taken = await asyncio.wait_for(
                    self._board.wait.remote(ref.stream, need, POLL_S), POLL_S + CALL_TIMEOUT_S
                )
                if not known:
                    _Warn.once_a_while(
                        "flow board does not know stream %s (restarted?): sending without a window", ref.stream
                    )
                    self.ref = None
                    return
                self.taken = max(self.taken, taken)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the board is down or too slow: serve without a window
            _Warn.once_a_while("flow board unreachable (%s): sending without a window", exc.__class__.__name__)
            self.ref = None
        finally:
            self.waited_s += time.monotonic() - t0


class FlowAcks:
    """The consumer's side of one edge: ``took()`` after taking each item. Registers the stream
    right away, so a producer whose consumer takes nothing at all still waits for it: on the next
    turn of the event loop when there is one, so the call that opens the stream (or the answer's
    first bytes) leaves first; a producer asks only once it is a window ahead, long after."""

    def __init__(self, ref: Optional[FlowRef]):
        self.ref = ref
        self.taken = 0
        self._reported = False
        self._board = board(ref.board) if ref is not None else None
        try:
            asyncio.get_running_loop().call_soon(self._register)
        except RuntimeError:  # no loop here: at once
            self._register()

    def _register(self) -> None:
        if not self._reported:  # else a report went already
            self._report()

    def took(self, n: int = 1) -> None:
        if self.ref is None:
            return
        before = self.taken // self.ref.step
        self.taken += n
        if self.taken // self.ref.step != before:
            self._report()

    def close(self) -> None:
        """The consumer is done with the stream (its end, an error, or it left)."""
        if self.ref is not None:
            self._fire("close", self.ref.stream)
            self.ref = None

    def _report(self) -> None:
        if self.ref is not None:
            self._reported = True
            self._fire("ack", self.ref.stream, self.taken)

    def _fire(self, method: str, *args: Any) -> None:
        try:
            getattr(self._board, method).remote(*args)
        except Exception:  # noqa: BLE001 - a lost report: the producer waits for the next, or goes on
            pass


class AckedStream:
    """A stage's response stream (a Serve ``DeploymentResponseGenerator``) whose consumer reports
    every item it takes (``counts``: which items the producer sent under the window). ``cancel()``
    stops the producer; ``close()`` ends the stream's edge after its last item."""

    def __init__(self, gen: Any, ref: Optional[FlowRef], counts: Any = lambda item: True):
        self._gen = gen
        self.acks = FlowAcks(ref)
        self._counts = counts

    def __aiter__(self) -> "AckedStream":
        return self

    async def __anext__(self) -> Any:
        item = await self._gen.__anext__()
        if self._counts(item):
            self.acks.took()
        return item

    def cancel(self) -> None:
        self.acks.close()
        self._gen.cancel()

    def close(self) -> None:
        self.acks.close()


async def paced(items: Any, credit: FlowCredit) -> Any:
    """``items`` (an async iterator), each sent only when ``credit`` allows it."""
    async for item in items:
        await credit.ready()
        yield item
