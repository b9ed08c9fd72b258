"""The API contract: request/response models and OpenAI-style errors (DESIGN.md section 5).

One module for every shape that crosses the API, used by the HTTP ingress, the handle API and
the client alike.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .engine.audio import CONTENT_TYPES
from .engine.text import CONTROL_TAG_RE

ResponseFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
StreamFormat = Literal["audio", "sse"]
MODEL_IDS = ("chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")
DEFAULT_MAX_INPUT_CHARS = 4096


class SpeechRequest(BaseModel):
    """``POST /v1/audio/speech``: OpenAI's fields first, ChatTTS's extras after."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)

    model: str = Field(default="chattts", max_length=64)
    input: str = Field(min_length=1, description="Text to speak.")
    voice: str = Field(default="alloy", max_length=4096, description="OpenAI voice, seed:<n>, or a ChatTTS speaker string.")
    response_format: ResponseFormat = "mp3"
    speed: float = Field(default=1.0, ge=0.25, le=4.0)
    stream_format: StreamFormat = "audio"
    instructions: Optional[str] = Field(default=None, max_length=4096, description="Accepted for OpenAI compatibility; ignored.")
    # ChatTTS extras
    seed: Optional[int] = Field(default=None, ge=0, le=2**31 - 1)
    temperature: float = Field(default=0.3, ge=0.01, le=2.0)
    top_p: float = Field(default=0.7, ge=0.01, le=1.0)
    top_k: int = Field(default=20, ge=1, le=625)
    refine_text: bool = False
    prompt: str = Field(default="", max_length=256, description="ChatTTS control tags, e.g. [oral_2][laugh_0][break_6].")
    normalize: bool = True
    lang: Optional[Literal["zh", "en"]] = None
    priority: int = Field(default=0, ge=-10, le=10)

    @field_validator("input")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("input must not be blank")
        if "\x00" in v:
            raise ValueError("input must not contain NUL characters")
        return v

    @field_validator("prompt")
    @classmethod
    def _only_control_tags(cls, v: str) -> str:
        # Only the whitelisted prosody tags: internal tokens like [spk_emb] must not get in.
        if CONTROL_TAG_RE.sub("", v).strip():
            raise ValueError("prompt may only contain ChatTTS control tags such as [oral_2][laugh_0][break_6]")
        return v

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.stream_format == "sse" else CONTENT_TYPES[self.response_format]


class APIError(Exception):
    """An error the API reports with an OpenAI-style body and a status code."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __reduce__(self):  # picklable across Ray processes with all its fields
        return (APIError, (self.status, self.message, self.type, self.param, self.code, self.headers))


def error_body(message: str, type: str = "invalid_request_error", param: Optional[str] = None, code: Optional[str] = None) -> dict[str, Any]:
    return APIError(0, message, type, param, code).body()


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chattts-serve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    id: str
    seed: Optional[int] = None
    description: str = ""


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceCard]


class SpeechDone(BaseModel):
    """Summary of a finished synthesis (SSE ``speech.audio.done`` usage, logs)."""

    request_id: str
    segments: int
    audio_seconds: float
    input_chars: int
