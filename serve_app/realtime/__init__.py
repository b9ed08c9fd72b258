"""Speaking while the text is still being written: the session behind ``WS /v1/audio/speech/stream``.

``feed``: one stream of speech from text being written (the text buffer, incremental cutting,
segment numbering and seeds, audio in order, cancel), which the session and each ElevenLabs
context (``serve_app/elevenlabs/``) speak through. ``session``: the native protocol around one
feed (the message loop, events out). ``handshake``: ``session.start``, admission, then the
session (``serve_session``). ``messages``: its edges (backend and transport interfaces, limits,
the client's messages parsed and bounded, events out). ``ogg``: one Ogg Opus stream per session
from per-segment encoders. Plain Python (no Ray, no torch, no PyAV): the Ingress runs it over its
speech pipeline (``graph``), the unit tests over an in-process one.
"""

from .feed import FeedSegment, FeedSink, SpeechFeed, TextBuffer
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
    "FeedSegment",
    "FeedSink",
    "SpeechFeed",
    "TextBuffer",
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
