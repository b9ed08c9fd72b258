"""The ``directory`` backend: one directory per job under its owner's, on one host or a volume
every node of the Ingress replicas and the runner mounts at the same path.

    <root>/<owner tag>/.lock                  the owner's lock: quota check + create
    <root>/<owner tag>/<job id>/job.json      the state (rewritten whole after each chunk)
                               /chunks.json   the chunks (fixed at submission)
                               /chunks/<k>.pcm  each finished chunk's PCM
                               /audio.<fmt>   the final file (then the chunks go)
    <root>/.trash/                            deleted jobs on their way out

Every file is written to a temporary name in its directory, flushed and renamed into place, so a
reader (or a runner taking a job up after a crash) sees a file whole or not at all. A job is
made as ``.tmp-<id>`` and renamed into place, and deleted by a rename into ``.trash`` first: its
runner's next write then fails (``JobGone``) instead of re-creating anything.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterable, Iterator, Optional

from pydantic import ValidationError

from .model import (
    JOB_ID_RE,
    PCM_BYTES_PER_SAMPLE,
    JobChunk,
    JobGone,
    JobLimits,
    StoredJob,
    Usage,
    check_room,
    owner_tag,
    usage_of,
)
from .store import JobStore

log = logging.getLogger("ray.serve")

STALE_TEMP_S = 3600.0  # a half-made job or file this old was left by a crash
LOCK_TIMEOUT_S = 10.0


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, pieces: Iterable[bytes]) -> int:
    """Write ``pieces`` to a temporary file beside ``path``, flush it to disk, rename it into
    place: readers see the old file or the new one, never a part. Its size. ``JobGone`` when
    the directory is gone (the job was deleted)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    except FileNotFoundError:
        raise JobGone(str(path.parent.name)) from None
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
                size += len(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except FileNotFoundError:
        Path(tmp).unlink(missing_ok=True)
        raise JobGone(str(path.parent.name)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


class DirectoryJobStore(JobStore):
    def __init__(self, root: Path):
        from filelock import FileLock

        self._FileLock = FileLock
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.trash = self.root / ".trash"
        self.trash.mkdir(exist_ok=True)

    # ------------------------------------------------------------------ paths

    def _owner_dir(self, owner: str) -> Path:
        return self.root / owner_tag(owner)

    def _dir(self, job: StoredJob) -> Path:
        assert JOB_ID_RE.match(job.id), job.id  # ids are generated and checked, never user text
        return self._owner_dir(job.owner) / job.id

    def _chunk_path(self, job: StoredJob, index: int) -> Path:
        return self._dir(job) / "chunks" / f"{int(index)}.pcm"

    def _owner_dirs(self) -> list[Path]:
        return [p for p in self.root.iterdir() if p.is_dir() and not p.name.startswith(".")]

    @staticmethod
    def _job_dirs(owner_dir: Path) -> list[Path]:
        try:
            return [p for p in owner_dir.iterdir() if JOB_ID_RE.match(p.name)]
        except FileNotFoundError:
            return []

    @staticmethod
    def _read(job_dir: Path) -> Optional[StoredJob]:
        try:
            return StoredJob.model_validate_json((job_dir / "job.json").read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None
        except (ValidationError, ValueError) as exc:  # never half-written: a file from another version
            log.warning("jobs: unreadable %s: %s", job_dir.name, exc.__class__.__name__)
            return None

    def _jobs_of(self, owner_dir: Path) -> list[StoredJob]:
        jobs = (self._read(d) for d in self._job_dirs(owner_dir))
        return [j for j in jobs if j is not None]

    def _find(self, job_id: str, owner: str, admin: bool) -> Optional[tuple[Path, StoredJob]]:
        if not JOB_ID_RE.match(job_id):
            return None
        # The owner's own directory first: for a non-admin nothing else is ever looked at, so
        # another owner's id costs what a missing one does.
        candidates = [self._owner_dir(owner) / job_id]
        if admin:
            candidates += [d / job_id for d in self._owner_dirs()]
        for path in candidates:
            job = self._read(path)
            if job is not None and job.id == job_id and (admin or job.owner == owner) and not job.expired():
                return path, job
        return None

    # ------------------------------------------------------------------ the Ingress's side

    def usage(self, owner: str) -> Usage:
        return usage_of(self._jobs_of(self._owner_dir(owner)))

    def create(self, job: StoredJob, chunks: list[JobChunk], limits: JobLimits) -> StoredJob:
        owner_dir = self._owner_dir(job.owner)
        owner_dir.mkdir(exist_ok=True)
        chunks_doc = json.dumps([c.model_dump() for c in chunks], ensure_ascii=False).encode()
        with self._FileLock(str(owner_dir / ".lock"), timeout=LOCK_TIMEOUT_S):
            check_room(usage_of(self._jobs_of(owner_dir)), limits, job.reserved_bytes)
            tmp = owner_dir / f".tmp-{job.id}"
            final = owner_dir / job.id
            try:
                (tmp / "chunks").mkdir(parents=True)
                write_atomic(tmp / "chunks.json", [chunks_doc])
                job.input_bytes = job.bytes = len(chunks_doc)
                write_atomic(tmp / "job.json", [job.to_json().encode()])
                _fsync_dir(tmp)
                os.rename(tmp, final)  # the job appears whole: the runner never sees half of one
                _fsync_dir(owner_dir)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
        return job

    def get(self, job_id: str, owner: str, admin: bool = False) -> Optional[StoredJob]:
        found = self._find(job_id, owner, admin)
        return found[1] if found else None

    def list(self, owner: str, admin: bool = False) -> list[StoredJob]:
        dirs = self._owner_dirs() if admin else [self._owner_dir(owner)]
        jobs = [j for d in dirs for j in self._jobs_of(d) if (admin or j.owner == owner) and not j.expired()]
        return sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)

    def delete(self, job_id: str, owner: str, admin: bool = False) -> Optional[StoredJob]:
        found = self._find(job_id, owner, admin)
        if found is None:
            return None
        path, job = found
        if not self._discard(path):
            return None  # deleted meanwhile by another call
        return job

    def _discard(self, path: Path) -> bool:
        """Rename the job out of its place (atomic: from here on it is gone for every reader and
        its runner's writes fail), then delete its files."""
        gone = self.trash / f"{path.name}-{os.urandom(6).hex()}"
        try:
            os.rename(path, gone)
        except FileNotFoundError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def audio_file(self, job: StoredJob) -> Optional[Path]:
        path = self._dir(job) / f"audio.{job.response_format}"
        return path if path.is_file() else None

    # ------------------------------------------------------------------ the runner's side

    def active_jobs(self) -> list[StoredJob]:
        jobs = [j for d in self._owner_dirs() for j in self._jobs_of(d) if j.active]
        return sorted(jobs, key=lambda j: (j.created_at, j.id))

    def chunks(self, job: StoredJob) -> list[JobChunk]:
        try:
            doc = json.loads((self._dir(job) / "chunks.json").read_bytes())
        except FileNotFoundError:
            raise JobGone(job.id) from None
        return [JobChunk.model_validate(c) for c in doc]

    def done_chunks(self, job: StoredJob) -> dict[int, int]:
        folder = self._dir(job) / "chunks"
        done: dict[int, int] = {}
        try:
            entries = list(folder.iterdir())
        except FileNotFoundError:
            raise JobGone(job.id) from None
        for p in entries:
            if p.name.startswith(".tmp-"):
                p.unlink(missing_ok=True)  # a chunk a run was writing when it stopped
            elif p.suffix == ".pcm" and p.stem.isdigit():
                done[int(p.stem)] = p.stat().st_size // PCM_BYTES_PER_SAMPLE
        return done

    def put_chunk(self, job: StoredJob, index: int, pcm: bytes) -> None:
        write_atomic(self._chunk_path(job, index), [pcm])

    def read_chunk(self, job: StoredJob, index: int) -> bytes:
        try:
            return self._chunk_path(job, index).read_bytes()
        except FileNotFoundError:
            raise JobGone(job.id) from None

    def save(self, job: StoredJob) -> None:
        write_atomic(self._dir(job) / "job.json", [job.to_json().encode()])

    def put_audio(self, job: StoredJob, pieces: Iterable[bytes]) -> int:
        return write_atomic(self._dir(job) / f"audio.{job.response_format}", pieces)

    def remove_chunks(self, job: StoredJob) -> None:
        shutil.rmtree(self._dir(job) / "chunks", ignore_errors=True)

    def sweep(self, now: Optional[float] = None) -> int:
        now = time.time() if now is None else now
        deleted = 0
        for owner_dir in self._owner_dirs():
            for entry in list(_children(owner_dir)):
                if entry.name.startswith(".tmp-") and entry.is_dir() and now - _mtime(entry) > STALE_TEMP_S:
                    shutil.rmtree(entry, ignore_errors=True)  # a creation that crashed before its rename
                    continue
                if not JOB_ID_RE.match(entry.name):
                    continue
                job = self._read(entry)
                if job is None:
                    if now - _mtime(entry) > STALE_TEMP_S:
                        deleted += self._discard(entry)  # a directory without its state: nothing to resume
                    continue
                if job.expired(now):
                    deleted += self._discard(entry)
                elif not job.active and (entry / "chunks").exists():
                    shutil.rmtree(entry / "chunks", ignore_errors=True)  # finished, then stopped before this
        for entry in _children(self.trash):
            shutil.rmtree(entry, ignore_errors=True)
        return deleted


def _children(path: Path) -> Iterator[Path]:
    try:
        yield from path.iterdir()
    except FileNotFoundError:
        return


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return time.time()
