"""The WebSocket session's messages: ``WS /v1/audio/speech/stream`` (session logic in
``serve_app/realtime/``)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field, field_validator

from ..engine.strict import StrictModel
from ..engine.types import SynthesisOptions
from .speech import ApiOptions, options_of

# ------------------------------------------------------------------ WebSocket: text in, audio out
# ``WS /v1/audio/speech/stream`` (session logic in ``serve_app/realtime/``). The client sends JSON
# text frames: ``session.start`` first, then ``text.append`` / ``text.flush`` / ``cancel`` /
# ``close``. The server sends audio as binary frames and these JSON events.

RealtimeFormat = Literal["pcm", "opus", "mp3", "ulaw", "alaw"]

# An unfinished sentence that would speak longer than this is spoken up to its last clause mark:
# a session's default (``clause_seconds``), and every ElevenLabs context's.
CLAUSE_SECONDS = 4.0


class SessionStart(ApiOptions):
    """The first message: the session's options, validated like the HTTP body's
    (``SynthesisOptions``' fields and ranges, the voice also as ``{"id": ...}``)."""

    # Strict (a StrictModel through SynthesisOptions), unlike SpeechRequest, which ignores unknown fields.

    type: Literal["session.start"]
    model: str = Field(default="chattts", max_length=64)
    response_format: RealtimeFormat = "pcm"
    api_key: Optional[str] = Field(
        default=None, max_length=1024, repr=False, description="Instead of the Authorization header of the handshake."
    )
    clause_seconds: float = Field(
        default=CLAUSE_SECONDS,
        gt=0,
        le=60,
        description="An unfinished sentence that would speak "
        "longer than this is spoken up to its last clause mark (then the rest waits).",
    )

    def to_options(self) -> SynthesisOptions:
        return options_of(self)


class TextAppend(StrictModel):
    type: Literal["text.append"]
    text: str = Field(min_length=1)  # an empty append would only re-scan the buffer

    @field_validator("text")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("text must not contain NUL characters")
        return v


class TextFlush(StrictModel):
    """Speak what is buffered now, even mid-sentence."""

    type: Literal["text.flush"]


class Cancel(StrictModel):
    """Barge-in: drop the buffered text and every segment not yet sent; the session stays open."""

    type: Literal["cancel"]


class Close(StrictModel):
    """Speak the rest, send ``done``, close."""

    type: Literal["close"]


CLIENT_MESSAGES: dict[str, type[BaseModel]] = {
    "session.start": SessionStart,
    "text.append": TextAppend,
    "text.flush": TextFlush,
    "cancel": Cancel,
    "close": Close,
}


class SessionCreated(BaseModel):
    type: Literal["session.created"] = "session.created"
    id: str
    response_format: RealtimeFormat
    sample_rate: int  # of the audio in its format: 24000, 8000 for ulaw/alaw (opus decodes at 48000 whatever it is)
    weights: str


class SegmentStart(BaseModel):
    """Sent just before the segment's first audio frame: its frames follow, then ``segment.done``."""

    type: Literal["segment.start"] = "segment.start"
    index: int
    text: str  # normalised, as spoken


class SegmentDone(BaseModel):
    """A segment's audio is all sent; ``start`` and ``end`` place it on the session's audio
    timeline (seconds from the session's first sample)."""

    type: Literal["segment.done"] = "segment.done"
    index: int
    audio_seconds: float
    start: float = 0.0
    end: float = 0.0


class Cancelled(BaseModel):
    """Answer to ``cancel``: no frame of these segments follows."""

    type: Literal["cancelled"] = "cancelled"
    segments: list[int]


class Done(BaseModel):
    type: Literal["done"] = "done"
    segments: int
    audio_seconds: float


class ErrorObject(BaseModel):
    message: str
    type: str
    param: Optional[str] = None
    code: Optional[str] = None


class ErrorEvent(BaseModel):
    """OpenAI's error object in an event; the server closes with ``4000 + status`` after it."""

    type: Literal["error"] = "error"
    error: ErrorObject
