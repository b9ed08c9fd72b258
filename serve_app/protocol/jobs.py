"""The jobs API's shapes: ``/v1/audio/jobs`` (service ``serve_app/jobs/``, runner ``deployments/job_runner.py``,
store ``storage/jobs/``)."""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, Field, field_validator, model_validator

from ..engine.styles import MAX_INSTRUCTIONS_CHARS
from ..engine.text.ssml import looks_like_ssml
from ..engine.types import SynthesisOptions
from .speech import ApiOptions, CaptionFormat, DialogueTurn, ResponseFormat, options_of

# ------------------------------------------------------------------ jobs: long work in the background
# ``/v1/audio/jobs`` (service: ``serve_app/jobs/``; runner: ``deployments/job_runner.py``; store: ``storage/jobs/``).

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


MAX_JOB_TURNS = 100_000  # a job's dialogue turns at most (their text counts against jobs.max_input_chars)


class JobRequest(ApiOptions):
    """``POST /v1/audio/jobs``: a text of any length up to ``jobs.max_input_chars`` (a book), an
    SSML document, or a dialogue's turns, spoken in the background into one file. The options
    are ``SpeechRequest``'s (``DialogueRequest``'s with turns); ``priority`` is the service's
    (``jobs.priority``: below interactive requests)."""

    # Strict (a StrictModel through SynthesisOptions), unlike SpeechRequest, which ignores unknown fields.

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
        return options_of(self)


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
