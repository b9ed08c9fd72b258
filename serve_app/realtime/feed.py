"""One stream of speech from text that is still being written: text in, audio out in order. A
WebSocket session (``session.py``) is one; so is each context of an ElevenLabs socket
(``serve_app/elevenlabs/``). Both doors speak through this one piece, over the speech pipeline.

``TextBuffer`` holds the text not yet sent to be spoken. It is cut with the text front end's
``split_unfinished`` as soon as a sentence is complete (or, past ``clause_seconds`` of speech /
``max_chars``, at a clause). A complete sentence is spoken at once when nothing is queued before
it; behind queued audio, sentences are packed up to ``clause_seconds`` (as HTTP packs them) until
that audio is about to run out.

``SpeechFeed`` plans each cut (the backend: the TextNormalizer) and sends each of its segments
into the graph (``backend.audio``: one ``Vocoder.stream`` per segment, as an HTTP request does) as
soon as the segment before it has its first audio and fewer than ``decoding_segments`` of the
stream are decoding, so segments decode as parallel rows while earlier ones play, and a first
audio never waits for the rows behind it. Audio leaves strictly in segment order through the
door's ``FeedSink``: segment ``i``'s start, its audio, its end, later segments' audio waiting in
their queues meanwhile.

Each segment has the seed an HTTP request of the same text would give it (``segment_seed(request
seed, index)`` with the stream-wide index), so a stream cut at the same places as an HTTP request
speaks the same audio. Each is a real-time stream: its listener plays it at 1x
(``SegmentRequest.realtime``), and a later segment continues the stream (``ahead_s``: the audio its
listener holds, from the stream's ``PlaybackClock``).

Encoders: each segment is encoded by its own encoder in the Vocoder (a stage call holds no state
between calls, and the Ingress never loads PyAV). Raw formats need nothing more; mp3 is bare MPEG
frames, which concatenate into one valid stream; Ogg Opus is re-paged into one logical stream
(``OggOpusJoiner``), since a chain of Ogg streams is not what players expect.

Plain Python over a ``SpeechBackend`` (the Serve graph in the Ingress, an in-process engine in
the unit tests) and the door's sink: no Ray.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional, Protocol

from ..engine.audio import format_bytes_per_second
from ..engine.errors import EmptyInputError
from ..engine.planner import segment_seed
from ..engine.playback import PlaybackClock
from ..engine.text import is_speakable, segment_fits, split_unfinished
from ..engine.types import Plan, SegmentMark, SegmentRequest, StreamSummary, SynthesisOptions
from ..engine.voices import effective_seed
from ..errors import APIError
from ..protocol import CLAUSE_SECONDS
from .messages import SessionLimits, SessionStats, SpeechBackend
from .ogg import OggOpusJoiner

MIN_PRIORITY = next(
    m.ge for m in SynthesisOptions.model_fields["priority"].metadata if getattr(m, "ge", None) is not None
)


class TextBuffer:
    """Text not yet sent to be spoken: ``append`` (cut by ``split_unfinished``: complete
    sentences are held, the unfinished one waits for more), ``flush`` (all of it is complete),
    ``take`` (the held sentences, now or once packed)."""

    def __init__(self, max_chars: int, clause_seconds: float):
        self.max_chars = max_chars
        self.clause_seconds = clause_seconds
        self.unfinished = ""  # the unfinished sentence
        self.held = ""  # complete sentences waiting to be packed (see take)

    def __len__(self) -> int:
        return len(self.unfinished) + len(self.held)

    def append(self, text: str, complete: bool = False) -> None:
        """``complete``: the text ends where it ends (a phrase sent whole: ElevenLabs' ``auto_mode``),
        so nothing of it waits for more text; it is still packed behind queued audio."""
        text = self.unfinished + text
        if complete:
            done, self.unfinished = text, ""
        else:
            done, self.unfinished = split_unfinished(text, self.max_chars, self.clause_seconds)
        self.held += done

    def flush(self) -> None:
        """Everything buffered is complete: speak it even mid-sentence."""
        self.held, self.unfinished = self.held + self.unfinished, ""

    def take(self, now: bool) -> str:
        """The held sentences to speak: all of them ``now`` (nothing is queued before them: a
        listener is waiting; a flush; the audio before them about to run out), else once they
        would speak ``clause_seconds`` (sentences packed into segments as an HTTP request's are:
        fewer rows to prefill, prosody across sentences); "" while they wait."""
        if now or not segment_fits(self.held, self.max_chars, self.clause_seconds):
            text, self.held = self.held, ""
            return text
        return ""

    def clear(self) -> None:
        self.unfinished = self.held = ""


class _PassThrough:
    """pcm (any rate), mp3, ulaw and alaw: each segment's bytes go out as they are."""

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
class FeedSegment:
    """One segment of a stream, as its sink sees it."""

    index: int
    text: str  # normalised, as spoken
    source: str  # the received text it accounts for (a cut's text shared out by the plan's spans)
    request: SegmentRequest  # what was sent to the graph (its expected length: target_tokens, text)
    opened: float
    queue: asyncio.Queue
    pump: Optional[asyncio.Task] = None
    audio_seconds: float = 0.0
    start: float = 0.0  # on the stream's audio timeline (its segments back to back), once sent
    end: float = 0.0
    # Set at its first audio (or its end): the next segment starts decoding then, so the
    # first audio does not share its decode steps with the rows behind it (HTTP's rule too).
    started: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


class FeedSink(Protocol):
    """Where a stream's audio goes, in order (the door's protocol)."""

    async def segment_started(self, seg: FeedSegment) -> None:
        """Before the segment's first audio (or before its end, when it has none)."""

    async def audio(self, seg: FeedSegment, data: bytes) -> None: ...

    async def segment_done(self, seg: FeedSegment) -> None:
        """Its audio is all sent (``audio_seconds``, ``start``, ``end`` set)."""

    async def finished(self, tail: bytes) -> None:
        """Closed and everything sent; ``tail``: the encoding's last bytes (Ogg's end page)."""


def share_out(text: str, starts: list[Optional[int]]) -> list[str]:
    """``text`` shared out among segments that start at ``starts`` in it: each from its own start
    to the next one's, the first from 0, the last to the end, so the pieces join back to ``text``.
    Without usable starts (one missing, out of order) the last segment has it all."""
    n = len(starts)
    if n == 0:
        return []
    if any(s is None for s in starts) or starts != sorted(starts):  # type: ignore[type-var]
        return [""] * (n - 1) + [text]
    cuts = [0, *starts[1:], len(text)]
    return [text[cuts[i] : cuts[i + 1]] for i in range(n)]  # type: ignore[misc]


def segment_sources(text: str, plan: Plan) -> list[str]:
    """``text`` (a cut, as received) shared out among the plan's segments by where each came from
    (``plan.spans``)."""
    return share_out(
        text, [span[0] if span is not None else None for span in map(plan.span_of, range(len(plan.segments)))]
    )


class SpeechFeed:
    """One stream: ``start()`` its loops, then ``append`` / ``flush`` / ``close`` / ``cancel``;
    ``outcome`` resolves once closed and all sent (or raises a loop's failure). ``stop()`` ends it
    (its segments' synthesis stops)."""

    def __init__(
        self,
        backend: SpeechBackend,
        options: SynthesisOptions,
        response_format: str,
        sink: FeedSink,
        limits: SessionLimits = SessionLimits(),
        clause_seconds: float = CLAUSE_SECONDS,
        on_first_audio: Optional[Callable[[], None]] = None,
    ):
        self.backend = backend
        self.options = options
        self.format = response_format
        self.sink = sink
        self.limits = limits
        self.stats = SessionStats()
        self.text = TextBuffer(limits.max_chars, clause_seconds)
        self._on_first_audio = on_first_audio
        self._t0 = time.perf_counter()
        self._pieces: deque[_Piece] = deque()
        self._overflow = ""  # text cut while max_pending_cuts were being planned: one cut later
        self.segments: deque[FeedSegment] = deque()
        self._next_index = 0
        self.closing = False
        self._joiner = OggOpusJoiner() if self.format == "opus" else _PassThrough()
        self._piece_added = asyncio.Event()
        self._segment_added = asyncio.Event()
        self._loops: list[asyncio.Task] = []
        self._decoding = asyncio.Semaphore(limits.decoding_segments)
        # The listener's clock over the whole stream: raw formats' audio counted as it is sent,
        # compressed ones' at each segment's end (its summary says how long it was).
        self.listener = PlaybackClock()
        self._bytes_per_s = format_bytes_per_second(self.format)
        self.outcome: asyncio.Future = asyncio.get_running_loop().create_future()

    # -------------------------------------------------------------- text in

    def append(self, text: str, complete: bool = False) -> None:
        if self.closing:
            raise APIError(400, "text after close", param="type", code="session_closing")
        self.stats.chars += len(text)
        ahead = self.ahead_chars() + len(text)  # checked before the text is cut: bounded work
        if ahead > self.limits.max_text_chars:
            raise APIError(
                413,
                f"{ahead} characters are waiting to be spoken; the limit is {self.limits.max_text_chars}",
                param="text",
                code="input_too_long",
            )
        self.text.append(text, complete)
        self._release()

    def flush(self) -> None:
        self.text.flush()
        self._release(now=True)

    def close(self) -> None:
        """Speak the rest, then ``finished``."""
        self.flush()
        self.closing = True
        self._segment_added.set()

    def _release(self, now: bool = False) -> None:
        """Send the held sentences to be spoken: at once when no audio is queued before them (a
        listener is waiting), else as ``TextBuffer.take`` packs them, or when the audio before
        them is about to run out (``_forward``), or ``now``."""
        text = self.text.take(now or (not self.segments and not self._pieces))
        if text:
            self._add_piece(text)

    # -------------------------------------------------------------- running

    def idle(self) -> bool:
        """Nothing is being planned, decoded or sent: the stream waits on its client alone."""
        return not self._pieces and not self.segments and not self._overflow

    def ahead_chars(self) -> int:
        """Received text not spoken yet: buffered, being planned, or cut and not yet sent."""
        return (
            len(self.text)
            + len(self._overflow)
            + sum(len(p.text) for p in self._pieces)
            + sum(len(s.source) for s in self.segments)
        )

    def start(self) -> None:
        for loop in (self._dispatch(), self._forward()):
            task = asyncio.ensure_future(loop)
            task.add_done_callback(self._loop_ended)
            self._loops.append(task)

    def _loop_ended(self, task: asyncio.Task) -> None:
        if task.cancelled() or self.outcome.done():
            return
        exc = task.exception()
        if exc is not None:
            self.outcome.set_exception(exc)
        else:
            self.outcome.set_result(None)

    async def stop(self) -> None:
        """Cancel every loop, plan and segment (the backend stops their synthesis)."""
        tasks = self._loops + [p.task for p in self._pieces] + [s.pump for s in self.segments if s.pump]
        self._loops = []
        self._pieces.clear()
        self.segments.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def cancel(self) -> list[int]:
        """Barge-in: no audio of any unsent segment goes to the sink after this, and the text is
        dropped (``stop()``, then the buffers); ``start()`` goes on with the stream. Returns the
        dropped segments."""
        dropped = [s.index for s in self.segments]
        await self.stop()
        self.text.clear()
        self._overflow = ""
        self._joiner.end_segment()
        self.stats.cancelled_segments += len(dropped)
        return dropped

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
                self._open_segments(plan, piece.text)
            self._segment_added.set()  # also when nothing was added: the forwarder may be done

    def _open_segments(self, plan: Plan, text: str) -> None:
        seed = effective_seed(plan.voice, self.options.seed)
        for req, spoken, source in zip(plan.segments, plan.texts, segment_sources(text, plan)):
            index = self._next_index
            self._next_index += 1
            # A segment behind audio still to be sent is needed later: it yields one priority
            # level (admission order only) to first audio, this stream's or anyone's.
            priority = req.priority if not self.segments else max(MIN_PRIORITY, req.priority - 1)
            # Its listener plays it as it comes: decoded by its playback deadline (a real-time
            # stream), after the audio it holds already (then it continues the stream).
            ahead = max(0.0, self.listener.slack()) if self.listener.started else 0.0
            one = dataclasses.replace(
                req, seed=segment_seed(seed, index), priority=priority, realtime=True, ahead_s=ahead
            )
            seg = FeedSegment(index, spoken, source, one, time.perf_counter(), asyncio.Queue())
            after = self.segments[-1].started if self.segments else None
            seg.pump = asyncio.ensure_future(self._pump(seg, Plan(plan.voice, [one], [spoken]), after))
            self.segments.append(seg)

    async def _pump(self, seg: FeedSegment, plan: Plan, after: Optional[asyncio.Event]) -> None:
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
        """Segments in order, each whole before the next; ``finished`` once closed and all sent."""
        while True:
            while not self.segments:
                if self.closing and not self._pieces and not self._overflow:
                    await self.sink.finished(self._joiner.finish())
                    return
                self._segment_added.clear()
                await self._segment_added.wait()
            seg = self.segments[0]
            await self._send_segment(seg)
            self.segments.popleft()
            if len(self.segments) <= 1 and not self._pieces:
                self._release(now=True)  # the queued audio is about to run out: speak what is held

    async def _send_segment(self, seg: FeedSegment) -> None:
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
                await self.sink.segment_started(seg)
                started = True
            if self.stats.first_audio_s is None:
                self.stats.first_audio_s = time.perf_counter() - self._t0
                if self._on_first_audio is not None:
                    self._on_first_audio()
            await self.sink.audio(seg, data)
            if self._bytes_per_s:
                self.listener.deliver(len(data) / self._bytes_per_s)
        self._joiner.end_segment()
        if not self._bytes_per_s:
            self.listener.deliver(seg.audio_seconds)
        self.stats.stall_s, self.stats.min_slack_s = round(self.listener.stall_s, 3), self.listener.min_slack_s
        if not started:
            await self.sink.segment_started(seg)
        seg.start = self.stats.audio_seconds  # on the stream's audio timeline: its segments back to back
        self.stats.segments += 1
        self.stats.audio_seconds += seg.audio_seconds
        seg.end = self.stats.audio_seconds
        await self.sink.segment_done(seg)
