"""The job store's interface. Every call blocks (files, or a network store): callers on an event
loop run them in a thread (``asyncio.to_thread``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Iterable, Optional

from .model import JobChunk, JobLimits, StoredJob, Usage


class JobStore(ABC):
    """Two users: the Ingress makes, reads, lists and deletes jobs for their owners; the runner
    (the only writer of a job after it is made) resumes, stores chunks and the final audio,
    and sweeps. A non-admin read takes the owner first, so another owner's id reads exactly as
    a missing one."""

    # ------------------------------------------------------------------ the Ingress's side

    @abstractmethod
    def usage(self, owner: str) -> Usage: ...

    @abstractmethod
    def create(self, job: StoredJob, chunks: list[JobChunk], limits: JobLimits) -> StoredJob:
        """Store a new job, its owner's limits checked atomically with the write (``TooManyJobs``,
        ``JobQuotaExceeded``): concurrent submissions of one owner cannot both pass."""

    @abstractmethod
    def get(self, job_id: str, owner: str, admin: bool = False) -> Optional[StoredJob]:
        """``owner``'s job (an admin: anyone's); None when missing, expired or another owner's."""

    @abstractmethod
    def list(self, owner: str, admin: bool = False) -> list[StoredJob]:
        """``owner``'s jobs (an admin: everyone's), newest first, expired ones left out."""

    @abstractmethod
    def delete(self, job_id: str, owner: str, admin: bool = False) -> Optional[StoredJob]:
        """Delete the job and its files at once; what it was, or None (as for ``get``)."""

    @abstractmethod
    def audio_file(self, job: StoredJob) -> Optional[Path]:
        """The finished audio as a local file (what Range requests are served from)."""

    # ------------------------------------------------------------------ the runner's side

    @abstractmethod
    def active_jobs(self) -> list[StoredJob]:
        """Every owner's queued and running jobs, oldest first."""

    @abstractmethod
    def chunks(self, job: StoredJob) -> list[JobChunk]: ...

    @abstractmethod
    def done_chunks(self, job: StoredJob) -> dict[int, int]:
        """Chunk index -> PCM samples of every chunk stored whole; drops what a run cut short.
        Call it only while nothing writes the job's chunks (when the runner takes the job up)."""

    @abstractmethod
    def put_chunk(self, job: StoredJob, index: int, pcm: bytes) -> None:
        """Store a chunk's PCM whole or not at all; ``JobGone`` when the job was deleted."""

    @abstractmethod
    def read_chunk(self, job: StoredJob, index: int) -> bytes: ...

    @abstractmethod
    def save(self, job: StoredJob) -> None:
        """Replace ``job.json`` whole; ``JobGone`` when the job was deleted meanwhile."""

    @abstractmethod
    def put_audio(self, job: StoredJob, pieces: Iterable[bytes]) -> int:
        """Store the final file from ``pieces`` whole or not at all; its size."""

    @abstractmethod
    def remove_chunks(self, job: StoredJob) -> None: ...

    @abstractmethod
    def sweep(self, now: Optional[float] = None) -> int:
        """Delete expired jobs and what interrupted writes left; how many jobs went."""
