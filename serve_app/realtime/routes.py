"""The WebSocket session's route (``/v1/audio/speech/stream``): text in as it is written, audio out
as it is made (protocol: ``protocol.SessionStart`` and the messages after it; the session:
``session.py``, over the speech pipeline: ``graph.py``)."""

from __future__ import annotations

from typing import Optional

from fastapi import APIRouter, WebSocket

from ..callers import Caller
from ..http.middleware import caller_of
from ..http.state import state_of
from .graph import run_session

router = APIRouter()


@router.websocket("/v1/audio/speech/stream")
async def speech_stream(ws: WebSocket) -> None:
    state = state_of(ws)
    known = caller_of(ws)  # from the handshake's Authorization header, if it had one
    client = known.id if known is not None else "ip:" + (ws.client.host if ws.client else "unknown")

    def identify(api_key: Optional[str]) -> Caller:
        """From the handshake's header, else from the key in session.start (for clients that
        cannot set the handshake's headers)."""
        if known is not None:
            return known
        address = ws.client.host if ws.client else "unknown"
        return ws.app.state.policy.auth.identify(f"Bearer {api_key}" if api_key else None, address)

    await run_session(ws, state.request_id(), state.speech, identify, client, state.unstarted)
