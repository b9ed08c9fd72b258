"""``args.jobs``: long-form jobs, their store and their runner."""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import Field, model_validator

from ..engine.strict import StrictModel
from .units import KiB, MiB


class JobsConfig(StrictModel):
    """``args.jobs``: long work (``POST /v1/audio/jobs``) run in the background by the
    application's job runner (``deployments/job_runner.py``) and kept in the job store (``storage/jobs/``)."""

    backend: Literal["directory", "fsspec"] = Field(
        default="directory",
        description="Where jobs' files (chunks' PCM, the final audio) and, without redis_url, their state live. "
        "directory: one host, or a volume every node that runs an Ingress replica or the runner mounts at the same "
        "path; fsspec: the same layout under jobs.url (an object store such as S3, shared by every node).",
    )
    path: Optional[str] = Field(
        default=None, description="directory backend; default $XDG_DATA_HOME/chattts-serve/jobs"
    )
    url: Optional[str] = Field(
        default=None,
        description="fsspec backend: s3://bucket/prefix (needs chattts-serve[s3]), another fsspec URL (gs://...), "
        "file:///path, or memory://name (one process: tests only). The store must honour exclusive creates "
        "(If-None-Match) unless redis_url keeps the state.",
    )
    storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="fsspec backend: the filesystem's options, e.g. for an S3-compatible store "
        "{endpoint_url: ..., key: ..., secret: ...}; credentials are better left to the environment "
        "(AWS_ACCESS_KEY_ID, an instance role), since settings travel to every replica and the runner.",
    )
    redis_url: Optional[str] = Field(
        default=None,
        description="redis://host:port/db: keep each job's state and each key's job ids in Redis (creation and "
        "its quota check one transaction); the files stay on the backend above.",
    )
    redis_prefix: str = Field(default="chattts:jobs", min_length=1, max_length=64, pattern=r"^[A-Za-z0-9:_.-]+$")
    redis_timeout_s: float = Field(default=2.0, gt=0)
    max_input_chars: int = Field(default=1_000_000, ge=1, description="A job's text at most.")
    max_upload_bytes: int = Field(
        default=8 * MiB,
        ge=64 * KiB,
        description="Body limit of POST /v1/audio/jobs "
        "(a million CJK characters are ~3 MB of UTF-8, ~6 MB as JSON escapes).",
    )
    chunk_chars: int = Field(
        default=600,
        ge=10,
        le=4000,
        description="A chunk (one synthesis) holds whole sentences "
        "up to this many characters; a paragraph is never merged with the next.",
    )
    paragraph_pause_s: float = Field(
        default=0.5, ge=0.0, le=5.0, description="Silence after a chunk that ends a paragraph."
    )
    chapter_pause_s: float = Field(
        default=2.0,
        ge=0.0,
        le=10.0,
        description="Silence after a chapter's last chunk in the whole file (jobs made with chapters).",
    )
    chunks_per_acoustic_replica: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Chunks synthesised at once for "
        "every running Acoustic replica of the app, over all jobs: jobs spread "
        "over the replicas, and more replicas finish them sooner.",
    )
    max_parallel_chunks: int = Field(
        default=64, ge=1, le=1024, description="Chunks synthesised at once at most, however many Acoustic replicas run."
    )
    priority: int = Field(
        default=-10,
        ge=-10,
        le=10,
        description="Admission priority of a job's segments (interactive requests have 0: they are admitted first).",
    )
    max_chunk_retries: int = Field(
        default=8,
        ge=0,
        description="Failed tries of one chunk (a replica died, a stage failed) before the job fails with the reason.",
    )
    retry_backoff_s: float = Field(
        default=1.0, gt=0, description="Wait before a chunk's first retry, doubled each time up to 10 s."
    )
    chunk_timeout_s: float = Field(default=900.0, gt=0, description="A chunk not done within this is tried again.")
    allow_anonymous: bool = Field(
        default=False,
        description="Jobs without an API key (security.auth 'optional' "
        "and no key loaded): every such caller is the one owner 'anonymous', who lists, "
        "fetches and deletes every other's jobs; off, the jobs routes answer 403 "
        "jobs_need_api_key to a caller without a key.",
    )
    max_submissions_at_once: int = Field(
        default=2,
        ge=1,
        le=64,
        description="Submissions being read and planned "
        "at once per Ingress replica (a book's plan takes seconds of a thread); "
        "503 job_submissions_busy past it, and 429 to a key that has one under way.",
    )
    reservation_headroom: float = Field(
        default=0.5,
        ge=0.0,
        le=4.0,
        description="A job reserves its planned audio "
        "times 1 + this (real weights end near the planned length, not on it); "
        "its chunks' PCM past that fails it (reservation_exceeded).",
    )
    max_active_jobs_per_key: int = Field(
        default=4,
        ge=1,
        description="Jobs queued or running at once per key "
        "(with allow_anonymous and no keys, every caller is 'anonymous' and they "
        "share it): 429 past it.",
    )
    max_jobs_per_key: int = Field(
        default=100, ge=1, description="Jobs kept per key, finished ones included: 409 past it."
    )
    max_bytes_per_key: int = Field(
        default=16 * 1024 * MiB,
        ge=MiB,
        description="Bytes a key's jobs may hold (a job "
        "counts its reservation until it is done: its normalised plan's PCM with "
        "reservation_headroom, twice with chapters; its files after): 409 past it.",
    )
    ttl_s: float = Field(default=7 * 86400.0, gt=0, description="A finished job (its audio) is kept this long.")
    sweep_interval_s: float = Field(default=600.0, gt=0, description="How often the runner deletes expired jobs.")
    rescan_s: float = Field(default=5.0, gt=0, description="How often the runner looks for jobs it was not told about.")
    runner_num_cpus: float = Field(
        default=0.1,
        ge=0.0,
        description="The runner actor's CPUs (it encodes each finished job's file once; the synthesis is the stages').",
    )

    @model_validator(mode="after")
    def _check_store(self) -> "JobsConfig":
        if self.backend == "fsspec":
            if not self.url or "://" not in self.url or not self.url.split("://", 1)[0]:
                raise ValueError(
                    "jobs backend 'fsspec' needs url: s3://bucket/prefix, file:///path, memory://name, ..."
                )
            protocol = self.url.split("://", 1)[0]
            try:
                import fsspec
            except ImportError:  # make_job_store says what to install
                fsspec = None
            if fsspec is not None and protocol not in fsspec.available_protocols():
                raise ValueError(f"jobs.url: fsspec knows no {protocol!r} filesystem")
            if self.path:
                raise ValueError("jobs.path is the directory backend's; with backend 'fsspec' give url")
        else:
            if self.url or self.storage_options:
                raise ValueError("jobs.url and jobs.storage_options are the fsspec backend's: set backend: fsspec")
        if self.redis_url is not None and not self.redis_url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("jobs.redis_url must be a redis://, rediss:// or unix:// URL")
        return self
