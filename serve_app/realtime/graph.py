"""A WebSocket session inside the Serve graph: the session (``session.py``) over the Ingress's
speech pipeline, admitted as an HTTP request is (key, model, voice, busy switch, stream slot)."""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable, Optional

from ..callers import Caller
from ..engine.audio import format_sample_rate
from ..engine.types import Plan, SynthesisOptions
from ..errors import as_api_error
from ..http.middleware import caller_of
from ..http.request_log import RequestRecord, voice_label
from ..http.speech import SpeechService
from ..http.state import UnstartedSockets
from ..pipeline import AudioItem, AudioStream, SpeechPipeline
from ..pipeline.prepare import Prepared
from ..protocol import SessionCreated, SessionStart
from ..settings import IngressConfig
from .handshake import serve_session
from .messages import SessionLimits, close_code


class PipelineBackend:
    """A session's way into a speech pipeline: per cut, a plan of its text (prepared once, at the
    session's start: its voice, lexicon and options, and its caller as the client); per segment, a
    stream of the pipeline's (as an HTTP request's), stopped when the session stops reading it.
    ``open_audio``: how a stream is opened (the Ingress's reports its flow); ``errors``: what a
    stage's failure becomes (the graph's: its APIError; None: raised as it is)."""

    def __init__(
        self,
        pipeline: SpeechPipeline,
        open_audio: Optional[Callable[[Plan, str], AudioStream]] = None,
        errors: Optional[Callable[[BaseException], Exception]] = as_api_error,
    ):
        self.pipeline = pipeline
        self.open_audio = open_audio or pipeline.audio
        self.errors = errors
        self.prepared: Optional[Prepared] = None  # the session's start, once prepared

    async def plan(self, text: str, options: SynthesisOptions) -> Plan:
        """``options``: the session's (its start's; tests without a preparation pass their own)."""
        try:
            if self.prepared is not None:
                return await self.prepared.plan_text(self.pipeline, text)
            return await self.pipeline.plan(text, options)
        except Exception as exc:  # noqa: BLE001 - a full queue is 503, a known error keeps its status
            raise self._failed(exc) from None

    async def audio(self, plan: Plan, response_format: str) -> AsyncIterator[AudioItem]:
        try:
            async with self.open_audio(plan, response_format) as stream:
                async for item in stream:
                    yield item
        except Exception as exc:  # noqa: BLE001
            raise self._failed(exc) from None

    def _failed(self, exc: Exception) -> Exception:
        return exc if self.errors is None else self.errors(exc)


def handshake_identity(ws: Any) -> tuple[str, Callable[[Optional[str]], Caller]]:
    """Who a socket's handshake says it is (its key's id from the guard, else ``ip:<address>``:
    what the unstarted-socket cap counts), and how to identify its caller: from the handshake's
    key if it had one, else from a key its first message carries (for clients that cannot set
    the handshake's headers)."""
    known = caller_of(ws)
    address = ws.client.host if ws.client else "unknown"
    client = known.id if known is not None else "ip:" + address

    def identify(api_key: Optional[str]) -> Caller:
        if known is not None:
            return known
        return ws.app.state.policy.auth.identify(f"Bearer {api_key}" if api_key else None, address)

    return client, identify


def session_limits(settings: IngressConfig) -> SessionLimits:
    ws = settings.websocket
    return SessionLimits(
        max_text_chars=settings.max_input_chars,
        max_message_bytes=settings.max_body_bytes,
        segment_timeout_s=settings.request_timeout_s,
        first_message_s=ws.first_message_s,
        idle_s=ws.idle_s,
        max_pending_cuts=ws.max_pending_cuts,
    )


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
    backend = PipelineBackend(speech.pipeline, speech.open_audio)

    async def admit(start: SessionStart) -> SessionCreated:
        started()
        caller = identify(start.api_key)
        # Model, priority, voice, lexicon, the busy switch and a stream slot (held till the end).
        backend.prepared = await speech.preparation.prepare(start, caller, stream=True)
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
        if backend.prepared is not None:
            backend.prepared.admitted.release()
    rec.chars, rec.segments, rec.audio_s = stats.chars, stats.segments, round(stats.audio_seconds, 3)
    rec.ttfb_s = stats.first_audio_s  # from the session's start: it includes the client's writing
    rec.stall_s, rec.min_slack_s = stats.stall_s, stats.min_slack_s
    rec.finish(stats.status)
