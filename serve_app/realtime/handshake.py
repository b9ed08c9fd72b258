"""A WebSocket session from its handshake's accept: the ``session.start`` message (within
``first_message_s``), the door's admission, ``session.created``, then the session itself
(``session.py``); any refusal before it is an error event and a close code, never a crash."""

from __future__ import annotations

import asyncio
from typing import Awaitable, Callable, Optional

from ..errors import APIError, as_api_error
from ..protocol import SessionCreated, SessionStart
from .messages import SessionLimits, SessionStats, SpeechBackend, Transport, receive_message, send_error, send_event
from .session import RealtimeSession


async def serve_session(
    transport: Transport,
    backend: SpeechBackend,
    admit: Callable[[SessionStart], Awaitable[SessionCreated]],
    limits: SessionLimits = SessionLimits(),
    on_first_audio: Optional[Callable[[], None]] = None,
) -> tuple[Optional[SessionStart], SessionStats]:
    """A whole WebSocket session after the handshake's accept: the ``session.start`` message,
    ``admit`` (keys, limits, model, voice: raises APIError), ``session.created``, then the
    session. Returns the start message (None if there was none) and what the session did."""
    start: Optional[SessionStart] = None
    try:
        try:
            msg = await asyncio.wait_for(receive_message(transport, limits), limits.first_message_s)
        except asyncio.TimeoutError:
            raise APIError(
                408, f"no session.start within {limits.first_message_s:g} s of the handshake", code="timeout"
            ) from None
        if msg is None:
            return None, SessionStats(status="client_disconnect")
        if not isinstance(msg, SessionStart):
            raise APIError(400, "the first message must be session.start", param="type", code="session_not_started")
        start = msg
        created = await admit(start)
        await send_event(transport, created)
    except Exception as exc:  # noqa: BLE001 - an error event, never a crash
        error = as_api_error(exc)
        await send_error(transport, error)
        return start, SessionStats(status=str(error.status))
    session = RealtimeSession(backend, start, transport, limits, on_first_audio)
    return start, await session.run()
