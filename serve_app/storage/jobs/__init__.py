"""Jobs: long texts (a book) spoken in the background into one file, owned by the key that made
them, kept until they expire.

A job is its state (``StoredJob``, ``job.json``: owner, options, the resolved voice, status,
chunks done, bytes, error, times), its chunks (``JobChunk``, fixed at submission: each chunk's
text, seed and the silence after it), each finished chunk's PCM and, once every chunk is done,
the final file in the job's format. The Ingress makes jobs (its owner's quota checked atomically
with the write), reads, lists and deletes them; the runner (``deployments/job_runner.py``) is the only
writer after that. Ids (``job_`` + 24 hex digits) are checked by ``JOB_ID_RE`` before any use and
owners are hashed: user input never becomes a path or an object key. Every read takes the owner:
another owner's id reads exactly as a missing one (an admin reads every owner's).

The store (``store.py``'s ``JobStore``) is two parts, each concern in one of them:

- the state (``states.py``): ``job.json`` and which owner has which jobs; creation with the
  quota check, owner-scoped reads, the runner's saves (only while the job exists), removal.
  ``FileStates`` keeps ``job.json`` among the job's files, the check under the file store's owner
  lock; ``RedisStates`` (``jobs.redis_url``) keeps it in Redis, creation one WATCH/MULTI.
- the files (``files.py``): ``chunks.json``, ``chunks/<k>.pcm``, ``audio.<fmt>``, each written
  whole or not at all, read whole or by range, and removed so that a write racing the removal
  fails (``JobGone``) and leaves nothing. ``DirectoryFiles`` (``directory.py``: temporary file
  + rename, removal by a rename into ``.trash``, a file lock per owner) and ``ObjectFiles``
  (``object_files.py`` over ``objects.py``'s fsspec access: one PUT per object, removal behind
  a ``.gone`` marker that every write checks before and after, a per-owner lock made of
  exclusively created tickets in ``object_lock.py``, an index of active jobs so the runner's scan
  reads one listing).

``make_job_store`` puts them together: ``directory`` (files and state in a directory),
``fsspec`` (both under a URL), and either with ``redis_url`` (state in Redis, files there).
Deleting removes the state first (from then on the job is gone for every reader and its runner's
next save fails), then the files. HTTP serves a finished file as a local file where there is one
(``FileResponse``) and by ranged reads from the store otherwise (``http/ranged.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...settings import JobsConfig
from ..factory import open_store
from .files import JobFiles, Place
from .model import (
    ACTIVE,
    JOB_ID_RE,
    FileStat,
    JobChunk,
    JobGone,
    JobLimits,
    JobPart,
    JobStatus,
    StoredJob,
    Usage,
    audio_file_name,
    captions_file_name,
    check_room,
    default_jobs_dir,
    new_job_id,
    owner_tag,
)
from .states import FileStates, JobStates
from .store import JobStore

__all__ = [
    "ACTIVE",
    "JOB_ID_RE",
    "FileStat",
    "JobChunk",
    "JobFiles",
    "JobGone",
    "JobLimits",
    "JobPart",
    "JobStates",
    "JobStatus",
    "JobStore",
    "Place",
    "StoredJob",
    "Usage",
    "audio_file_name",
    "captions_file_name",
    "check_room",
    "default_jobs_dir",
    "job_limits",
    "jobs_root",
    "make_job_store",
    "new_job_id",
    "owner_tag",
    "store_identity",
    "store_location",
]


def jobs_root(cfg: JobsConfig) -> Path:
    """The directory backend's directory."""
    return Path(cfg.path).expanduser() if cfg.path else default_jobs_dir()


def store_location(cfg: JobsConfig) -> str:
    """Where the files are, as operators wrote it: the directory, or the URL."""
    return (cfg.url or "") if cfg.backend == "fsspec" else str(jobs_root(cfg))


def store_identity(cfg: JobsConfig) -> tuple[Any, ...]:
    """What decides which jobs a store holds: when it changes, the runner opens the new store."""
    return (cfg.backend, store_location(cfg), sorted(cfg.storage_options.items()), cfg.redis_url, cfg.redis_prefix)


def _object_files(cfg: JobsConfig) -> JobFiles:
    from .object_files import ObjectFiles
    from .objects import open_objects

    assert cfg.url is not None
    return ObjectFiles(open_objects(cfg.url, cfg.storage_options))


def _directory_files(cfg: JobsConfig) -> JobFiles:
    from .directory import DirectoryFiles

    return DirectoryFiles(jobs_root(cfg))


_FILES = {"directory": _directory_files, "fsspec": _object_files}


def make_files(cfg: JobsConfig) -> JobFiles:
    return open_store(_FILES, cfg)


def make_job_store(cfg: JobsConfig) -> JobStore:
    """The files ``cfg.backend`` names, the state beside them or, with ``redis_url``, in Redis."""
    files = make_files(cfg)
    if cfg.redis_url:
        from .redis_states import RedisStates

        return JobStore(RedisStates(cfg), files)
    if cfg.backend == "fsspec":
        from .object_files import ObjectFiles

        assert isinstance(files, ObjectFiles)
        files.check_exclusive_create()  # the owner lock is only as good as the store's exclusive create
    return JobStore(FileStates(files), files)


def job_limits(cfg: JobsConfig) -> JobLimits:
    return JobLimits(
        max_active=cfg.max_active_jobs_per_key, max_jobs=cfg.max_jobs_per_key, max_bytes=cfg.max_bytes_per_key
    )
