"""A WebSocket session: text in as it is written, audio out in order, barge-in.

The text buffer is cut with the text front end's ``split_unfinished`` as soon as a sentence is
complete (or, past ``clause_seconds`` of speech / ``max_chars``, at a clause). A complete sentence
is spoken at once when nothing is queued before it; behind queued audio, sentences are packed up
to ``clause_seconds`` (as HTTP packs them) until that audio is about to run out. Each cut is planned
by the backend (the TextNormalizer) and each of its segments is sent into the graph
(``backend.audio``: one ``Vocoder.stream`` per segment, as an HTTP request does) as soon as the
segment before it has its first audio and fewer than ``decoding_segments`` of the session are
decoding, so segments decode as parallel rows while earlier ones play, and a first audio never
waits for the rows behind it. Audio leaves strictly in segment order: the
frames of segment ``i`` between ``segment.start`` and ``segment.done``, later segments' audio
waiting in their queues meanwhile.

Each segment has the seed an HTTP request of the same text would give it
(``segment_seed(request seed, index)`` with the session-wide index), so a session cut at the
same places as an HTTP request speaks the same audio.

Encoders: each segment is encoded by its own encoder in the Vocoder (a stage call holds no state
between calls, and the Ingress never loads PyAV). pcm needs nothing more; mp3 is bare MPEG
frames, which concatenate into one valid stream; Ogg Opus is re-paged into one logical stream
(``OggOpusJoiner``), since a chain of Ogg streams is not what players expect.

Plain Python over two small interfaces, a ``SpeechBackend`` (the Serve graph in the Ingress, an
in-process engine in the unit tests) and a ``Transport`` (a Starlette ``WebSocket``): no Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from pydantic import BaseModel

from ..engine.audio import format_bytes_per_second
from ..engine.errors import EmptyInputError
from ..engine.planner import segment_seed
from ..engine.playback import PlaybackClock
from ..engine.text import is_speakable, segment_fits, split_unfinished
from ..engine.types import Plan, SegmentMark, StreamSummary, SynthesisOptions
from ..engine.voices import effective_seed
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
from .ogg import OggOpusJoiner

log = logging.getLogger("chattts_serve.realtime")


MIN_PRIORITY = next(
    m.ge for m in SynthesisOptions.model_fields["priority"].metadata if getattr(m, "ge", None) is not None
)


# ------------------------------------------------------------------ the session


class _PassThrough:
    """pcm, mp3, ulaw and alaw: each segment's bytes go out as they are."""

    def feed(self, data: bytes) -> bytes:
        return data

    def end_segment(self) -> None:
        pass

    def finish(self) -> bytes:
        return b""


_END = object()  # a segment's audio is complete


@dataclass
class _Piece:
    """Text cut from the buffer, being planned."""

    text: str
    task: asyncio.Task  # -> Plan


@dataclass
class _Segment:
    index: int
    text: str  # normalised, as spoken
    chars: int  # received characters it accounts for (text-ahead limit)
    opened: float
    queue: asyncio.Queue
    pump: Optional[asyncio.Task] = None
    audio_seconds: float = 0.0
    # Set at its first audio (or its end): the next segment starts decoding then, so the
    # first audio does not share its decode steps with the rows behind it (HTTP's rule too).
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


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
        self.backend = backend
        self.transport = transport
        self.limits = limits
        self.options = start.to_options()
        self.format = start.response_format
        self.clause_seconds = start.clause_seconds
        self.stats = SessionStats()
        self._on_first_audio = on_first_audio
        self._t0 = time.perf_counter()
        self._buffer = ""  # the unfinished sentence
        self._held = ""  # complete sentences waiting to be packed (see _release)
        self._pieces: deque[_Piece] = deque()
        self._overflow = ""  # text cut while max_pending_cuts were being planned: one cut later
        self._last_activity = time.perf_counter()
        self._segments: deque[_Segment] = deque()
        self._next_index = 0
        self._closing = False
        self._joiner = OggOpusJoiner() if self.format == "opus" else _PassThrough()
        self._piece_added = asyncio.Event()
        self._segment_added = asyncio.Event()
        self._loops: list[asyncio.Task] = []
        self._decoding = asyncio.Semaphore(limits.decoding_segments)
        # The listener's clock over the whole session: raw formats' audio counted as it is sent,
        # compressed ones' at each segment's end (its summary says how long it was).
        self.listener = PlaybackClock()
        self._bytes_per_s = format_bytes_per_second(self.format)
        self._outcome: asyncio.Future = asyncio.get_running_loop().create_future()

    # -------------------------------------------------------------- client messages

    def append(self, text: str) -> None:
        if self._closing:
            raise APIError(400, "text after close", param="type", code="session_closing")
        self.stats.chars += len(text)
        self._buffer += text
        ahead = self._ahead_chars()
        if ahead > self.limits.max_text_chars:
            raise APIError(
                413,
                f"{ahead} characters are waiting to be spoken; the limit is {self.limits.max_text_chars}",
                param="text",
                code="input_too_long",
            )
        complete, self._buffer = split_unfinished(self._buffer, self.limits.max_chars, self.clause_seconds)
        self._held += complete
        self._release()

    def flush(self) -> None:
        self._held, self._buffer = self._held + self._buffer, ""
        self._release(now=True)

    def _release(self, now: bool = False) -> None:
        """Send the held sentences to be spoken: at once when no audio is queued before them (a
        listener is waiting), else once they would speak ``clause_seconds`` (sentences packed into
        segments as an HTTP request's are: fewer rows to prefill, prosody across sentences), or
        when the audio before them is about to run out (``_forward``), or ``now``."""
        waiting = not self._segments and not self._pieces
        if now or waiting or not segment_fits(self._held, self.limits.max_chars, self.clause_seconds):
            text, self._held = self._held, ""
            self._add_piece(text)

    def close(self) -> None:
        self.flush()
        self._closing = True
        self._segment_added.set()

    async def cancel(self) -> None:
        """Barge-in: no frame of any unsent segment goes out after this; the text buffer is dropped."""
        dropped = [s.index for s in self._segments]
        await self._stop()
        self._buffer = self._held = self._overflow = ""
        self._joiner.end_segment()
        self.stats.cancelled_segments += len(dropped)
        await send_event(self.transport, Cancelled(segments=dropped))
        self._start()

    async def _handle(self, msg: BaseModel) -> None:
        if isinstance(msg, TextAppend):
            self.append(msg.text)
        elif isinstance(msg, TextFlush):
            self.flush()
        elif isinstance(msg, Cancel):
            await self.cancel()
        elif isinstance(msg, Close):
            self.close()
        else:
            raise APIError(400, "the session has started already", param="type", code="session_already_started")

    # -------------------------------------------------------------- running

    def _idle(self) -> bool:
        """Nothing is being planned, decoded or sent: the session waits on its client alone."""
        return not self._pieces and not self._segments and not self._overflow

    async def _next_message(self) -> "asyncio.Future":
        """The client's next message (a future), or the session's end; 408 once the session has
        been idle for ``idle_s`` (time spent speaking does not count)."""
        receive = asyncio.ensure_future(receive_message(self.transport, self.limits))
        while True:
            left = self._last_activity + self.limits.idle_s - time.perf_counter()
            done, _ = await asyncio.wait(
                {receive, self._outcome}, timeout=max(0.01, left), return_when=asyncio.FIRST_COMPLETED
            )
            if done:
                return receive
            if not self._idle():
                self._last_activity = time.perf_counter()
            elif time.perf_counter() - self._last_activity >= self.limits.idle_s:
                receive.cancel()
                raise APIError(408, f"the session was idle for {self.limits.idle_s:g} s", code="idle_timeout")

    async def run(self) -> SessionStats:
        """Read the client's messages until the session is done, fails, or the client leaves."""
        self._start()
        try:
            while True:
                receive = await self._next_message()
                self._last_activity = time.perf_counter()
                if self._outcome.done():
                    receive.cancel()
                    self._outcome.result()  # raises the failure of a loop
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
            await self._stop()
            await send_error(self.transport, error)
            return self.stats
        finally:
            await self._stop()

    def _start(self) -> None:
        for loop in (self._dispatch(), self._forward()):
            task = asyncio.ensure_future(loop)
            task.add_done_callback(self._loop_ended)
            self._loops.append(task)

    def _loop_ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or self._outcome.done():
            return
        exc = task.exception()
        if exc is not None:
            self._outcome.set_exception(exc)
        else:
            self._outcome.set_result(None)

    async def _stop(self) -> None:
        """Cancel every loop, plan and segment (the backend stops their synthesis)."""
        tasks = self._loops + [p.task for p in self._pieces] + [s.pump for s in self._segments if s.pump]
        self._loops = []
        self._pieces.clear()
        self._segments.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _ahead_chars(self) -> int:
        return (
            len(self._buffer)
            + len(self._held)
            + len(self._overflow)
            + sum(len(p.text) for p in self._pieces)
            + sum(s.chars for s in self._segments)
        )

    def _add_piece(self, text: str) -> None:
        """Plan ``text`` (one TextNormalizer call); past ``max_pending_cuts`` calls in flight the
        text joins the overflow, planned as one cut once a call returns (a flush flood costs no
        more calls than that)."""
        if len(self._pieces) >= self.limits.max_pending_cuts or self._overflow:
            self._overflow += text
            return
        if not is_speakable(text):  # only punctuation or whitespace: nothing to say
            return
        task = asyncio.ensure_future(self.backend.plan(text, self.options))
        self._pieces.append(_Piece(text, task))
        self._piece_added.set()

    async def _dispatch(self) -> None:
        """Pieces in order: number their segments and start each one's synthesis at once."""
        while True:
            while not self._pieces:
                self._piece_added.clear()
                await self._piece_added.wait()
            piece = self._pieces[0]
            try:
                plan: Optional[Plan] = await piece.task
            except EmptyInputError:  # nothing speakable after normalisation
                plan = None
            self._pieces.popleft()
            if self._overflow and len(self._pieces) < self.limits.max_pending_cuts:
                text, self._overflow = self._overflow, ""
                self._add_piece(text)
            if plan is not None:
                self._open_segments(plan, len(piece.text))
            self._segment_added.set()  # also when nothing was added: the forwarder may be done

    def _open_segments(self, plan: Plan, chars: int) -> None:
        seed = effective_seed(plan.voice, self.options.seed)
        last = len(plan.segments) - 1
        for i, (req, text) in enumerate(zip(plan.segments, plan.texts)):
            index = self._next_index
            self._next_index += 1
            # A segment behind audio still to be sent is needed later: it yields one priority
            # level (admission order only) to first audio, this session's or anyone's.
            priority = req.priority if not self._segments else max(MIN_PRIORITY, req.priority - 1)
            # Its listener plays it as it comes: decoded by its playback deadline (a real-time
            # stream), after the audio it holds already (then it continues the session's stream).
            ahead = max(0.0, self.listener.slack()) if self.listener.started else 0.0
            one = Plan(
                plan.voice,
                [
                    dataclasses.replace(
                        req, seed=segment_seed(seed, index), priority=priority, realtime=True, ahead_s=ahead
                    )
                ],
                [text],
            )
            seg = _Segment(index, text, chars if i == last else 0, time.perf_counter(), asyncio.Queue())
            after = self._segments[-1].started if self._segments else None
            seg.pump = asyncio.ensure_future(self._pump(seg, one, after))
            self._segments.append(seg)

    async def _pump(self, seg: _Segment, plan: Plan, after: Optional[asyncio.Event]) -> None:
        try:
            if after is not None:
                await after.wait()
            async with self._decoding:
                async for item in self.backend.audio(plan, self.format):
                    seg.started.set()
                    seg.queue.put_nowait(item)
            seg.queue.put_nowait(_END)
        except Exception as exc:  # noqa: BLE001 - raised where the segment's audio is sent
            seg.queue.put_nowait(exc)
        finally:
            seg.started.set()

    async def _forward(self) -> None:
        """Segments in order, each whole before the next; ``done`` once closed and all sent."""
        while True:
            while not self._segments:
                if self._closing and not self._pieces and not self._overflow:
                    tail = self._joiner.finish()
                    if tail:
                        await self.transport.send_bytes(tail)
                    await send_event(
                        self.transport,
                        Done(segments=self.stats.segments, audio_seconds=round(self.stats.audio_seconds, 4)),
                    )
                    return
                self._segment_added.clear()
                await self._segment_added.wait()
            seg = self._segments[0]
            await self._send_segment(seg)
            self._segments.popleft()
            if len(self._segments) <= 1 and not self._pieces:
                self._release(now=True)  # the queued audio is about to run out: speak what is held

    async def _send_segment(self, seg: _Segment) -> None:
        started = False
        timeout = self.limits.segment_timeout_s
        while True:
            try:
                item = await asyncio.wait_for(seg.queue.get(), max(0.001, seg.opened + timeout - time.perf_counter()))
            except asyncio.TimeoutError:
                raise APIError(
                    504,
                    f"segment {seg.index} had no complete audio within {timeout:g}s",
                    type="server_error",
                    code="timeout",
                ) from None
            if item is _END:
                break
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, StreamSummary):
                seg.audio_seconds = item.audio_seconds
                continue
            if isinstance(item, SegmentMark):  # one segment per stream here: its summary times it
                continue
            data = self._joiner.feed(item)
            if not data:
                continue
            if not started:
                await send_event(self.transport, SegmentStart(index=seg.index, text=seg.text))
                started = True
            if self.stats.first_audio_s is None:
                self.stats.first_audio_s = time.perf_counter() - self._t0
                if self._on_first_audio is not None:
                    self._on_first_audio()
            await self.transport.send_bytes(data)
            if self._bytes_per_s:
                self.listener.deliver(len(data) / self._bytes_per_s)
        self._joiner.end_segment()
        if not self._bytes_per_s:
            self.listener.deliver(seg.audio_seconds)
        self.stats.stall_s, self.stats.min_slack_s = round(self.listener.stall_s, 3), self.listener.min_slack_s
        if not started:
            await send_event(self.transport, SegmentStart(index=seg.index, text=seg.text))
        start = self.stats.audio_seconds  # on the session's audio timeline: its segments back to back
        self.stats.segments += 1
        self.stats.audio_seconds += seg.audio_seconds
        await send_event(
            self.transport,
            SegmentDone(
                index=seg.index,
                audio_seconds=round(seg.audio_seconds, 4),
                start=round(start, 6),
                end=round(self.stats.audio_seconds, 6),
            ),
        )
