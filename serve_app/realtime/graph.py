"""A WebSocket session inside the Serve graph: the session (``session.py``) over the Ingress's
handles, admitted like an HTTP request (key, model, voice, busy switch, stream slot)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Optional, Union

from ..engine.audio import format_sample_rate
from ..engine.text.lexicon import Pronunciations
from ..engine.types import Plan, StreamSummary, Voice
from ..errors import as_api_error
from ..http.request_log import RequestRecord, voice_label
from ..http.security import Caller, Slot, check_priority, hold_slot
from ..http.speech import SpeechService, check_model
from ..protocol import SessionCreated, SessionStart
from ..settings import IngressSettings
from .messages import SessionLimits, close_code
from .session import serve_session


class GraphBackend:
    """A session's way into the graph: per cut, a TextNormalizer plan (with the voice resolved
    once, at the session's start); per segment, a Vocoder stream (as an HTTP request), cancelled
    when the session stops reading it."""

    def __init__(self, normalizer: Any, open_vocoder: Callable[[Plan, str], Any], client: str = ""):
        self.normalizer = normalizer
        self.open_vocoder = open_vocoder  # SpeechService.open_vocoder: a Vocoder stream, reported as it is read
        self.voice: Optional[Voice] = None
        self.client = client  # who asked (key id or ip:<addr>): the engine's fair admission
        self.pronunciations: Optional[Pronunciations] = None  # the session's lexicon, resolved at its start

    async def plan(self, text: str, options: Any) -> Plan:
        if self.pronunciations is not None:
            options = options.model_copy(update={"pronunciations": self.pronunciations})
        try:
            return await self.normalizer.plan.remote(text, options, self.voice, client=self.client)
        except Exception as exc:  # noqa: BLE001 - a full queue is 503, a known error keeps its status
            raise as_api_error(exc) from None

    async def audio(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        gen = self.open_vocoder(plan, response_format)
        done = False
        try:
            async for item in gen:
                yield item
            done = True
            gen.close()
        except Exception as exc:  # noqa: BLE001
            raise as_api_error(exc) from None
        finally:
            if not done:  # cancel, disconnect, or a failure: stop every stage's work
                gen.cancel()


def session_limits(settings: IngressSettings) -> SessionLimits:
    ws = settings.websocket
    return SessionLimits(
        max_text_chars=settings.max_input_chars,
        max_message_bytes=settings.max_body_bytes,
        segment_timeout_s=settings.request_timeout_s,
        first_message_s=ws.first_message_s,
        idle_s=ws.idle_s,
        max_pending_cuts=ws.max_pending_cuts,
    )


class UnstartedSockets:
    """Sockets of one replica that have not sent their ``session.start`` yet, per client (its key
    id from the handshake's header, else its address): a client holds at most ``limit`` of them,
    so sockets that never speak cannot fill the replica's request slots."""

    def __init__(self) -> None:
        self._count: dict[str, int] = {}

    def enter(self, client: str, limit: int) -> bool:
        n = self._count.get(client, 0)
        if n >= limit:
            return False
        self._count[client] = n + 1
        return True

    def leave(self, client: str) -> None:
        n = self._count.get(client, 0) - 1
        if n <= 0:
            self._count.pop(client, None)
        else:
            self._count[client] = n


async def run_session(
    ws: Any,
    request_id: str,
    speech: SpeechService,
    identify: Callable[[Optional[str]], Caller],
    client: str,
    unstarted: UnstartedSockets,
) -> None:
    """One socket from its handshake to its end, logged as one request record. ``identify`` gets
    the key a ``session.start`` may carry (for clients that cannot set the handshake's headers);
    ``client`` is who the handshake says it is (key id, or address)."""
    rec = RequestRecord(request_id, "", 0, "", "ws", "ws")
    limit = speech.settings.websocket.max_unstarted_per_client
    if not unstarted.enter(client, limit):
        await ws.close(code=close_code(429))  # before accept: the handshake is refused
        rec.finish("429")
        return
    waiting = [client]  # until session.start arrives (or the session ends)

    def started() -> None:
        if waiting:
            unstarted.leave(waiting.pop())

    await ws.accept()
    slots: list[Slot] = []  # the caller's stream slot once taken
    backend = GraphBackend(speech.normalizer, speech.open_vocoder)

    async def admit(start: SessionStart) -> SessionCreated:
        started()
        caller = identify(start.api_key)
        backend.client = caller.id
        check_model(start.model)
        check_priority(caller, start.priority)
        # Built-in or custom (the voice store): an unknown voice fails here, before any work.
        backend.voice = await speech.voices.resolve(start.voice, caller.owner, admin=caller.admin)  # the caller's own
        if speech.lexicons is not None:  # its lexicon (or the key's default), another key's unknown as a missing one
            backend.pronunciations = await speech.lexicons.pronunciations(start.lexicon, caller.owner, caller.admin)
        speech.check_busy()
        slots.append(await hold_slot(speech.slots, caller))
        rec.voice, rec.format = voice_label(start.voice), start.response_format
        return SessionCreated(
            id=request_id,
            response_format=start.response_format,
            sample_rate=format_sample_rate(start.response_format),
            weights=speech.weights_kind,
        )

    try:
        _, stats = await serve_session(ws, backend, admit, session_limits(speech.settings))
    finally:
        started()
        for slot in slots:
            slot.release()
    rec.chars, rec.segments, rec.audio_s = stats.chars, stats.segments, round(stats.audio_seconds, 3)
    rec.ttfb_s = stats.first_audio_s  # from the session's start: it includes the client's writing
    rec.finish(stats.status)
