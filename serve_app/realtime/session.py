"""A WebSocket session: text in as it is written, audio out in order, barge-in.

The speech itself is one ``SpeechFeed`` (``feed.py``: the text buffer and its cutting, segments
planned and decoded as parallel rows, audio in order), which each context of an ElevenLabs socket
uses too. The session is the native protocol around it: the client's messages (``text.append``,
``text.flush``, ``cancel``, ``close``) in, and as the feed's sink, the audio as binary frames of
segment ``i`` between ``segment.start`` and ``segment.done``, ``cancelled`` and ``done`` events.

Plain Python over two small interfaces, a ``SpeechBackend`` (the Serve graph in the Ingress, an
in-process engine in the unit tests) and a ``Transport`` (a Starlette ``WebSocket``): no Ray.
"""

from __future__ import annotations

import asyncio
import time
from typing import Callable, Optional

from pydantic import BaseModel

from ..errors import APIError, as_api_error
from ..protocol import (
    Cancel,
    Cancelled,
    Close,
    Done,
    SegmentDone,
    SegmentStart,
    SessionStart,
    TextAppend,
    TextFlush,
)
from .feed import FeedSegment, SpeechFeed
from .messages import (
    NORMAL_CLOSURE,
    SessionLimits,
    SessionStats,
    SpeechBackend,
    Transport,
    receive_message,
    send_error,
    send_event,
)


class RealtimeSession:
    """One session after its ``session.start``: ``run()`` until done, an error or a disconnect."""

    def __init__(
        self,
        backend: SpeechBackend,
        start: SessionStart,
        transport: Transport,
        limits: SessionLimits = SessionLimits(),
        on_first_audio: Optional[Callable[[], None]] = None,
    ):
        self.transport = transport
        self.limits = limits
        self.feed = SpeechFeed(
            backend, start.to_options(), start.response_format, self, limits, start.clause_seconds, on_first_audio
        )
        self._last_activity = time.perf_counter()

    @property
    def stats(self) -> SessionStats:
        return self.feed.stats

    # -------------------------------------------------------------- client messages

    async def cancel(self) -> None:
        """Barge-in: no frame of any unsent segment goes out after this; the text buffer is dropped."""
        dropped = await self.feed.cancel()
        await send_event(self.transport, Cancelled(segments=dropped))
        self.feed.start()

    async def _handle(self, msg: BaseModel) -> None:
        if isinstance(msg, TextAppend):
            self.feed.append(msg.text)
        elif isinstance(msg, TextFlush):
            self.feed.flush()
        elif isinstance(msg, Cancel):
            await self.cancel()
        elif isinstance(msg, Close):
            self.feed.close()
        else:
            raise APIError(400, "the session has started already", param="type", code="session_already_started")

    # -------------------------------------------------------------- the feed's sink: events out

    async def segment_started(self, seg: FeedSegment) -> None:
        await send_event(self.transport, SegmentStart(index=seg.index, text=seg.text))

    async def audio(self, seg: FeedSegment, data: bytes) -> None:
        await self.transport.send_bytes(data)

    async def segment_done(self, seg: FeedSegment) -> None:
        await send_event(
            self.transport,
            SegmentDone(
                index=seg.index,
                audio_seconds=round(seg.audio_seconds, 4),
                start=round(seg.start, 6),
                end=round(seg.end, 6),
            ),
        )

    async def finished(self, tail: bytes) -> None:
        if tail:
            await self.transport.send_bytes(tail)
        await send_event(
            self.transport, Done(segments=self.stats.segments, audio_seconds=round(self.stats.audio_seconds, 4))
        )

    # -------------------------------------------------------------- running

    async def _next_message(self) -> "asyncio.Future":
        """The client's next message (a future), or the session's end; 408 once the session has
        been idle for ``idle_s`` (time spent speaking does not count)."""
        receive = asyncio.ensure_future(receive_message(self.transport, self.limits))
        while True:
            left = self._last_activity + self.limits.idle_s - time.perf_counter()
            done, _ = await asyncio.wait(
                {receive, self.feed.outcome}, timeout=max(0.01, left), return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                return receive
            if not self.feed.idle():
                self._last_activity = time.perf_counter()
            elif time.perf_counter() - self._last_activity >= self.limits.idle_s:
                receive.cancel()
                raise APIError(408, f"the session was idle for {self.limits.idle_s:g} s", code="idle_timeout")

    async def run(self) -> SessionStats:
        """Read the client's messages until the session is done, fails, or the client leaves."""
        self.feed.start()
        try:
            while True:
                receive = await self._next_message()
                self._last_activity = time.perf_counter()
                if self.feed.outcome.done():
                    receive.cancel()
                    self.feed.outcome.result()  # raises the failure of a loop
                    self.stats.status = "done"
                    await self.transport.close(NORMAL_CLOSURE)
                    return self.stats
                msg = receive.result()
                if msg is None:
                    self.stats.status = "client_disconnect"
                    return self.stats
                await self._handle(msg)
        except asyncio.CancelledError:
            self.stats.status = "client_disconnect"
            raise
        except Exception as exc:  # noqa: BLE001 - every failure ends the session with an error event
            error = as_api_error(exc)
            self.stats.status = str(error.status)
            await self.feed.stop()
            await send_error(self.transport, error)
            return self.stats
        finally:
            await self.feed.stop()
