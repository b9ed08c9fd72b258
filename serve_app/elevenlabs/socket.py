"""ElevenLabs' input-streaming sockets over the service's streams of speech: ``stream-input`` (one
context, unnamed) and ``multi-stream-input`` (contexts by ``context_id``), as the voice-agent
frameworks' ElevenLabs plugins speak them.

Each context is one ``SpeechFeed`` (``realtime/feed.py``: the native session's text cutting,
segments and ordered audio) admitted as a stream of its own by the door (``open_context``: the
key, the voice, the busy switch, a stream slot held until the context ends), so each counts
against the key's stream limit and each is a real-time stream. What the client sends, per context:

- its first message (``text`` " ", ``voice_settings``) opens it; ``text`` is appended as it comes
  (with ``auto_mode`` each message ends a phrase: nothing of it waits for more text);
- ``flush``: speak what is buffered now;
- ``close_context`` right after a flush (nothing sent since: the end of a turn, as the plugins end
  one) lets the context speak the rest, then ``isFinal``; at any other time (text sent since the
  last flush: a barge-in mid-answer), or a second ``close_context`` while it speaks the rest (a
  barge-in after the turn's text was all sent: Pipecat closes the context again), it stops at
  once: its rows are cancelled at the engine's next decode step, no audio of it follows, then
  ``isFinal``;
- ``text`` "" is a keep-alive on multi-stream-input (it opens nothing), the end of input on
  stream-input (the rest is spoken, ``isFinal``, then the socket closes 1000);
- ``close_socket``: every context closes as above, then the socket closes 1000.

Audio goes out as ``{"audio": base64, "alignment", "normalizedAlignment", "contextId"}``, the
alignment estimated (``alignment.py``). A socket with no context at work and no message for
``inactivity_timeout`` (at most the service's ``idle_s``) is closed (408 ``idle_timeout``); every
error is an ``{"message", "error", "code"}`` message, then the close code 4000 + status.

Plain Python over a ``Transport`` and the door's ``open_context``: no Ray.
"""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

from pydantic import BaseModel, ValidationError

from ..engine.types import SynthesisOptions
from ..errors import APIError, as_api_error, invalid_value
from ..protocol.elevenlabs import AudioMessage, ErrorMessage, FinalMessage, StreamInputMessage, StreamInputParams
from ..realtime.feed import FeedSegment, SpeechFeed
from ..realtime.messages import (
    NORMAL_CLOSURE,
    SessionLimits,
    SessionStats,
    SpeechBackend,
    Transport,
    close_code,
    json_object,
)
from .alignment import Placed, StreamAligner, expected_samples


@dataclass
class OpenedContext:
    """A context past the door's admission: its way into the pipeline, its options, and how to
    give its stream slot back."""

    backend: SpeechBackend
    options: SynthesisOptions
    release: Callable[[], None]


OpenContext = Callable[[StreamInputMessage], Awaitable[OpenedContext]]


class ContextError(Exception):
    """A failure of one context: the socket's error message names it."""

    def __init__(self, context_id: Optional[str], cause: BaseException):
        super().__init__(str(cause))
        self.context_id = context_id
        self.cause = cause


async def receive_stream_input(transport: Transport, limits: SessionLimits) -> Optional[StreamInputMessage]:
    """The client's next message, bounded and validated; None once it has gone."""
    obj = json_object(await transport.receive(), limits)
    if obj is None:
        return None
    try:
        return StreamInputMessage.model_validate(obj)
    except ValidationError as exc:
        raise invalid_value(exc.errors()) from None


class _Context:
    """One context: its feed, and as the feed's sink, its audio out with alignment."""

    def __init__(self, socket: "ElevenLabsSocket", cid: Optional[str], opened: OpenedContext, clause_seconds: float):
        self.socket = socket
        self.id = cid
        self.release = opened.release
        self.aligner = StreamAligner(socket.format)
        self.feed = SpeechFeed(opened.backend, opened.options, socket.format, self, socket.limits, clause_seconds)
        self.input_ended = False  # a flush, and no text since: close_context lets it finish

    def _message(self, data: bytes, placed: tuple[Placed, Placed]) -> AudioMessage:
        original, normalized = placed
        return AudioMessage(
            audio=base64.b64encode(data).decode("ascii"),
            alignment=original.relative() if original else None,
            normalizedAlignment=normalized.relative() if normalized else None,
            contextId=self.id if self.socket.multi else None,
        )

    async def segment_started(self, seg: FeedSegment) -> None:
        self.aligner.segment(seg.source, seg.text, expected_samples(seg.request))

    async def audio(self, seg: FeedSegment, data: bytes) -> None:
        await self.socket.send(self._message(data, self.aligner.audio(len(data))))

    async def segment_done(self, seg: FeedSegment) -> None:
        rest = self.aligner.end_segment()
        if rest[0] or rest[1]:  # it spoke faster than expected: its last characters, no audio
            await self.socket.send(self._message(b"", rest))

    async def finished(self, tail: bytes) -> None:
        if tail:  # the encoding's last bytes (Ogg's end page): no audio in them
            await self.socket.send(self._message(tail, (Placed(), Placed())))


class ElevenLabsSocket:
    """One socket after its handshake's accept: ``run()`` until closed, an error or a disconnect.
    ``multi``: multi-stream-input; ``on_started``: called once its first context is admitted (an
    unstarted socket holds no stream slot: the door caps how many a client keeps)."""

    def __init__(
        self,
        transport: Transport,
        params: StreamInputParams,
        multi: bool,
        open_context: OpenContext,
        limits: SessionLimits,
        clause_seconds: float,
        on_started: Optional[Callable[[], None]] = None,
    ):
        self.transport = transport
        self.params = params
        self.multi = multi
        self.format = params.encoder_format
        self.limits = limits
        self.clause_seconds = clause_seconds
        self.idle_s = min(params.inactivity_timeout, limits.idle_s)
        self.stats = SessionStats()
        self._open_context = open_context
        self._on_started = on_started
        self._contexts: dict[Optional[str], _Context] = {}  # open, by id
        self._ending: list[_Context] = []  # closed, speaking the rest of their input
        self._closing = False  # close_socket, or stream-input's end of input: nothing more is read as input
        self._send_lock = asyncio.Lock()
        self._receive: Optional[asyncio.Future] = None
        self._last_activity = time.perf_counter()

    # -------------------------------------------------------------- out

    async def send(self, message: BaseModel) -> None:
        async with self._send_lock:  # one frame at a time, whichever context sends it
            await self.transport.send_text(message.model_dump_json(exclude_none=True))

    def _all(self) -> list[_Context]:
        return [*self._contexts.values(), *self._ending]

    # -------------------------------------------------------------- contexts

    async def _open(self, cid: Optional[str], msg: StreamInputMessage) -> _Context:
        try:
            opened = await self._open_context(msg)
        except Exception as exc:  # noqa: BLE001 - refused: the socket says which context
            raise ContextError(cid, exc) from None
        ctx = _Context(self, cid, opened, self.clause_seconds)
        self._contexts[cid] = ctx
        ctx.feed.start()
        if self._on_started is not None:
            self._on_started()
        return ctx

    async def _close(self, ctx: _Context) -> None:
        """``close_context``: after its end of input it finishes (its outcome ends it), else it stops now."""
        self._contexts.pop(ctx.id, None)
        if ctx.input_ended:
            ctx.feed.close()
            self._ending.append(ctx)
        else:
            await ctx.feed.cancel()
            await self._end(ctx)

    async def _end(self, ctx: _Context) -> None:
        """The context is over: its feed stopped, ``isFinal``, its stream slot given back."""
        if ctx in self._ending:
            self._ending.remove(ctx)
        self._contexts.pop(ctx.id, None)
        await ctx.feed.stop()
        ctx.release()
        self._count(ctx.feed.stats)
        await self.send(FinalMessage(contextId=ctx.id if self.multi else None))

    def _count(self, s: SessionStats) -> None:
        t = self.stats
        t.chars += s.chars
        t.segments += s.segments
        t.cancelled_segments += s.cancelled_segments
        t.audio_seconds += s.audio_seconds
        if s.first_audio_s is not None and t.first_audio_s is None:
            t.first_audio_s = s.first_audio_s
        if s.stall_s is not None:
            t.stall_s = max(t.stall_s or 0.0, s.stall_s)
        if s.min_slack_s is not None:
            t.min_slack_s = s.min_slack_s if t.min_slack_s is None else min(t.min_slack_s, s.min_slack_s)

    # -------------------------------------------------------------- client messages

    async def _handle(self, msg: StreamInputMessage) -> None:
        if self._closing:
            return  # the socket is closing: what comes now is no input
        if msg.close_socket:
            self._closing = True
            for ctx in list(self._contexts.values()):
                await self._close(ctx)
            return
        cid = msg.context_id if self.multi else None
        ctx = self._contexts.get(cid)
        if msg.close_context:
            if ctx is not None:
                await self._close(ctx)
            else:
                ending = next((c for c in self._ending if c.id == cid), None)
                if ending is not None:  # closed again while it speaks the rest: a barge-in after the turn's end
                    await ending.feed.cancel()
                    await self._end(ending)
            return
        text = msg.text or ""
        if not self.multi and msg.text == "" and not msg.flush:  # stream-input's end of input
            self._closing = True
            if ctx is not None:
                ctx.input_ended = True
                await self._close(ctx)
            return
        if ctx is None:
            if not text:
                return  # a keep-alive, or a flush of nothing: it opens no context
            ctx = await self._open(cid, msg)
        try:
            if text:
                ctx.feed.append(text, complete=self.params.auto_mode)
            if msg.flush:
                ctx.feed.flush()
        except Exception as exc:  # noqa: BLE001 - 413: too much text waiting to be spoken
            raise ContextError(ctx.id, exc) from None
        if msg.flush:  # everything sent so far is to be spoken: its input may end here
            ctx.input_ended = True
        elif text.strip():
            ctx.input_ended = False

    # -------------------------------------------------------------- running

    async def _next(self) -> Optional[StreamInputMessage]:
        """The client's next message; None once it has gone. Meanwhile a context that finished
        gets its ``isFinal``, one that failed ends the socket, and 408 once nothing is at work and
        no message came for ``idle_s``."""
        while True:
            if self._receive is None:
                self._receive = asyncio.ensure_future(receive_stream_input(self.transport, self.limits))
            outcomes = {ctx.feed.outcome: ctx for ctx in self._all()}
            left = self._last_activity + self.idle_s - time.perf_counter()
            done, _ = await asyncio.wait(
                {self._receive, *outcomes}, timeout=max(0.01, left), return_when=asyncio.FIRST_COMPLETED
            )
            for fut in done:
                if fut in outcomes:
                    ctx = outcomes[fut]
                    if fut.exception() is not None:
                        raise ContextError(ctx.id, fut.exception())  # type: ignore[arg-type]
                    await self._end(ctx)
            if self._receive in done:
                receive, self._receive = self._receive, None
                return receive.result()
            if self._closing and not self._all():
                raise _Closed
            if any(not ctx.feed.idle() for ctx in self._all()):
                self._last_activity = time.perf_counter()
            elif time.perf_counter() - self._last_activity >= self.idle_s:
                raise APIError(408, f"no input for {self.idle_s:g} s", code="idle_timeout")

    async def run(self) -> SessionStats:
        try:
            while True:
                if self._closing and not self._all():
                    raise _Closed
                msg = await self._next()
                if msg is None:
                    self.stats.status = "client_disconnect"
                    return self.stats
                self._last_activity = time.perf_counter()
                await self._handle(msg)
        except _Closed:
            self.stats.status = "done"
            await self.transport.close(NORMAL_CLOSURE)
            return self.stats
        except asyncio.CancelledError:
            self.stats.status = "client_disconnect"
            raise
        except Exception as exc:  # noqa: BLE001 - every failure ends the socket with an error message
            cid = exc.context_id if isinstance(exc, ContextError) else None
            error = as_api_error(exc.cause if isinstance(exc, ContextError) else exc)
            self.stats.status = str(error.status)
            await self._stop()
            await self._send_error(error, cid)
            return self.stats
        finally:
            await self._stop()

    async def _send_error(self, error: APIError, cid: Optional[str]) -> None:
        """The error message, then the close code for its status (the client may be gone)."""
        code = close_code(error.status)
        try:
            await self.send(
                ErrorMessage(
                    message=error.message,
                    error=error.code or error.type,
                    code=code,
                    contextId=cid if self.multi else None,
                )
            )
            await self.transport.close(code, error.code or "")
        except Exception:  # noqa: BLE001 - nobody left to tell
            pass

    async def _stop(self) -> None:
        """Every context stops (its synthesis too) and gives its slot back; the read is dropped."""
        if self._receive is not None:
            self._receive.cancel()
            self._receive = None
        for ctx in self._all():
            self._contexts.pop(ctx.id, None)
            if ctx in self._ending:
                self._ending.remove(ctx)
            await ctx.feed.stop()
            ctx.release()
            self._count(ctx.feed.stats)


class _Closed(Exception):
    """The socket's input is over and every context has ended: close 1000."""
