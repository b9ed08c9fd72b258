"""The job store (``JobStore``): a state part (``states.py``: ``job.json`` and owners' ids, on
the files or in Redis) and a file part (``files.py``: chunks' PCM and the final audio, in a
directory or through fsspec), put together once here. Every call blocks (files, or a network
store): callers on an event loop run them in a thread (``asyncio.to_thread``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable, Optional

from .files import JobFiles, Place
from .model import (
    CHUNKS_FILE,
    CHUNKS_FOLDER,
    JOB_ID_RE,
    PCM_BYTES_PER_SAMPLE,
    STALE_TEMP_S,
    FileStat,
    JobChunk,
    JobGone,
    JobLimits,
    JobScript,
    StoredJob,
    Usage,
    audio_file_name,
    captions_file_name,
    chunk_file,
    chunks_document,
    parse_chunks_document,
    timing_file,
    usage_of,
)
from .states import JobStates

_CHUNK_NAME = ".pcm"


class JobStore:
    """Two users: the Ingress makes, reads, lists and deletes jobs for their owners; the runner
    (the only writer of a job after it is made) resumes, stores chunks and the final audio,
    and sweeps. A non-admin read takes the owner first, so another owner's id reads exactly as
    a missing one."""

    def __init__(self, states: JobStates, files: JobFiles):
        self.states = states
        self.files = files

    # ------------------------------------------------------------------ the Ingress's side

    def usage(self, owner: str) -> Usage:
        return usage_of(self.states.jobs(owner))

    def create(
        self,
        job: StoredJob,
        chunks: list[JobChunk],
        limits: JobLimits,
        voice: Optional[dict] = None,
        script_voices: Optional[list[dict]] = None,
    ) -> StoredJob:
        """Store a new job, its owner's limits checked atomically with the write (``TooManyJobs``,
        ``JobQuotaExceeded``): concurrent submissions of one owner cannot both pass. Its files
        are written first; the job appears (whole) when its state does. ``voice`` and
        ``script_voices`` (resolved) go with the chunks, written once."""
        doc = chunks_document(chunks, voice, script_voices)
        job.input_bytes = job.bytes = len(doc)
        place = Place.of(job)
        self.states.create(
            job, limits, stage=lambda: self.files.make_place(place, doc), unstage=lambda: self.files.remove_place(place)
        )
        return job

    def get(self, job_id: str, owner: str, admin: bool = False) -> Optional[StoredJob]:
        """``owner``'s job (an admin: anyone's); None when missing, expired or another owner's."""
        if not JOB_ID_RE.fullmatch(job_id):
            return None
        job = self.states.get(job_id, owner, admin)
        return job if job is not None and not job.expired() else None

    def list(self, owner: str, admin: bool = False) -> list[StoredJob]:
        """``owner``'s jobs (an admin: everyone's), newest first, expired ones left out."""
        jobs = [j for j in self.states.jobs(None if admin else owner) if not j.expired()]
        return sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)

    def delete(self, job_id: str, owner: str, admin: bool = False) -> Optional[StoredJob]:
        """Delete the job and its files at once (the state first: from then on the job is gone
        for every reader and its runner's writes fail); what it was, or None (as for ``get``)."""
        job = self.get(job_id, owner, admin)
        if job is None or not self.states.remove(job):
            return None  # missing, or deleted meanwhile by another call
        self.files.remove_place(Place.of(job))
        return job

    # What HTTP serves a job's file from (``serve_app/jobs/``): a local file when there is one, else
    # ranged reads.

    def local_path(self, job: StoredJob, name: str) -> Optional[Path]:
        return self.files.local_path(Place.of(job), name)

    def stat(self, job: StoredJob, name: str) -> Optional[FileStat]:
        return self.files.stat(Place.of(job), name)

    def read_range(self, job: StoredJob, name: str, start: int, length: int) -> bytes:
        return self.files.read_range(Place.of(job), name, start, length)

    # ------------------------------------------------------------------ the runner's side

    def active_jobs(self) -> list[StoredJob]:
        """Every owner's queued and running jobs, oldest first."""
        return sorted(self.states.active(), key=lambda j: (j.created_at, j.id))

    def script(self, job: StoredJob) -> JobScript:
        """The job's chunks and voices (``chunks.json``)."""
        doc = self.files.get(Place.of(job), CHUNKS_FILE)
        if doc is None:
            raise JobGone(job.id)
        return parse_chunks_document(doc, job)

    def chunks(self, job: StoredJob) -> list[JobChunk]:
        return self.script(job).chunks

    def done_chunks(self, job: StoredJob) -> dict[int, int]:
        """Chunk index -> PCM samples of every chunk stored whole; drops what a run cut short.
        Call it only while nothing writes the job's chunks (when the runner takes the job up)."""
        listing = self.files.listing(Place.of(job), CHUNKS_FOLDER)
        return {
            int(name[: -len(_CHUNK_NAME)]): size // PCM_BYTES_PER_SAMPLE
            for name, size in listing.items()
            if name.endswith(_CHUNK_NAME) and name[: -len(_CHUNK_NAME)].isdigit()
        }

    def put_chunk(self, job: StoredJob, index: int, pcm: bytes, timing: Optional[list] = None) -> None:
        """Store a chunk's PCM whole or not at all, its ``timing`` (``[[start, end, text, speaker], ...]``,
        samples in the PCM) first: a stored chunk has both. ``JobGone`` when the job was deleted."""
        place = Place.of(job)
        if timing is not None:
            self.files.put(place, timing_file(index), [json.dumps(timing, ensure_ascii=False).encode()])
        self.files.put(place, chunk_file(index), [pcm])

    def clean_temporaries(self, job: StoredJob) -> None:
        """What a killed run left half-written in the job's place (``JobFiles.clean_temporaries``)."""
        self.files.clean_temporaries(Place.of(job))

    def read_timing(self, job: StoredJob, index: int) -> list:
        """A chunk's ``timing`` as ``put_chunk`` stored it; [] when it has none (an empty chunk)."""
        data = self.files.get(Place.of(job), timing_file(index))
        return json.loads(data) if data else []

    def read_chunk(self, job: StoredJob, index: int) -> bytes:
        data = self.files.get(Place.of(job), chunk_file(index))
        if data is None:
            raise JobGone(job.id)
        return data

    def save(self, job: StoredJob) -> None:
        """Replace the job's state whole; ``JobGone`` when the job was deleted meanwhile."""
        self.states.save(job)

    def put_audio(self, job: StoredJob, pieces: Iterable[bytes], chapter: Optional[int] = None) -> int:
        """Store the final file (or chapter ``chapter``'s) from ``pieces`` whole or not at all; its size."""
        return self.files.put(Place.of(job), audio_file_name(job, chapter), pieces)

    def put_captions(self, job: StoredJob, text: str, chapter: Optional[int] = None) -> int:
        """Store the caption file of the whole audio (or of chapter ``chapter``'s); its size."""
        return self.files.put(Place.of(job), captions_file_name(job, chapter), [text.encode()])

    def remove_chunks(self, job: StoredJob) -> None:
        self.files.remove(Place.of(job), CHUNKS_FOLDER)

    def sweep(self, now: Optional[float] = None) -> int:
        """Delete expired jobs and what interrupted work left; how many jobs went."""
        now = time.time() if now is None else now
        deleted = 0
        jobs = self.states.jobs(None)
        for job in jobs:
            place = Place.of(job)
            if job.expired(now):
                if self.states.remove(job):
                    self.files.remove_place(place)
                    deleted += 1
            elif not job.active and self._has_chunks(place):
                self.files.remove(place, CHUNKS_FOLDER)  # finished, then stopped before its chunks went
        # Places without a state: a creation that died before its state, or files a deletion
        # left. Young ones may be a creation in progress.
        known = {Place.of(j) for j in jobs}
        for tag in self.files.owners():
            for place in self.files.places(tag):
                if place not in known and self.files.age(place, now) > STALE_TEMP_S:
                    self.files.remove_place(place)
        self.files.sweep(now)
        return deleted

    def _has_chunks(self, place: Place) -> bool:
        try:
            return bool(self.files.listing(place, CHUNKS_FOLDER))
        except JobGone:
            return False
