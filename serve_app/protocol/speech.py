"""The speech API's shapes: ``/v1/audio/speech`` (and its timed answer), dialogues, models and
voices, and the options every request shares (``ApiOptions``)."""

from __future__ import annotations

import json
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator

from ..engine.audio import AudioFormat, content_type
from ..engine.captions import caption_text
from ..engine.loudness import LOUDNESS_RANGE_LUFS
from ..engine.strict import StrictModel
from ..engine.styles import MAX_INSTRUCTIONS_CHARS
from ..engine.text.ssml import looks_like_ssml
from ..engine.types import MAX_SPEAKER_CHARS, SynthesisOptions

ResponseFormat = AudioFormat
StreamFormat = Literal["audio", "sse"]
CaptionFormat = Literal["srt", "vtt"]
MAX_DIALOGUE_TURNS = 64
MODEL_IDS = ("chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def options_of(request: SynthesisOptions) -> SynthesisOptions:
    return SynthesisOptions.model_construct(**{k: getattr(request, k) for k in SynthesisOptions.model_fields})


class VoiceRef(StrictModel):
    """OpenAI's shape for a custom voice: ``"voice": {"id": "voice_..."}``."""

    id: str = Field(min_length=1, max_length=64)


class ApiOptions(SynthesisOptions):
    """``SynthesisOptions`` as the API takes them (HTTP body, WebSocket session): the voice may
    also be OpenAI's ``{"id": ...}``."""

    # A string (built-in or custom voice name, voice id, seed:<n>, speaker string) or {"id": ...};
    # always a string once validated.
    voice: Union[Annotated[str, Field(max_length=MAX_SPEAKER_CHARS)], VoiceRef] = Field(
        default="alloy",
        description='Built-in or custom voice name, {"id": "voice_..."}, seed:<n>, or a ChatTTS speaker string.',
    )

    @field_validator("voice")
    @classmethod
    def _voice_id(cls, v: Union[str, VoiceRef]) -> str:
        return v.id if isinstance(v, VoiceRef) else v

    @field_validator("pronunciations")
    @classmethod
    def _server_only(cls, v: object) -> None:
        # The Ingress fills it from "lexicon" (the caller's own lexicon, bounded): never the caller.
        if v is not None:
            raise ValueError("set by the server from 'lexicon': send a lexicon's id (POST /v1/audio/lexicons)")
        return None


class SpeechRequest(ApiOptions):
    """``POST /v1/audio/speech``: OpenAI's fields, plus ChatTTS's extras inherited from
    ``SynthesisOptions`` (voice, seed, speed, sampling, prompt, normalize, lang, priority)."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)

    model: str = Field(default="chattts", max_length=64)
    input: str = Field(min_length=1, description="Text to speak.")
    response_format: ResponseFormat = "mp3"
    stream_format: StreamFormat = "audio"
    instructions: Optional[str] = Field(
        default=None,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="How to speak, in words "
        "(English or Chinese) or a preset name: mapped to ChatTTS's oral/laugh/break tags and "
        'the speed (README, "Timed content"); X-Style-Applied / X-Style-Ignored say how.',
    )
    input_format: Optional[Literal["text", "ssml"]] = Field(
        default=None, description="ssml: the input is SSML (the default when it starts with <speak)."
    )
    refine_text: bool = False
    timestamps: bool = Field(
        default=False,
        description="With stream_format sse: a speech.segment event (its input text and "
        "span, start and end seconds) once each segment's audio is complete.",
    )
    captions: Optional[CaptionFormat] = Field(
        default=None,
        description="Captions of the audio, SubRip or WebVTT: in the with-timestamps answer, or with "
        "stream_format sse and timestamps in the speech.audio.done event.",
    )
    loudness: Optional[float] = Field(
        default=None,
        ge=LOUDNESS_RANGE_LUFS[0],
        le=LOUDNESS_RANGE_LUFS[1],
        description="Integrated loudness of the answer, LUFS (EBU R128), e.g. -16: the audio is "
        "normalised as a whole, so it is sent once it is all made (no streaming).",
    )

    @model_validator(mode="after")
    def _timestamps_need_events(self) -> "SpeechRequest":
        if self.timestamps and self.stream_format != "sse":
            raise ValueError(
                "timestamps needs stream_format 'sse' (or POST /v1/audio/speech/with-timestamps for one JSON answer)"
            )
        if self.captions and self.stream_format == "sse" and not self.timestamps:
            raise ValueError("captions in an sse stream need timestamps")
        return self

    @field_validator("input")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("input must not be blank")
        if "\x00" in v:
            raise ValueError("input must not contain NUL characters")
        return v

    def to_options(self) -> SynthesisOptions:
        """The engine's view of this request (already validated: no second validation)."""
        return options_of(self)

    @property
    def is_ssml(self) -> bool:
        return self.input_format == "ssml" or (self.input_format is None and looks_like_ssml(self.input))

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.stream_format == "sse" else content_type(self.response_format)


class TimedSpeechRequest(SpeechRequest):
    """``POST /v1/audio/speech/with-timestamps``: one JSON answer with the whole audio, where each
    segment lies in it, and captions on request."""

    stream_format: Literal["audio"] = "audio"


class SpeechSegment(BaseModel):
    """Where one segment (a sentence or clause) lies in the audio. ChatTTS has no aligner: the
    times are exact per segment, there are no word times."""

    index: int
    text: str = Field(description="The input's text of the segment.")
    input_start: Optional[int] = Field(default=None, description="Character offsets of that text in the input.")
    input_end: Optional[int] = None
    start: float = Field(description="Seconds from the audio's first sample.")
    end: float
    speaker: Optional[str] = None
    turn: Optional[int] = Field(
        default=None, description="A dialogue's turn (input_start / input_end are in its input)."
    )

    @computed_field(description="The text as the captions show it (ChatTTS's control tags dropped).")
    @property
    def caption(self) -> str:
        return caption_text(self.text)


class TimedSpeech(BaseModel):
    """The answer of ``/v1/audio/speech/with-timestamps`` (the shape of ElevenLabs' "with
    timestamps" and Kokoro's captioned speech: base64 audio beside its timing)."""

    object: Literal["speech"] = "speech"
    audio: str = Field(description="The audio file, base64.")
    response_format: str
    content_type: str
    duration: float = Field(description="Seconds of audio.")
    segments: list[SpeechSegment]
    captions: Optional[str] = None
    captions_format: Optional[CaptionFormat] = None


class DialogueTurn(StrictModel):
    """One turn of a dialogue: who speaks it, the text (plain or SSML), how."""

    voice: Union[Annotated[str, Field(max_length=MAX_SPEAKER_CHARS)], VoiceRef] = "alloy"
    input: str = Field(min_length=1)
    instructions: Optional[str] = Field(default=None, max_length=MAX_INSTRUCTIONS_CHARS)

    @field_validator("voice")
    @classmethod
    def _voice_id(cls, v: Union[str, VoiceRef]) -> str:
        return v.id if isinstance(v, VoiceRef) else v


class DialogueRequest(SpeechRequest):
    """``POST /v1/audio/dialogue``: a script of turns in several voices, decoded together (every
    turn's segments at once) and spoken in turn order with ``pause_s`` between turns. The
    request's own options (seed, speed, sampling, format, volume, loudness, timestamps) apply to
    every turn; a turn's ``instructions`` add to the request's."""

    input: str = Field(default="", description="Not used: the turns are the script.")
    turns: list[DialogueTurn] = Field(min_length=1, max_length=MAX_DIALOGUE_TURNS)
    pause_s: float = Field(default=0.4, ge=0.0, le=5.0, description="Silence between turns, seconds.")

    @field_validator("input")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        return v

    @model_validator(mode="after")
    def _as_input(self) -> "DialogueRequest":
        # What the length limit and the cache key see: the whole script, canonical.
        self.input = json.dumps(
            {"turns": [t.model_dump() for t in self.turns], "pause_s": self.pause_s},
            ensure_ascii=False,
            sort_keys=True,
            separators=(",", ":"),
        )
        return self

    @property
    def is_ssml(self) -> bool:
        return False


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "chattts-serve"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class VoiceCard(BaseModel):
    """A voice in ``GET /v1/audio/voices`` (also ``GET /v1/voices``): built-in or custom."""

    id: str
    object: Literal["voice"] = "voice"
    name: str
    kind: Literal["builtin", "speaker", "seed", "clip"]
    seed: Optional[int] = None
    created_at: Optional[int] = None
    clip_seconds: Optional[float] = None
    owner: Optional[str] = Field(
        default=None,
        description="A custom voice's owner: the key id that made it, "
        "or 'anonymous' (a caller lists its own; an admin key every owner's).",
    )


class VoiceName(BaseModel):
    """A voice as Open WebUI lists them (``{base}/audio/voices``): what to send, what to show."""

    id: str = Field(description="What a request's voice names: a built-in name or a custom voice's id.")
    name: str


class VoiceList(BaseModel):
    """``GET /v1/audio/voices``: OpenAI's list shape (``data``), and the same voices as ``voices``,
    the shape Open WebUI reads. Without an API key where keys are on, the
    built-in voices only."""

    object: Literal["list"] = "list"
    data: list[VoiceCard]
    voices: list[VoiceName] = Field(default_factory=list)
    every_owner: bool = Field(
        default=False,
        description="True when the caller's key is an admin's: the list holds every key's voices (the Wyoming "
        "server refuses such a key).",
    )


class AudioModelList(BaseModel):
    """``GET /v1/audio/models`` (no key needed): the speech model ids, as ``models`` (the shape Open
    WebUI reads from ``{base}/audio/models``) and as OpenAI's list (``data``)."""

    object: Literal["list"] = "list"
    data: list[ModelCard]
    models: list[ModelCard]
