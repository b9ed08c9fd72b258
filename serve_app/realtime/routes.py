"""The WebSocket session's route (``/v1/audio/speech/stream``): text in as it is written, audio out
as it is made (protocol: ``protocol.SessionStart`` and the messages after it; the session:
``session.py``, over the speech pipeline: ``graph.py``)."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket

from ..http.state import state_of
from .graph import handshake_identity, run_session

router = APIRouter()


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    state = state_of(ws)
    client, identify = handshake_identity(ws)  # the key: the handshake's header, else session.start's
    await run_session(ws, state.request_id(), state.speech, identify, client, state.unstarted)
