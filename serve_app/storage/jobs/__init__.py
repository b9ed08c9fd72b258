"""Jobs: long texts (a book) spoken in the background into one file, owned by the key that made
them, kept until they expire.

A job is its state (``StoredJob``, ``job.json``: owner, options, the resolved voice, status,
chunks done, bytes, error, times), its chunks (``JobChunk``, fixed at submission: each chunk's
text, seed and the silence after it), each finished chunk's PCM and, once every chunk is done,
the final file in the job's format. The Ingress makes jobs (its owner's quota checked atomically
with the write), reads, lists and deletes them; the runner (``serving/jobs.py``) is the only
writer after that. Ids (``job_`` + 24 hex digits) are checked by ``JOB_ID_RE`` before any use and
owners are hashed: user input never becomes a path. Every read takes the owner: another owner's
id reads exactly as a missing one (an admin reads every owner's).

Backends: ``directory`` (``DirectoryJobStore``) only. Another one implements ``JobStore``:

- Redis: ``job.json`` as a string per job and an owner's ids in a set (create as a Lua script:
  the quota check and the write in one step, as the voice store does); chunks and the final
  file do not belong in Redis: keep them on a volume or an object store, below.
- fsspec (S3, GCS, ...): the same layout under a URL. Object stores have no rename, but a
  ``put`` of a whole object is atomic, which is all ``put_chunk``, ``save`` and ``put_audio``
  need; ``delete`` removes ``job.json`` first (then the job is gone for every reader and the
  runner's next ``save`` must see it missing: check it before each write), the quota check
  needs a lock of its own (a conditional put of a lock object), and ``audio_file`` gives way to
  a ranged read (the service then answers Range requests itself, or redirects to a signed URL).
"""

from __future__ import annotations

from pathlib import Path

from ...settings import JobsSettings
from .chunking import chunk_seed, cut_text, estimated_pcm_bytes
from .directory import DirectoryJobStore
from .model import (
    ACTIVE,
    JOB_ID_RE,
    JobChunk,
    JobGone,
    JobLimits,
    JobStatus,
    StoredJob,
    Usage,
    check_room,
    default_jobs_dir,
    new_job_id,
    owner_tag,
)
from .store import JobStore

__all__ = ["ACTIVE", "JOB_ID_RE", "DirectoryJobStore", "JobChunk", "JobGone", "JobLimits", "JobStatus", "JobStore",
           "StoredJob", "Usage", "check_room", "chunk_seed", "cut_text", "default_jobs_dir", "estimated_pcm_bytes",
           "job_limits", "jobs_root", "make_job_store", "new_job_id", "owner_tag"]


def jobs_root(cfg: JobsSettings) -> Path:
    return Path(cfg.path).expanduser() if cfg.path else default_jobs_dir()


def make_job_store(cfg: JobsSettings) -> JobStore:
    return DirectoryJobStore(jobs_root(cfg))


def job_limits(cfg: JobsSettings) -> JobLimits:
    return JobLimits(max_active=cfg.max_active_jobs_per_key, max_jobs=cfg.max_jobs_per_key,
                     max_bytes=cfg.max_bytes_per_key)
