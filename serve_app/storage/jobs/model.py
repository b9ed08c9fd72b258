"""A job as stored: its state (``StoredJob``, ``job.json``), its chunks (``JobChunk``,
``chunks.json``), its id, its owner's tag, the names of its files, and the per-owner limits
(``JobLimits``)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ...engine.errors import JobQuotaExceeded, TooManyJobs
from ...engine.strict import StrictModel
from ...engine.types import SynthesisOptions

JobStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
ACTIVE: tuple[str, ...] = ("queued", "running")
# Ids and tags are lower-case hex, checked with ``fullmatch`` (``$`` would pass a trailing newline):
# two ids that differ only in case would name one folder on a case-insensitive filesystem.
JOB_ID_RE = re.compile(r"job_[0-9a-f]{24}")
OWNER_TAG_RE = re.compile(r"[0-9a-f]{24}")
PCM_BYTES_PER_SAMPLE = 2  # chunks are s16le mono at the engine's rate

# A job's files, by name within its place (``files.py``): only these shapes, never user text.
STATE_FILE = "job.json"
CHUNKS_FILE = "chunks.json"
CHUNKS_FOLDER = "chunks"
FILE_NAME_RE = re.compile(r"(?:[a-z0-9_-]+/)*[a-z0-9_-]+(?:\.[a-z0-9]+)?")
STALE_TEMP_S = 3600.0  # a half-made job, a file without its job, or a deletion marker this old is swept
LOCK_TIMEOUT_S = 10.0  # how long a creation waits for its owner's lock (then 503)


class JobGone(Exception):
    """The job's files are gone (deleted or expired) while the runner worked on it."""


def new_job_id() -> str:
    return "job_" + secrets.token_hex(12)


def owner_tag(owner: str) -> str:
    """An owner as the store names its directory: a hash, never the key id itself."""
    return hashlib.sha256(b"jobs-owner\0" + owner.encode()).hexdigest()[:24]


def chunk_file(index: int) -> str:
    return f"{CHUNKS_FOLDER}/{int(index)}.pcm"


def timing_file(index: int) -> str:
    """A chunk's segments: where each lies in its PCM and its text (jobs made with captions)."""
    return f"{CHUNKS_FOLDER}/{int(index)}.json"


def audio_file_name(job: "StoredJob", chapter: Optional[int] = None) -> str:
    """The final file's name, or chapter ``chapter``'s (``response_format`` is one of the known
    formats: a plain word; ``chapter`` an int)."""
    if chapter is None:
        return f"audio.{job.response_format}"
    return f"chapters/{int(chapter)}.{job.response_format}"


def captions_file_name(job: "StoredJob", chapter: Optional[int] = None) -> str:
    """The captions of the whole file, or of chapter ``chapter``'s (``job.captions`` is srt or vtt)."""
    if chapter is None:
        return f"captions.{job.captions}"
    return f"chapters/{int(chapter)}.{job.captions}"


def chunks_document(
    chunks: list["JobChunk"],
    voice: Optional[dict[str, Any]] = None,
    script_voices: Optional[list[dict[str, Any]]] = None,
) -> bytes:
    """``chunks.json``: the chunks and the job's voices, fixed when it is made (the voices here, not
    in ``job.json``, which the runner rewrites after every chunk). Encoded chunk by chunk and voice
    by voice: one ``json.dumps`` of a whole book holds the GIL, and with it the Ingress's loop.
    Each piece is encoded on its own and the bytes joined: building and UTF-8-encoding the
    whole document as one string are single calls over megabytes that hold the GIL too."""

    def encoded(value: Any) -> bytes:
        return json.dumps(value, ensure_ascii=False).encode()

    head = encoded({"voice": voice or {}})[1:-1]
    voices = b",".join(encoded(v) for v in script_voices or [])
    body = b",".join(encoded(c.model_dump()) for c in chunks)
    return b"".join([b"{", head, b',"script_voices":[', voices, b'],"chunks":[', body, b"]}"])


@dataclass(frozen=True)
class JobScript:
    """``chunks.json`` read back: the chunks and the voices they speak in."""

    chunks: list["JobChunk"]
    voice: dict[str, Any]
    script_voices: list[dict[str, Any]]


def parse_chunks_document(data: bytes, job: "StoredJob") -> JobScript:
    """A document of this version, or of an older one (a bare list of chunks: the voices were in
    ``job.json``)."""
    doc = json.loads(data)
    if isinstance(doc, list):
        return JobScript([JobChunk.model_validate(c) for c in doc], job.voice, job.script_voices)
    return JobScript(
        [JobChunk.model_validate(c) for c in doc["chunks"]],
        doc.get("voice") or job.voice,
        doc.get("script_voices") or job.script_voices,
    )


def default_jobs_dir() -> Path:
    """``$XDG_DATA_HOME/chattts-serve/jobs`` (``~/.local/share/...``): user data, not a cache."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "chattts-serve" / "jobs"


class JobPart(StrictModel):
    """One part of a script chunk (an SSML piece, a dialogue turn or a piece of one): the
    planner's ``ScriptPart`` with its voice as an index into the job's ``script_voices``."""

    text: str
    voice: int
    speed: float = 1.0
    prompt: str = ""
    offset: Optional[int] = None
    span: Optional[tuple[int, int]] = None
    pause_before: float = 0.0
    speaker: Optional[str] = None
    turn: Optional[int] = None


class JobChunk(StrictModel):
    """One synthesis of a job: its text, the seed it decodes with and the silence after it.
    Fixed at submission, so a chunk done again (after a crash) gives the same audio. An SSML or
    dialogue job's chunk also has its script ``parts`` (then ``text`` is their texts joined)."""

    text: str
    seed: int
    pause_after: float = 0.0
    chapter: int = 0  # its chapter's index (jobs made with chapters; 0 otherwise)
    parts: Optional[list[JobPart]] = None


class StoredJob(BaseModel):
    """``job.json``: written by the Ingress when the job is made, rewritten only by the runner
    after (each chunk, the end), always atomically. Times are Unix seconds."""

    model_config = ConfigDict(extra="ignore")

    id: str
    owner: str
    status: JobStatus = "queued"
    model: str = "chattts"
    voice_name: str
    # The resolved voices live in ``chunks.json`` (written once): this document is rewritten after
    # every chunk. A job stored by an older version has them here.
    voice: dict[str, Any] = Field(default_factory=dict)
    script_voices: list[dict[str, Any]] = Field(default_factory=list)
    options: dict[str, Any]  # ``SynthesisOptions``, instructions applied, the seed the effective one
    response_format: str
    captions: Optional[Literal["srt", "vtt"]] = None  # also a caption file (and one per chapter)
    created_at: float
    updated_at: float
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    expires_at: Optional[float] = None
    chunks_total: int
    chunk_samples: list[int] = Field(default_factory=list)  # per chunk: PCM samples once done, -1 before
    chars_total: int
    chars_done: int = 0
    input_bytes: int = 0  # its chunks' texts as stored
    bytes: int = 0  # what its files hold now
    reserved_bytes: int = 0  # what it counts against its owner's quota until done (``reservation``)
    pcm_limit_bytes: int = 0  # the chunks' PCM at most (its reservation's): past it the job fails; 0: none
    # The runner's current run: when it took the job up and what was done then (the ETA's rate).
    run_started_at: Optional[float] = None
    run_chars_start: int = 0
    retries: int = 0
    error: Optional[dict[str, str]] = None  # {"code", "message"}
    # Made with chapters: each chapter's title (None: untitled) and first chunk; once done, where
    # each starts in the whole file and its own file's length (seconds), and a file per chapter.
    chapter_titles: list[Optional[str]] = Field(default_factory=list)
    chapter_first_chunks: list[int] = Field(default_factory=list)
    chapter_times: list[tuple[float, float]] = Field(default_factory=list)

    def chapter_spans(self) -> list[tuple[int, int]]:
        """Each chapter's chunks, [first, end)."""
        ends = self.chapter_first_chunks[1:] + [self.chunks_total]
        return list(zip(self.chapter_first_chunks, ends))

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def chunks_done(self) -> int:
        return sum(1 for n in self.chunk_samples if n >= 0)

    @property
    def audio_samples(self) -> int:
        return sum(n for n in self.chunk_samples if n > 0)

    @property
    def held_bytes(self) -> int:
        return max(self.bytes, self.reserved_bytes) if self.active else self.bytes

    def expired(self, now: Optional[float] = None) -> bool:
        return self.expires_at is not None and (time.time() if now is None else now) >= self.expires_at

    def synthesis_options(self) -> SynthesisOptions:
        return SynthesisOptions.model_validate(self.options)

    def to_json(self) -> str:
        return self.model_dump_json()


@dataclass(frozen=True)
class FileStat:
    """A stored file as HTTP answers it: its size, when it was written, and a tag that changes
    whenever it does (the ETag's and If-Range's)."""

    size: int
    mtime: float
    tag: str


@dataclass(frozen=True)
class JobLimits:
    """What one owner's jobs may hold (``JobsConfig``' per-key fields)."""

    max_active: int
    max_jobs: int
    max_bytes: int


@dataclass(frozen=True)
class Usage:
    active: int
    jobs: int
    bytes: int


def usage_of(jobs: list[StoredJob], now: Optional[float] = None) -> Usage:
    live = [j for j in jobs if not j.expired(now)]
    return Usage(sum(1 for j in live if j.active), len(live), sum(j.held_bytes for j in live))


def check_room(used: Usage, limits: JobLimits, reserved: int = 0) -> None:
    """Refuse a new job of ``reserved`` bytes: 429 while the owner has its active jobs, 409 when
    it keeps as many jobs or bytes as it may."""
    if used.active >= limits.max_active:
        raise TooManyJobs(
            f"{used.active} of your jobs are queued or running; at most {limits.max_active} at once "
            "(jobs.max_active_jobs_per_key): retry once one has finished"
        )
    if used.jobs >= limits.max_jobs:
        raise JobQuotaExceeded(
            f"you keep {used.jobs} jobs; at most {limits.max_jobs} (jobs.max_jobs_per_key): delete finished ones first"
        )
    if used.bytes + reserved > limits.max_bytes:
        raise JobQuotaExceeded(
            f"your jobs hold {used.bytes} bytes and this one needs about {reserved}; at most "
            f"{limits.max_bytes} (jobs.max_bytes_per_key): delete finished ones or send less text"
        )
