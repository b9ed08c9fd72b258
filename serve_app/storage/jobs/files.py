"""The file part of a job store (``JobFiles``): where a job's files live (its ``Place``) and how
they are written, read and removed. The state part (``states.py``) decides what a job is; this
part only keeps bytes, each file whole or not at all.

A place holds ``chunks.json`` (written when the job is made), ``chunks/<k>.pcm`` (each finished
chunk), ``audio.<fmt>`` (the final file) and, when the state lives with the files, ``job.json``.
Once ``remove_place`` has begun, every write to the place fails with ``JobGone`` and leaves
nothing behind: that is what lets a job be deleted while its runner writes.

Backends: ``directory.py`` (a local directory or a shared volume) and ``object_files.py``
(fsspec: S3 and other object stores, ``file://``, ``memory://``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional

from .model import FILE_NAME_RE, JOB_ID_RE, OWNER_TAG_RE, FileStat, StoredJob, owner_tag


@dataclass(frozen=True)
class Place:
    """A job's folder: its owner's tag (a hash) and its id, both checked here, so nothing a
    user sends ever becomes part of a path or an object key."""

    owner_tag: str
    job_id: str

    def __post_init__(self) -> None:
        if not (OWNER_TAG_RE.fullmatch(self.owner_tag) and JOB_ID_RE.fullmatch(self.job_id)):
            raise ValueError(f"not a job's place: {self.owner_tag[:40]!r}/{self.job_id[:40]!r}")

    @classmethod
    def of(cls, job: StoredJob) -> "Place":
        return cls(owner_tag(job.owner), job.id)

    def key(self, name: str = "") -> str:
        """``<owner tag>/<job id>[/<name>]``; ``name`` one of the store's own file names."""
        if not name:
            return f"{self.owner_tag}/{self.job_id}"
        if not FILE_NAME_RE.fullmatch(name):
            raise ValueError(f"not a job file name: {name[:40]!r}")
        return f"{self.owner_tag}/{self.job_id}/{name}"


class JobFiles(ABC):
    """Every call blocks; none takes user text (places and names are checked)."""

    location: str  # what operators recognise: a path or a URL
    indexes_active = False  # keeps an index of active jobs (``index_*``): a scan of every job costs too much

    # ------------------------------------------------------------------ places

    @abstractmethod
    def make_place(self, place: Place, chunks_doc: bytes) -> None:
        """The job's place with its ``chunks.json``."""

    @abstractmethod
    def remove_place(self, place: Place) -> bool:
        """Remove the place and everything in it; writes to it from here on fail (``JobGone``).
        True when this call removed it (not another one before it). Idempotent."""

    @abstractmethod
    def removed(self, place: Place) -> bool:
        """Whether the place's removal has begun (its ``job.json`` may still be readable)."""

    @abstractmethod
    def owners(self) -> list[str]:
        """The owner tags that have places."""

    @abstractmethod
    def places(self, tag: str) -> list[Place]:
        """The owner's places, removed ones left out."""

    @abstractmethod
    def age(self, place: Place, now: float) -> float:
        """Seconds since anything in the place was written (what the sweep judges leftovers by)."""

    @abstractmethod
    def owner_lock(self, tag: str) -> AbstractContextManager:
        """The owner's lock, held while a job is made (its quota checked); ``TimeoutError`` after
        ``LOCK_TIMEOUT_S``. Correct between every process and node that uses the store."""

    # ------------------------------------------------------------------ files

    @abstractmethod
    def put(self, place: Place, name: str, pieces: Iterable[bytes]) -> int:
        """Store ``pieces`` as the file ``name``, whole or not at all (readers see the old file or
        the new one); its size. ``JobGone`` when the place is removed, and then nothing is left."""

    @abstractmethod
    def get(self, place: Place, name: str) -> Optional[bytes]: ...

    def get_many(self, places: list[Place], name: str) -> dict[Place, bytes]:
        """The file ``name`` of each place that has it."""
        found = {p: self.get(p, name) for p in places}
        return {p: data for p, data in found.items() if data is not None}

    @abstractmethod
    def stat(self, place: Place, name: str) -> Optional[FileStat]: ...

    @abstractmethod
    def read_range(self, place: Place, name: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end), without reading the rest."""

    def local_path(self, place: Place, name: str) -> Optional[Path]:
        """The file as a local path, when the files are local (then HTTP serves it as a file)."""
        return None

    @abstractmethod
    def listing(self, place: Place, folder: str) -> dict[str, int]:
        """The files in ``folder`` (name -> size); what an interrupted write left is dropped.
        Call it only while nothing writes there."""

    @abstractmethod
    def remove(self, place: Place, name: str) -> None:
        """Remove a file or a folder of the place."""

    def clean_temporaries(self, place: Place) -> None:
        """Remove what an interrupted write left in the place (a killed runner's half-written
        final file): call it only while nothing writes there (when the runner takes a job up)."""
        return None

    @abstractmethod
    def sweep(self, now: float) -> None:
        """Remove what interrupted work of the backend's own left (temporaries, deleted places on
        their way out, removal markers, stale index entries)."""

    # ------------------------------------------------------------------ the active index

    def index_add(self, place: Place) -> None:
        return None

    def index_remove(self, place: Place) -> None:
        return None

    def indexed(self) -> list[Place]:
        return []
