"""ElevenLabs' text-to-speech API as voice-agent frameworks speak it (their ElevenLabs plugins,
unchanged): ``WS /v1/text-to-speech/{voice_id}/stream-input`` and ``.../multi-stream-input``
(text in as it is written, base64 audio with character alignment out), and ``POST
/v1/text-to-speech/{voice_id}``, ``.../stream``, ``.../stream/with-timestamps`` (the door:
``serve_app/elevenlabs/``).

Unknown fields are ignored, as ElevenLabs ignores them; what is not used is accepted and said so
here: ``model_id`` (one model speaks every id), ``voice_settings`` but ``speed``, the generation
config and chunk schedule (the service cuts text its own way), pronunciation dictionary locators
(the service's lexicons are ``lexicon`` on its own API), SSML parsing, logging and latency
switches, ``previous_text`` / ``next_text``.
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, field_validator

from ..engine.audio import pcm_format
from ..engine.types import SynthesisOptions
from .speech import MODEL_IDS, ApiOptions, SpeechRequest, options_of

# ElevenLabs' output_format names -> the service's encoder formats. pcm is made at each rate
# (resampled in the encoder: engine/audio.py's pcm_<rate>); every mp3 name is the service's mp3
# (24 kHz, 64 kbit/s CBR, bare MPEG frames) and every opus name its Ogg Opus (encoded at 24 kHz,
# decoded at 48 kHz): a decoder reads their rate from the stream, and the service makes no other.
PCM_OUTPUTS = {f"pcm_{rate}": pcm_format(rate) for rate in (8000, 16000, 22050, 24000, 32000, 44100, 48000)}
MP3_OUTPUTS = (
    "mp3_22050_32",
    "mp3_24000_48",
    "mp3_44100",
    "mp3_44100_32",
    "mp3_44100_64",
    "mp3_44100_96",
    "mp3_44100_128",
    "mp3_44100_192",
)
OPUS_OUTPUTS = ("opus_48000_32", "opus_48000_64", "opus_48000_96", "opus_48000_128", "opus_48000_192")
OUTPUT_FORMATS: dict[str, str] = {
    **PCM_OUTPUTS,
    "ulaw_8000": "ulaw",
    "alaw_8000": "alaw",
    **{name: "mp3" for name in MP3_OUTPUTS},
    **{name: "opus" for name in OPUS_OUTPUTS},
}
DEFAULT_OUTPUT_FORMAT = "mp3_44100_128"  # ElevenLabs' own default

TextNormalization = Literal["auto", "on", "off"]


def _bound(name: str, which: str) -> float:
    """A bound of a ``SynthesisOptions`` field: its range is the one home of the range."""
    return next(getattr(m, which) for m in SynthesisOptions.model_fields[name].metadata if hasattr(m, which))


def _no_nul(v: Optional[str]) -> Optional[str]:
    if v is not None and "\x00" in v:
        raise ValueError("text must not contain NUL characters")
    return v


class _Lenient(BaseModel):
    """ElevenLabs' shapes: fields it may add later are ignored, not refused."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class VoiceSettings(_Lenient):
    """``speed`` is the request's speed (within the service's range, wider than ElevenLabs'
    0.7-1.2); the others are accepted and ignored (ChatTTS has no such knobs)."""

    stability: Optional[float] = Field(default=None, ge=0, le=1)
    similarity_boost: Optional[float] = Field(default=None, ge=0, le=1)
    style: Optional[float] = Field(default=None, ge=0, le=1)
    use_speaker_boost: Optional[bool] = None
    speed: Optional[float] = Field(default=None, ge=_bound("speed", "ge"), le=_bound("speed", "le"))


class GenerationConfig(_Lenient):
    """Accepted and ignored: the service cuts text at sentences and clauses, not by a schedule."""

    chunk_length_schedule: Optional[list[float]] = Field(default=None, max_length=16)


class DictionaryLocator(_Lenient):
    """Accepted and ignored (the service's own lexicons: ``/v1/audio/lexicons``)."""

    pronunciation_dictionary_id: str = Field(max_length=128)
    version_id: Optional[str] = Field(default=None, max_length=128)


def output_format_of(name: str) -> str:
    """The service's encoder format for an ElevenLabs ``output_format`` (ValueError if none)."""
    try:
        return OUTPUT_FORMATS[name]
    except KeyError:
        raise ValueError(f"output_format must be one of {', '.join(OUTPUT_FORMATS)}") from None


class _OutputFormat(_Lenient):
    output_format: str = Field(default=DEFAULT_OUTPUT_FORMAT, max_length=32)

    @field_validator("output_format")
    @classmethod
    def _known(cls, v: str) -> str:
        output_format_of(v)
        return v

    @property
    def encoder_format(self) -> str:
        return OUTPUT_FORMATS[self.output_format]


class StreamInputParams(_OutputFormat):
    """The WebSocket's query string. ``inactivity_timeout``: seconds without a message before the
    socket closes (ElevenLabs' 20 by default, at most 180; the service's ``idle_s`` caps it);
    ``auto_mode``: every text message ends a phrase (nothing of it waits for more text);
    ``apply_text_normalization`` is the service's ``text_normalization``; ``language_code`` ``en``
    or ``zh`` is its ``lang`` (others: detected from the text)."""

    model_id: str = Field(default="eleven_flash_v2_5", max_length=64)
    language_code: Optional[str] = Field(default=None, max_length=16)
    inactivity_timeout: float = Field(default=20, gt=0, le=180)
    auto_mode: bool = False
    apply_text_normalization: TextNormalization = "auto"
    # Accepted and ignored.
    enable_logging: Optional[bool] = None
    enable_ssml_parsing: Optional[bool] = None
    sync_alignment: Optional[bool] = None
    apply_language_text_normalization: Optional[bool] = None
    optimize_streaming_latency: Optional[int] = None


class StreamInputMessage(_Lenient):
    """One client message of ``stream-input`` / ``multi-stream-input``. Which it is, is read from
    its fields: ``close_socket``; ``close_context``; a context's first message (``text`` " ", with
    its ``voice_settings``); ``text`` (``""``: a keep-alive on multi-stream-input, the end of input
    on stream-input) with ``flush``; ``flush`` alone."""

    text: Optional[str] = None
    context_id: Optional[str] = Field(
        default=None, max_length=128, validation_alias=AliasChoices("context_id", "contextId")
    )
    flush: bool = False
    close_context: bool = False
    close_socket: bool = False
    voice_settings: Optional[VoiceSettings] = None
    xi_api_key: Optional[str] = Field(
        default=None,
        max_length=1024,
        repr=False,
        validation_alias=AliasChoices("xi-api-key", "xi_api_key"),
        description="Instead of the handshake's xi-api-key header (the socket's first message).",
    )
    authorization: Optional[str] = Field(default=None, max_length=1100, repr=False)
    # Accepted and ignored.
    try_trigger_generation: Optional[bool] = None
    generation_config: Optional[GenerationConfig] = None
    pronunciation_dictionary_locators: Optional[list[DictionaryLocator]] = Field(default=None, max_length=3)

    @field_validator("text")
    @classmethod
    def _text(cls, v: Optional[str]) -> Optional[str]:
        return _no_nul(v)

    @property
    def api_key(self) -> Optional[str]:
        """The key this message carries (``xi-api-key``, or ``authorization: Bearer <key>``)."""
        if self.xi_api_key:
            return self.xi_api_key
        scheme, _, token = (self.authorization or "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        return token.strip() or None


class Alignment(BaseModel):
    """Where characters lie in one audio message, in ms from where the previous alignment's span
    ended (so each message's span, its last character's end, is the audio it carries since then).
    Estimated: ChatTTS has no aligner (see serve_app/elevenlabs/alignment.py)."""

    chars: list[str]
    charStartTimesMs: list[int]
    charDurationsMs: list[int]


class AudioMessage(BaseModel):
    """Audio out: base64 of ``output_format``'s bytes. ``contextId`` on multi-stream-input."""

    audio: str
    alignment: Optional[Alignment] = None
    normalizedAlignment: Optional[Alignment] = None
    contextId: Optional[str] = None


class FinalMessage(BaseModel):
    """A context is over: no audio of it follows (multi-stream-input: after ``close_context`` or
    ``close_socket``; stream-input: after the end of input, then the socket closes)."""

    isFinal: Literal[True] = True
    contextId: Optional[str] = None


class ErrorMessage(BaseModel):
    """An error, then the socket closes with ``code`` (4000 + the HTTP status of the same error on
    the service's own API, as its own socket does): ``error`` is the service's error code."""

    message: str
    error: str
    code: int
    contextId: Optional[str] = None


# ------------------------------------------------------------------ HTTP


class TextToSpeechRequest(_Lenient):
    """``POST /v1/text-to-speech/{voice_id}`` (and ``/stream``, ``/stream/with-timestamps``)."""

    text: str = Field(min_length=1)
    model_id: str = Field(default="eleven_multilingual_v2", max_length=64)
    voice_settings: Optional[VoiceSettings] = None
    language_code: Optional[str] = Field(default=None, max_length=16)
    seed: Optional[int] = Field(default=None, ge=_bound("seed", "ge"), le=_bound("seed", "le"))
    apply_text_normalization: TextNormalization = "auto"
    # Accepted and ignored.
    previous_text: Optional[str] = None
    next_text: Optional[str] = None
    pronunciation_dictionary_locators: Optional[list[DictionaryLocator]] = Field(default=None, max_length=3)
    apply_language_text_normalization: Optional[bool] = None

    @field_validator("text")
    @classmethod
    def _speakable_text(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("text must not be blank")
        return _no_nul(v) or v


class TextToSpeechParams(_OutputFormat):
    """The HTTP routes' query string (``optimize_streaming_latency``, ``enable_logging``: ignored)."""

    optimize_streaming_latency: Optional[int] = None
    enable_logging: Optional[bool] = None


class CharacterAlignment(BaseModel):
    """Where characters lie in the answer's audio, in seconds from its start (estimated within
    each sentence or clause: see serve_app/elevenlabs/alignment.py)."""

    characters: list[str]
    character_start_times_seconds: list[float]
    character_end_times_seconds: list[float]


class TimestampedChunk(BaseModel):
    """One line of ``/stream/with-timestamps`` (newline-delimited JSON)."""

    audio_base64: str
    alignment: Optional[CharacterAlignment] = None
    normalized_alignment: Optional[CharacterAlignment] = None


def lang_of(language_code: Optional[str]) -> Optional[str]:
    """The service's ``lang`` for an ElevenLabs ``language_code`` (None: detected from the text)."""
    code = (language_code or "").split("-")[0].lower()
    return code if code in ("en", "zh") else None


# ------------------------------------------------------------------ on the service's terms


class ContextStart(ApiOptions):
    """A context's options as the service's admission and planner read them (what a session's
    ``session.start`` is to the native socket): the path's voice, the speed, language and text
    normalisation ElevenLabs' fields name; one model speaks every ``model_id``."""

    model: str = MODEL_IDS[0]

    def to_options(self) -> SynthesisOptions:
        return options_of(self)


class ElevenLabsSpeechRequest(SpeechRequest):
    """An HTTP request on the service's terms: ``response_format`` is an encoder format the
    ElevenLabs ``output_format`` names (pcm at any of its rates included, ``OUTPUT_FORMATS``)."""

    response_format: str = OUTPUT_FORMATS[DEFAULT_OUTPUT_FORMAT]  # type: ignore[assignment]


def _speed(settings: Optional[VoiceSettings]) -> float:
    speed = settings.speed if settings is not None else None
    return speed if speed is not None else SynthesisOptions.model_fields["speed"].default


def context_start(voice_id: str, params: StreamInputParams, settings: Optional[VoiceSettings]) -> ContextStart:
    return ContextStart(
        voice=voice_id,
        speed=_speed(settings),
        lang=lang_of(params.language_code),
        text_normalization=params.apply_text_normalization,
    )


def speech_request(voice_id: str, body: TextToSpeechRequest, params: TextToSpeechParams) -> ElevenLabsSpeechRequest:
    return ElevenLabsSpeechRequest(
        input=body.text,
        voice=voice_id,
        model=MODEL_IDS[0],
        response_format=params.encoder_format,
        speed=_speed(body.voice_settings),
        seed=body.seed,
        lang=lang_of(body.language_code),
        text_normalization=body.apply_text_normalization,
    )
