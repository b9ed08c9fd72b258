"""A WebSocket session inside the Serve graph: the session (``session.py``) over the Ingress's
handles, admitted like an HTTP request (key, model, voice, busy switch, stream slot)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Optional, Union

from ..engine.audio import SAMPLE_RATE
from ..engine.types import Plan, StreamSummary, Voice
from ..errors import as_api_error
from ..http.request_log import RequestRecord, voice_label
from ..http.security import StreamLimiter
from ..http.speech import SpeechService, check_model
from ..protocol import SessionCreated, SessionStart
from ..settings import IngressSettings
from .session import SessionLimits, Transport, serve_session


class GraphBackend:
    """A session's way into the graph: per cut, a TextNormalizer plan (with the voice resolved
    once, at the session's start); per segment, a Vocoder stream (as an HTTP request), cancelled
    when the session stops reading it."""

    def __init__(self, normalizer: Any, vocoder: Any, client: str = ""):
        self.normalizer = normalizer
        self.vocoder = vocoder
        self.voice: Optional[Voice] = None
        self.client = client  # who asked (key id or ip:<addr>): the engine's fair admission

    async def plan(self, text: str, options: Any) -> Plan:
        try:
            return await self.normalizer.plan.remote(text, options, self.voice, client=self.client)
        except Exception as exc:  # noqa: BLE001 - a full queue is 503, a known error keeps its status
            raise as_api_error(exc) from None

    async def audio(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        gen = self.vocoder.options(stream=True).stream.remote(plan, response_format)
        done = False
        try:
            async for item in gen:
                yield item
            done = True
        except Exception as exc:  # noqa: BLE001
            raise as_api_error(exc) from None
        finally:
            if not done:  # cancel, disconnect, or a failure: stop every stage's work
                gen.cancel()


def session_limits(settings: IngressSettings) -> SessionLimits:
    return SessionLimits(max_text_chars=settings.max_input_chars, max_message_bytes=settings.max_body_bytes,
                         segment_timeout_s=settings.request_timeout_s)


async def run_session(ws: Transport, request_id: str, speech: SpeechService, limiter: StreamLimiter,
                      authorize: Callable[[Optional[str]], str]) -> None:
    """One accepted socket, start to end, logged as one request record. ``authorize`` gets the key
    a ``session.start`` may carry (for clients that cannot set the handshake's headers)."""
    holder: list[str] = []  # the client id once its stream slot is taken
    rec = RequestRecord(request_id, "", 0, "", "ws", "ws")
    backend = GraphBackend(speech.normalizer, speech.vocoder)

    async def admit(start: SessionStart) -> SessionCreated:
        client = authorize(start.api_key)
        backend.client = client
        check_model(start.model)
        # Built-in or custom (the voice store): an unknown voice fails here, before any work.
        backend.voice = await speech.voices.resolve(start.voice)
        speech.check_busy()
        limiter.acquire(client)
        holder.append(client)
        rec.voice, rec.format = voice_label(start.voice), start.response_format
        return SessionCreated(id=request_id, response_format=start.response_format, sample_rate=SAMPLE_RATE,
                              weights=speech.weights_kind)

    try:
        _, stats = await serve_session(ws, backend, admit, session_limits(speech.settings))
    finally:
        if holder:
            limiter.release(holder[0])
    rec.chars, rec.segments, rec.audio_s = stats.chars, stats.segments, round(stats.audio_seconds, 3)
    rec.ttfb_s = stats.first_audio_s  # from the session's start: it includes the client's writing
    rec.finish(stats.status)
