"""The API contract: every request and response shape that crosses the API, used by the HTTP
ingress, the handle API, the WebSocket sessions and the client alike. Errors: ``errors.py``.
"""

from __future__ import annotations

import json
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .engine.audio import CONTENT_TYPES, AudioFormat
from .engine.loudness import LOUDNESS_RANGE_LUFS
from .engine.styles import MAX_INSTRUCTIONS_CHARS
from .engine.text.ssml import looks_like_ssml
from .engine.types import MAX_SPEAKER_CHARS, SynthesisOptions

ResponseFormat = AudioFormat
StreamFormat = Literal["audio", "sse"]
CaptionFormat = Literal["srt", "vtt"]
MAX_DIALOGUE_TURNS = 64
MODEL_IDS = ("chattts", "tts-1", "tts-1-hd", "gpt-4o-mini-tts")


def _options_of(request: SynthesisOptions) -> SynthesisOptions:
    return SynthesisOptions.model_construct(**{k: getattr(request, k) for k in SynthesisOptions.model_fields})


class VoiceRef(BaseModel):
    """OpenAI's shape for a custom voice: ``"voice": {"id": "voice_..."}``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64)


class _ApiOptions(SynthesisOptions):
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


class SpeechRequest(_ApiOptions):
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
        return _options_of(self)

    @property
    def is_ssml(self) -> bool:
        return self.input_format == "ssml" or (self.input_format is None and looks_like_ssml(self.input))

    @property
    def content_type(self) -> str:
        return "text/event-stream" if self.stream_format == "sse" else CONTENT_TYPES[self.response_format]


class TimedSpeechRequest(SpeechRequest):
    """``POST /v1/audio/speech/with-timestamps``: one JSON answer with the whole audio, where each
    segment lies in it, and captions on request."""

    stream_format: Literal["audio"] = "audio"
    captions: Optional[CaptionFormat] = Field(default=None, description="Also captions of the audio: SubRip or WebVTT.")


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


class DialogueTurn(BaseModel):
    """One turn of a dialogue: who speaks it, the text (plain or SSML), how."""

    model_config = ConfigDict(extra="forbid")

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
    captions: Optional[CaptionFormat] = None

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


class VoiceList(BaseModel):
    object: Literal["list"] = "list"
    data: list[VoiceCard]


# ------------------------------------------------------------------ jobs: long work in the background
# ``/v1/audio/jobs`` (service: ``http/jobs.py``; runner: ``serving/jobs.py``; store: ``storage/jobs/``).

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


MAX_JOB_TURNS = 100_000  # a job's dialogue turns at most (their text counts against jobs.max_input_chars)


class JobRequest(_ApiOptions):
    """``POST /v1/audio/jobs``: a text of any length up to ``jobs.max_input_chars`` (a book), an
    SSML document, or a dialogue's turns, spoken in the background into one file. The options
    are ``SpeechRequest``'s (``DialogueRequest``'s with turns); ``priority`` is the service's
    (``jobs.priority``: below interactive requests)."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(default="chattts", max_length=64)
    input: str = Field(
        default="",
        description="Text to speak (paragraphs separated by blank lines) or an SSML document; empty with turns.",
    )
    input_format: Optional[Literal["text", "ssml"]] = Field(
        default=None, description="ssml: the input is SSML (the default when it starts with <speak)."
    )
    turns: Optional[list[DialogueTurn]] = Field(
        default=None,
        min_length=1,
        max_length=MAX_JOB_TURNS,
        description="A dialogue instead of input: turns in several voices.",
    )
    pause_s: float = Field(default=0.4, ge=0.0, le=5.0, description="With turns: silence between turns, seconds.")
    response_format: ResponseFormat = "mp3"
    instructions: Optional[str] = Field(
        default=None, max_length=MAX_INSTRUCTIONS_CHARS, description="How to speak, as in /v1/audio/speech."
    )
    chapters: bool = Field(
        default=False,
        description="Also a file per chapter, and the chapter list: the text is "
        "cut at heading lines (Markdown '#', 第…章/回/节, Chapter/Part 1, Prologue, ...) and at scene "
        "breaks (a line of '***' or '---', two blank lines or more). Plain text only.",
    )
    captions: Optional[CaptionFormat] = Field(
        default=None,
        description="Also captions of the audio (and of each chapter's): SubRip or WebVTT, timed per segment.",
    )

    @field_validator("input")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("input must not contain NUL characters")
        return v

    @model_validator(mode="after")
    def _one_script(self) -> "JobRequest":
        if self.turns is not None:
            if self.input:
                raise ValueError("give either input or turns, not both")
        elif not self.input.strip():
            raise ValueError("input must not be blank")
        if self.chapters and (self.turns is not None or self.is_ssml):
            raise ValueError("chapters are cut from plain text's headings; an SSML or dialogue job has none")
        return self

    @property
    def is_ssml(self) -> bool:
        return self.turns is None and (
            self.input_format == "ssml" or (self.input_format is None and looks_like_ssml(self.input))
        )

    @property
    def script_chars(self) -> int:
        """What counts against ``jobs.max_input_chars``: the input, or every turn's."""
        return len(self.input) if self.turns is None else sum(len(t.input) for t in self.turns)

    def to_options(self) -> SynthesisOptions:
        return _options_of(self)


class JobProgress(BaseModel):
    chunks_done: int
    chunks_total: int
    characters_done: int
    characters_total: int
    audio_seconds: float = Field(description="Seconds of audio made so far.")
    eta_seconds: Optional[float] = Field(default=None, description="Until the job is done, from its rate so far.")


class JobChapter(BaseModel):
    """One chapter of a job made with ``chapters``."""

    index: int
    title: Optional[str] = Field(
        default=None, description="Its heading line; None for text before the first heading or after a scene break."
    )
    chunks_done: int
    chunks_total: int
    start_seconds: Optional[float] = Field(default=None, description="Where it starts in the whole file (once done).")
    duration_seconds: Optional[float] = Field(default=None, description="Its own file's length (once done).")
    audio_url: Optional[str] = Field(default=None, description="Once the job succeeded: its own file (Range works).")
    captions_url: Optional[str] = Field(
        default=None, description="Made with captions, once the job succeeded: its captions, timed on its own file."
    )


class JobFailure(BaseModel):
    code: str
    message: str


class AudioJob(BaseModel):
    """A job as ``/v1/audio/jobs`` answers it. Times are Unix seconds."""

    id: str
    object: Literal["audio.job"] = "audio.job"
    status: JobStatus
    created_at: int
    started_at: Optional[int] = None
    finished_at: Optional[int] = None
    expires_at: Optional[int] = Field(default=None, description="When a finished job and its audio are deleted.")
    model: str
    voice: str
    response_format: ResponseFormat
    progress: JobProgress
    bytes: int = Field(description="What the job holds in the store now.")
    error: Optional[JobFailure] = None
    audio_url: Optional[str] = Field(default=None, description="Once succeeded: GET it (Range requests work).")
    owner: Optional[str] = Field(default=None, description="The key id that made it, or 'anonymous'.")
    captions_url: Optional[str] = Field(
        default=None, description="Made with captions, once succeeded: the captions of the whole file (SRT or WebVTT)."
    )
    chapters: Optional[list[JobChapter]] = Field(default=None, description="Made with chapters: each chapter.")


class AudioJobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[AudioJob]


class AudioJobDeleted(BaseModel):
    id: str
    object: Literal["audio.job.deleted"] = "audio.job.deleted"
    deleted: bool = True


# ------------------------------------------------------------------ WebSocket: text in, audio out
# ``WS /v1/audio/speech/stream`` (session logic in ``serve_app/realtime/``). The client sends JSON
# text frames: ``session.start`` first, then ``text.append`` / ``text.flush`` / ``cancel`` /
# ``close``. The server sends audio as binary frames and these JSON events.

RealtimeFormat = Literal["pcm", "opus", "mp3", "ulaw", "alaw"]


class SessionStart(_ApiOptions):
    """The first message: the session's options, validated like the HTTP body's
    (``SynthesisOptions``' fields and ranges, the voice also as ``{"id": ...}``)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["session.start"]
    model: str = Field(default="chattts", max_length=64)
    response_format: RealtimeFormat = "pcm"
    api_key: Optional[str] = Field(
        default=None, max_length=1024, repr=False, description="Instead of the Authorization header of the handshake."
    )
    clause_seconds: float = Field(
        default=4.0,
        gt=0,
        le=60,
        description="An unfinished sentence that would speak "
        "longer than this is spoken up to its last clause mark (then the rest waits).",
    )

    def to_options(self) -> SynthesisOptions:
        return _options_of(self)


class TextAppend(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text.append"]
    text: str = Field(min_length=1)  # an empty append would only re-scan the buffer

    @field_validator("text")
    @classmethod
    def _no_nul(cls, v: str) -> str:
        if "\x00" in v:
            raise ValueError("text must not contain NUL characters")
        return v


class TextFlush(BaseModel):
    """Speak what is buffered now, even mid-sentence."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["text.flush"]


class Cancel(BaseModel):
    """Barge-in: drop the buffered text and every segment not yet sent; the session stays open."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["cancel"]


class Close(BaseModel):
    """Speak the rest, send ``done``, close."""

    model_config = ConfigDict(extra="forbid")
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
