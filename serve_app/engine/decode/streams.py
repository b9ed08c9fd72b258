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
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import torch


@dataclass
class HiddenChunk:
    """Hidden states of consecutive tokens of one row, ``hidden`` is (n, 768) float32 on CPU."""

    hidden: torch.Tensor
    index: int  # chunk number in the row
    start_token: int  # index of the first token of this chunk in the row
    final: bool = False
    finish_reason: Optional[str] = None  # "stop" | "length" on the final chunk (a cancelled row just ends)


_END = object()


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
        self.on_taken: Optional[Callable[["RowStream"], None]] = None  # the engine's wake-up while parked

    @property
    def backlog(self) -> int:
        """Chunks sent that the consumer has not taken yet."""
        return self.sent_chunks - self.taken_chunks

    def _took(self) -> None:
        self.taken_chunks += 1
        hook = self.on_taken
        if hook is not None:
            hook(self)

    @property
    def started(self) -> bool:
        """Has sent its first chunk, or will never send one (ended, cancelled)."""
        return self.first_chunk_at is not None or self.ended or self.cancelled.is_set()

    # ------------------------------------------------------------------ producer (engine thread)

    def send(self, chunk: HiddenChunk) -> None:
        """Deliver a chunk; a ``final`` one also ends the stream."""
        if self.ended:
            return
        if self.first_chunk_at is None:
            self.first_chunk_at = time.monotonic()
        self.sent_chunks += 1
        self._put(chunk)
        if chunk.final:
            self.finished_at = time.monotonic()
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
                self._took()
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
            self._took()
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
                self._took()
                yield item
        finally:
            # The consumer stopped early (finished, error or cancelled): free the row.
            self.cancelled.set()
