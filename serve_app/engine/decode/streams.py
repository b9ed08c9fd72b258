"""One row's output stream: the engine produces chunks, one consumer iterates them.

The producer (the decode thread) calls ``send`` / ``finish`` / ``fail``; the consumer iterates
(sync or async), polls, or cancels. Nothing else touches the queue.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Optional

import torch

if TYPE_CHECKING:
    from .playback import Playback


@dataclass
class HiddenChunk:
    """Hidden states of consecutive tokens of one row, ``hidden`` is (n, 768) float32 on CPU."""

    hidden: torch.Tensor
    index: int  # chunk number in the row
    start_token: int  # index of the first token of this chunk in the row
    final: bool = False
    finish_reason: Optional[str] = None  # "stop" | "length" on the final chunk (a cancelled row just ends)


_END = object()


class StreamGroup:
    """The streams of one request's segments, read in order by one consumer.

    Later segments decode beside the one being read (the head) and wait in their streams until
    the reader gets to them: that is what decoding one request's segments in parallel costs, and
    while the reader keeps up with the head it is all it costs. A reader that has fallen behind
    leaves chunks unread on the head (``BEHIND``: it has not taken the one before the last); then a
    later segment stops once ``limit`` chunks are unread from the head up to it (it parks, or does
    not join), and goes on once the reader caught up with the head or half of that is read. So a
    stalled reader's request holds about ``limit`` chunks, however many segments it has."""

    BEHIND = 2  # unread chunks on the head that mean its reader is behind (1: it just arrived)

    def __init__(self, streams: list["RowStream"]):
        self.streams = streams
        for s in streams:
            s.group = self

    @property
    def backlog(self) -> int:
        return sum(s.backlog for s in self.streams)

    def head(self) -> Optional["RowStream"]:
        """The stream its consumer reads now: the first not read to its end."""
        return next((s for s in self.streams if not (s.ended and s.backlog == 0)), None)

    def unread_up_to(self, stream: "RowStream") -> int:
        """Chunks unread from the head up to and including ``stream``."""
        total = 0
        reading = False
        for s in self.streams:
            reading = reading or not (s.ended and s.backlog == 0)
            if reading:
                total += s.backlog
            if s is stream:
                break
        return total

    def holds(self, stream: "RowStream", limit: int) -> bool:
        """Whether ``stream``, a later one than the head, waits for the reader."""
        head = self.head()
        if head is None or head is stream or head.backlog < self.BEHIND:
            return False
        return self.unread_up_to(stream) >= limit

    def releases(self, stream: "RowStream", limit: int) -> bool:
        """Whether a held ``stream`` may go on."""
        head = self.head()
        return head is None or head is stream or head.backlog == 0 or self.unread_up_to(stream) <= limit // 2


class RowStream:
    """The consumer side of one row: iterate chunks (sync or async), or cancel it; and the
    producer side the engine feeds it through (``send``, ``finish``, ``fail``).

    A sync consumer blocks on a ``queue.Queue``; an async one awaits an ``asyncio.Queue`` fed
    through ``call_soon_threadsafe`` (never blocking its loop).
    """

    def __init__(self, row_id: int, loop: Optional[asyncio.AbstractEventLoop]):
        self.row_id = row_id
        self._loop = loop
        self._q: Any = asyncio.Queue() if loop is not None else queue.Queue()
        self.cancelled = threading.Event()
        self.submitted_at = time.monotonic()
        self.admitted_at: Optional[float] = None  # joined the running batch (queue time ends)
        self.first_chunk_at: Optional[float] = None
        self.finished_at: Optional[float] = None  # its final chunk was sent
        self.ended = False  # its last item (end or error) was put
        # Chunks sent and taken (each written by one thread only): the backlog between the
        # engine and its consumer, which parks the row when it grows (AcousticConfig.max_stream_chunks).
        self.sent_chunks = 0
        self.taken_chunks = 0
        self.taken_tokens = 0  # the tokens of the chunks taken: how far its reader has read
        self.on_taken: Optional[Callable[["RowStream"], None]] = None  # the engine's wake-up while parked
        self.group: Optional[StreamGroup] = None  # the request's other segments, if any
        # Its request's playback clock and its segment's place in it (the engine sets both): the
        # slack the deadline scheduler orders rows by, and the stall seconds a caller can log
        # (``playback.stall_s(now)``).
        self.playback: Optional["Playback"] = None
        self.segment = 0

    @property
    def backlog(self) -> int:
        """Chunks sent that the consumer has not taken yet."""
        return self.sent_chunks - self.taken_chunks

    def _took(self, chunk: "HiddenChunk") -> None:
        self.taken_chunks += 1
        self.taken_tokens += chunk.hidden.shape[0]
        hook = self.on_taken
        if hook is not None:
            hook(self)

    @property
    def started(self) -> bool:
        """Has sent its first chunk, or will never send one (ended, cancelled)."""
        return self.first_chunk_at is not None or self.ended or self.cancelled.is_set()

    # ------------------------------------------------------------------ producer (engine thread)

    def send(self, chunk: HiddenChunk, now: Optional[float] = None) -> None:
        """Deliver a chunk (at ``now``, the engine's clock; default ``time.monotonic()``); a
        ``final`` one also ends the stream."""
        if self.ended:
            return
        now = time.monotonic() if now is None else now
        if self.first_chunk_at is None:
            self.first_chunk_at = now
        self.sent_chunks += 1
        if self.playback is not None:
            self.playback.note_sent(self.segment, chunk.hidden.shape[0], chunk.final, now)
        self._put(chunk)
        if chunk.final:
            self.finished_at = now
            self._put(_END)

    def finish(self) -> None:
        """End the stream without a final chunk (the row was cancelled)."""
        if not self.ended:
            self._put(_END)

    def fail(self, exc: BaseException) -> None:
        """End the stream with an error: the consumer's iteration raises ``exc``."""
        if not self.ended:
            self._put(exc)

    def _put(self, item: Any) -> None:
        if item is _END or isinstance(item, BaseException):
            self.ended = True
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._q.put_nowait, item)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                self.cancelled.set()
        else:
            self._q.put(item)

    # ------------------------------------------------------------------ consumer

    def cancel(self) -> None:
        """Stop decoding this row at the next step and free its slot."""
        self.cancelled.set()

    def poll(self) -> list[HiddenChunk]:
        """The chunks ready now, without waiting (sync streams; for a caller that drives the
        engine with ``step()`` on its own thread). Raises the row's error, if any."""
        if self._loop is not None:
            raise TypeError("this stream was opened for async iteration")
        out = []
        while not self._q.empty():
            item = self._q.get_nowait()
            if isinstance(item, BaseException):
                raise item
            if item is not _END:
                self._took(item)
                out.append(item)
        return out

    def __iter__(self) -> Iterator[HiddenChunk]:
        if self._loop is not None:
            raise TypeError("this stream was opened for async iteration")
        while True:
            item = self._q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            self._took(item)
            yield item

    async def __aiter__(self) -> AsyncIterator[HiddenChunk]:
        if self._loop is None:
            raise TypeError("this stream was opened for sync iteration")
        try:
            while True:
                item = await self._q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                self._took(item)
                yield item
        finally:
            # The consumer stopped early (finished, error or cancelled): free the row.
            self.cancelled.set()


async def aordered_chunks(streams: list[RowStream]) -> AsyncIterator[tuple[int, HiddenChunk]]:
    """One request's rows read in segment order: (segment index, chunk). Leaving early (the
    reader stopped, an error) cancels every row."""
    try:
        for i, stream in enumerate(streams):
            async for chunk in stream:
                yield i, chunk
    finally:
        for stream in streams:
            stream.cancel()
