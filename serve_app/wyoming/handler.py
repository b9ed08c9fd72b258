"""One Wyoming client connection: its events read (bounded) while its syntheses run, in order,
on the service.

Reading never waits for a synthesis, so a client that hangs up is seen at once: its synthesis is
cancelled, which closes the HTTP stream or the WebSocket and so stops the service's work. Any
error ends the connection after an ``error`` event (as other Wyoming servers do): Home Assistant
then stops waiting for audio at once.

    synthesize                      -> audio-start, audio-chunk..., audio-stop   (POST /v1/audio/speech, pcm)
    synthesize-start                -> a WebSocket session (WS /v1/audio/speech/stream, pcm)
    synthesize-chunk...             -> text.append each: audio from the first complete sentence on
    synthesize (during a stream)    -> ignored: the whole text, sent for older servers
    synthesize-stop                 -> close; audio-stop, synthesize-stopped once all is spoken
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Awaitable, Callable, Optional

from wyoming.event import Event, async_write_event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from ..errors import APIError
from .config import WyomingConfig
from .events import (
    PcmChunks,
    SpeechOptions,
    SynthesizeChunkData,
    SynthesizeData,
    SynthesizeStartData,
    check_text,
    error_event,
    info_event,
    parse,
    read_event,
    speech_options,
)
from .service import ServiceClient, service_error, unexpected

log = logging.getLogger("chattts_serve.wyoming")
WRITE_TIMEOUT_S = 30.0  # a client that takes no event for this long is treated as gone


class ClientGone(Exception):
    """Writing to the client failed or stalled: nobody to answer."""


class ConnectionGate:
    """The server's open connections: at most ``limit`` in all and ``per_peer`` of one peer address,
    so one host holding sockets open cannot take every connection from the others."""

    def __init__(self, limit: int, per_peer: Optional[int] = None):
        self.limit = limit
        self.per_peer = per_peer if per_peer is not None else limit
        self.open = 0
        self.peers: dict[str, int] = {}

    def enter(self, peer: str = "") -> Optional[APIError]:
        """None if the connection may open (then ``leave(peer)`` once it ends), else why not."""
        if self.peers.get(peer, 0) >= self.per_peer:
            return APIError(
                503,
                f"this address has {self.per_peer} connections open already; close one first",
                code="too_many_connections_from_peer",
            )
        if self.open >= self.limit:
            return APIError(503, "too many connections; retry shortly", code="too_many_connections")
        self.open += 1
        self.peers[peer] = self.peers.get(peer, 0) + 1
        return None

    def leave(self, peer: str = "") -> None:
        self.open -= 1
        left = self.peers.get(peer, 0) - 1
        if left > 0:
            self.peers[peer] = left
        else:
            self.peers.pop(peer, None)


def peer_of(writer: asyncio.StreamWriter) -> str:
    """A connection's peer address (its host, not its port); every unix:// client is one peer."""
    name = writer.get_extra_info("peername")
    return str(name[0]) if isinstance(name, (tuple, list)) and name else "local"


class TextStream:
    """A stream's text between ``synthesize-chunk`` and the WebSocket, at most ``max_chars``
    not yet handed on (the service bounds what waits to be spoken itself)."""

    def __init__(self, max_chars: int):
        self.max_chars = max_chars
        self.chars = 0
        self._pieces: asyncio.Queue[Optional[str]] = asyncio.Queue()

    def put(self, text: str) -> None:
        if self.chars + len(text) > self.max_chars:
            raise APIError(
                413,
                f"more than {self.max_chars} characters of streamed text waiting for the service",
                param="text",
                code="request_too_large",
            )
        self.chars += len(text)
        self._pieces.put_nowait(text)

    def end(self) -> None:
        self._pieces.put_nowait(None)

    async def get(self) -> Optional[str]:
        text = await self._pieces.get()
        if text:
            self.chars -= len(text)
        return text


class WyomingHandler(AsyncEventHandler):
    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        service: ServiceClient,
        settings: WyomingConfig,
        gate: ConnectionGate,
        version: Optional[str] = None,
    ):
        super().__init__(reader, writer)
        self.service = service
        self.settings = settings
        self.limits = settings.limits
        self.gate = gate
        self.version = version
        self._write_lock = asyncio.Lock()
        self._jobs: asyncio.Queue[Callable[[], Awaitable[None]]] = asyncio.Queue()
        self._busy = 0  # syntheses running or waiting
        self._stream: Optional[TextStream] = None  # between synthesize-start and synthesize-stop

    # ------------------------------------------------------------------ the connection

    async def run(self) -> None:
        peer = peer_of(self.writer)
        refused = self.gate.enter(peer)
        if refused is not None:
            await self._last_words(refused)
            return
        tasks = [asyncio.create_task(self._read_events()), asyncio.create_task(self._work())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            self.gate.leave(peer)
        failure = next((r for r in results if isinstance(r, Exception)), None)
        # A reset while reading is the client's going too (service failures are APIErrors by now).
        if failure is None or isinstance(failure, (ClientGone, ConnectionError)):
            self.writer.close()
            return
        await self._last_words(unexpected(failure))

    async def _last_words(self, err: APIError) -> None:
        """An ``error`` event (if the client still takes it), then the end of the connection."""
        with contextlib.suppress(ClientGone):
            await self.write_event(error_event(err))
        self.writer.close()

    async def write_event(self, event: Event) -> None:
        async with self._write_lock:
            try:
                await asyncio.wait_for(async_write_event(event, self.writer), WRITE_TIMEOUT_S)
            except (ConnectionError, asyncio.TimeoutError, RuntimeError) as exc:  # RuntimeError: a closed transport
                raise ClientGone(str(exc)) from None

    async def _read_events(self) -> None:
        """Events until the client hangs up; a connection with nothing to speak and no event but
        pings for ``idle_timeout_s`` is closed (a ping answers, but keeps nothing open). The read
        is never cancelled half-way through an event."""
        pending: Optional[asyncio.Task] = None
        active = time.monotonic()  # the last event other than a ping
        try:
            while True:
                if pending is None:
                    pending = asyncio.create_task(read_event(self.reader, self.limits.max_event_bytes))
                wait = max(0.0, active + self.limits.idle_timeout_s - time.monotonic())
                done, _ = await asyncio.wait({pending}, timeout=wait)
                if not done:
                    if self._busy == 0 and self._stream is None:
                        raise APIError(408, "no event for too long", code="idle_timeout")
                    active = time.monotonic()  # speaking is not idling
                    continue
                event, pending = pending.result(), None
                if event is None:
                    return  # the client hung up
                if not Ping.is_type(event.type):
                    active = time.monotonic()
                await self.handle_event(event)
        finally:
            if pending is not None:
                pending.cancel()

    async def _work(self) -> None:
        """The connection's syntheses, one after another, in the order they were asked for."""
        while True:
            job = await self._jobs.get()
            try:
                await job()
            finally:
                self._busy -= 1

    def _enqueue(self, job: Callable[[], Awaitable[None]]) -> None:
        if self._busy >= self.limits.max_synthesize_per_connection:
            raise APIError(
                429,
                f"at most {self.limits.max_synthesize_per_connection} syntheses per connection at once",
                type="rate_limit_error",
                code="too_many_requests",
            )
        self._busy += 1
        self._jobs.put_nowait(job)

    # ------------------------------------------------------------------ events

    async def handle_event(self, event: Event) -> bool:
        handler = EVENTS.get(event.type)
        if handler is not None:  # anything else is not for a TTS server: ignored, as Wyoming servers do
            await handler(self, event)
        return True

    async def _on_describe(self, event: Event) -> None:
        await self.write_event(info_event(await self.service.voices(), self.version))

    async def _on_ping(self, event: Event) -> None:
        await self.write_event(Pong(text=Ping.from_event(event).text).event())

    async def _on_synthesize(self, event: Event) -> None:
        if self._stream is not None:  # during a stream it repeats the chunks' text for older servers
            return
        data = parse(SynthesizeData, event)
        text = check_text(data.text, self.limits.max_text_chars)
        options = speech_options(data, self.settings.voice)
        self._enqueue(lambda: self._synthesize(text, options))

    async def _on_synthesize_start(self, event: Event) -> None:
        if self._stream is not None:
            raise APIError(400, "synthesize-start while a stream is open", code="invalid_event")
        options = speech_options(parse(SynthesizeStartData, event), self.settings.voice)
        options.session_fields()  # refused now, not once the stream's turn comes
        stream = TextStream(self.limits.max_text_chars)
        self._enqueue(lambda: self._synthesize_stream(stream, options))
        self._stream = stream

    async def _on_synthesize_chunk(self, event: Event) -> None:
        if self._stream is None:
            raise APIError(400, "synthesize-chunk outside a stream (synthesize-start first)", code="invalid_event")
        text = parse(SynthesizeChunkData, event).text
        self._stream.put(check_text(text, self.limits.max_text_chars))

    async def _on_synthesize_stop(self, event: Event) -> None:
        if self._stream is None:
            raise APIError(400, "synthesize-stop outside a stream", code="invalid_event")
        self._stream.end()
        self._stream = None

    # ------------------------------------------------------------------ syntheses

    async def _synthesize(self, text: str, options: SpeechOptions) -> None:
        audio = PcmChunks(self.limits.samples_per_chunk)
        t0 = time.perf_counter()
        first: Optional[float] = None
        try:
            await self.service.ensure_key()
            async with contextlib.aclosing(self.service.speak(text, options)) as stream:
                async for data in stream:
                    first = first if first is not None else time.perf_counter() - t0
                    for event in audio.feed(data):
                        await self.write_event(event)
        except ClientGone:
            raise
        except Exception as exc:
            raise service_error(exc, self.service.base_url) from None
        for event in audio.stop():
            await self.write_event(event)
        self._log("synthesize", options, len(text), audio, first, t0)

    async def _synthesize_stream(self, stream: TextStream, options: SpeechOptions) -> None:
        audio = PcmChunks(self.limits.samples_per_chunk)
        t0 = time.perf_counter()
        first: Optional[float] = None
        try:
            await self.service.ensure_key()
            async with self.service.session(options) as session:
                sender = asyncio.create_task(self._send_text(session, stream))
                try:
                    async for item in session.receive():
                        if isinstance(item, bytes):
                            first = first if first is not None else time.perf_counter() - t0
                            for event in audio.feed(item):
                                await self.write_event(event)
                        elif item.get("type") == "session.created":
                            audio.rate = int(item["sample_rate"])
                finally:
                    sender.cancel()
                    await asyncio.gather(sender, return_exceptions=True)
        except ClientGone:
            raise
        except Exception as exc:
            raise service_error(exc, self.service.base_url) from None
        for event in audio.stop():
            await self.write_event(event)
        await self.write_event(SynthesizeStopped().event())
        self._log("stream", options, None, audio, first, t0)

    @staticmethod
    async def _send_text(session, stream: TextStream) -> None:
        from websockets.exceptions import ConnectionClosed

        with contextlib.suppress(ConnectionClosed):  # the service ended the session: receive() says why
            while (text := await stream.get()) is not None:
                await session.append(text)
            await session.close()

    def _log(
        self,
        kind: str,
        options: SpeechOptions,
        chars: Optional[int],
        audio: PcmChunks,
        first: Optional[float],
        t0: float,
    ) -> None:
        log.info(
            "%s voice=%s chars=%s audio_s=%.2f first_audio_s=%s total_s=%.2f",
            kind,
            options.voice[:64],
            chars if chars is not None else "-",
            audio.samples / audio.rate,
            f"{first:.3f}" if first is not None else "-",
            time.perf_counter() - t0,
        )


# The events this server acts on, by type: what ``handle_event`` dispatches, and what
# docs/operations.md's table of routes and messages lists (tests/unit/test_route_rules.py holds
# the two together). Every event, these and the ignored ones, is read bounded (``read_event``).
EVENTS: dict[str, Callable[[WyomingHandler, Event], Awaitable[None]]] = {
    Describe().event().type: WyomingHandler._on_describe,
    Ping().event().type: WyomingHandler._on_ping,
    Synthesize(text="").event().type: WyomingHandler._on_synthesize,
    SynthesizeStart().event().type: WyomingHandler._on_synthesize_start,
    SynthesizeChunk(text="").event().type: WyomingHandler._on_synthesize_chunk,
    SynthesizeStop().event().type: WyomingHandler._on_synthesize_stop,
}
