"""An ElevenLabs socket inside the Serve graph: each context admitted as the native session is
(``Preparation.prepare``: key, model, voice, lexicon, the busy switch, a stream slot held until the
context ends) and spoken through the Ingress's speech pipeline (``realtime.graph.PipelineBackend``)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..callers import Caller
from ..errors import APIError, as_api_error
from ..http.request_log import RequestRecord, voice_label
from ..http.speech import SpeechService
from ..http.state import UnstartedSockets
from ..protocol import CLAUSE_SECONDS
from ..protocol.elevenlabs import ErrorMessage, StreamInputMessage, StreamInputParams, context_start
from ..realtime.graph import PipelineBackend, session_limits
from ..realtime.messages import close_code
from .socket import ElevenLabsSocket, OpenedContext


async def run_socket(
    ws: Any,
    request_id: str,
    speech: SpeechService,
    identify: Callable[[Optional[str]], Caller],
    client: str,
    unstarted: UnstartedSockets,
    voice_id: str,
    multi: bool,
) -> None:
    """One socket from its handshake to its end, logged as one request record. ``identify`` gets
    the key a context's first message may carry (for clients that cannot set the handshake's
    headers); ``client``: who the handshake says it is (key id, or address). Until its first
    context is admitted the socket counts against ``max_unstarted_per_client``: it holds no stream
    slot yet (voice-agent frameworks open it before their first turn, so it has ``idle_s``, not
    ``first_message_s``, to start)."""
    rec = RequestRecord(request_id, voice_label(voice_id), 0, "", "ws", "elevenlabs")
    limit = speech.settings.websocket.max_unstarted_per_client
    if not unstarted.enter(client, limit):
        await ws.close(code=close_code(429))  # before accept: the handshake is refused
        rec.finish("429")
        return
    waiting = [client]

    def started() -> None:
        if waiting:
            unstarted.leave(waiting.pop())

    await ws.accept()
    try:
        try:
            params = StreamInputParams.model_validate(dict(ws.query_params))
        except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError: 400, named by its field
            error = as_api_error(exc)
            await _refuse(ws, error)
            rec.finish(str(error.status))
            return
        rec.format = params.output_format
        caller: list[Caller] = []  # once known: every context of a socket is the same caller's

        async def open_context(first: StreamInputMessage) -> OpenedContext:
            if not caller:
                caller.append(identify(first.api_key))
                rec.caller = caller[0].id
            start = context_start(voice_id, params, first.voice_settings)
            prepared = await speech.preparation.prepare(start, caller[0], stream=True)
            backend = PipelineBackend(speech.pipeline, speech.open_audio)
            backend.prepared = prepared
            return OpenedContext(backend, prepared.options, prepared.admitted.release)

        socket = ElevenLabsSocket(
            ws, params, multi, open_context, session_limits(speech.settings), CLAUSE_SECONDS, started
        )
        stats = await socket.run()
    finally:
        started()
    rec.chars, rec.segments, rec.audio_s = stats.chars, stats.segments, round(stats.audio_seconds, 3)
    rec.ttfb_s = stats.first_audio_s
    rec.stall_s, rec.min_slack_s = stats.stall_s, stats.min_slack_s
    rec.finish(stats.status)


async def _refuse(ws: Any, error: APIError) -> None:
    code = close_code(error.status)
    try:
        message = ErrorMessage(message=error.message, error=error.code or error.type, code=code)
        await ws.send_text(message.model_dump_json(exclude_none=True))
        await ws.close(code, error.code or "")
    except Exception:  # noqa: BLE001 - nobody left to tell
        pass
