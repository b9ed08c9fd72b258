"""Speaking while the text is still being written: the session behind ``WS /v1/audio/speech/stream``.

``session``: the text buffer, incremental cutting, segment numbering and seeds, audio in order,
cancel (barge-in), the message loop. ``handshake``: ``session.start``, admission, then the
session (``serve_session``). ``messages``: its edges (backend and transport interfaces, limits,
the client's messages parsed and bounded, events out). ``ogg``: one Ogg Opus stream per session
from per-segment encoders. Plain Python (no Ray, no torch, no PyAV): the Ingress runs it over its
speech pipeline (``graph``), the unit tests over an in-process one.
"""

from .handshake import serve_session
from .messages import (
    NORMAL_CLOSURE,
    SessionLimits,
    SessionStats,
    SpeechBackend,
    Transport,
    close_code,
    receive_message,
    send_error,
)
from .ogg import OggOpusJoiner
from .session import RealtimeSession

__all__ = [
    "NORMAL_CLOSURE",
    "OggOpusJoiner",
    "RealtimeSession",
    "SessionLimits",
    "SessionStats",
    "SpeechBackend",
    "Transport",
    "close_code",
    "receive_message",
    "send_error",
    "serve_session",
]
