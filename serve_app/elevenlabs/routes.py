"""ElevenLabs' text-to-speech routes, for its clients' plugins unchanged: the input-streaming
sockets (``socket.py`` over the speech pipeline: ``graph.py``) and the HTTP routes
(``speech.py`` over the speech service). Shapes: ``protocol/elevenlabs.py``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, WebSocket
from fastapi.responses import StreamingResponse

from ..engine.types import MAX_SPEAKER_CHARS
from ..errors import APIError, as_api_error
from ..http.errors import error_response
from ..http.middleware import caller_of
from ..http.request_log import RequestRecord
from ..http.state import state_of
from ..pipeline.flow import ACKS_HEADER
from ..protocol.elevenlabs import TextToSpeechParams, TextToSpeechRequest, speech_request
from ..realtime.graph import handshake_identity
from .graph import run_socket
from .speech import ElevenLabsSpeech

router = APIRouter()

VoiceId = Annotated[str, Path(min_length=1, max_length=MAX_SPEAKER_CHARS)]


@router.websocket("/v1/text-to-speech/{voice_id}/stream-input")
async def stream_input(ws: WebSocket, voice_id: VoiceId) -> None:
    """One context, unnamed: ``{"text": ""}`` ends it (then ``isFinal`` and close 1000)."""
    await _socket(ws, voice_id, multi=False)


@router.websocket("/v1/text-to-speech/{voice_id}/multi-stream-input")
async def multi_stream_input(ws: WebSocket, voice_id: VoiceId) -> None:
    """Contexts by ``context_id``, each a stream of its own."""
    await _socket(ws, voice_id, multi=True)


async def _socket(ws: WebSocket, voice_id: str, multi: bool) -> None:
    state = state_of(ws)
    client, identify = handshake_identity(ws)  # xi-api-key or Authorization, else the first message's key
    await run_socket(ws, state.request_id(), state.speech, identify, client, state.unstarted, voice_id, multi)


@router.post("/v1/text-to-speech/{voice_id}")
async def convert(
    voice_id: VoiceId, body: TextToSpeechRequest, params: Annotated[TextToSpeechParams, Query()], request: Request
):
    """The whole audio in ``output_format``."""
    return await _answer(voice_id, body, params, request, "whole")


@router.post("/v1/text-to-speech/{voice_id}/stream", response_class=StreamingResponse)
async def stream(
    voice_id: VoiceId, body: TextToSpeechRequest, params: Annotated[TextToSpeechParams, Query()], request: Request
):
    """The audio as it is made."""
    return await _answer(voice_id, body, params, request, "stream")


@router.post("/v1/text-to-speech/{voice_id}/stream/with-timestamps", response_class=StreamingResponse)
async def stream_with_timestamps(
    voice_id: VoiceId, body: TextToSpeechRequest, params: Annotated[TextToSpeechParams, Query()], request: Request
):
    """Newline-delimited JSON: each message of audio (base64) with its characters' times."""
    return await _answer(voice_id, body, params, request, "with_timestamps")


async def _answer(voice_id: str, body: TextToSpeechRequest, params: TextToSpeechParams, request: Request, how: str):
    state = state_of(request)
    service = ElevenLabsSpeech(state.speech)
    try:
        req = speech_request(voice_id, body, params)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError (the voice): 400
        return error_response(as_api_error(exc))
    rec = RequestRecord.start(req, state.request_id(), client="elevenlabs", log_text=state.settings.log_text)
    rec.since_arrival(getattr(request.state, "t_in", None))
    cache_control = request.headers.get("cache-control", "")
    try:
        if how == "stream":
            flow_acks = request.headers.get(ACKS_HEADER) == "1"
            return await service.stream(req, rec, caller_of(request), cache_control, flow_acks=flow_acks)
        return await getattr(service, how)(req, rec, caller_of(request), cache_control)
    except APIError as exc:
        rec.finish(str(exc.status))
        return error_response(exc)
