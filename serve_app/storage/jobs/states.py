"""The state part of a job store (``JobStates``): each job's ``StoredJob`` (``job.json``) and which
owner has which jobs. It makes a job (the owner's quota checked atomically with the write), reads
and lists for owners, saves the runner's progress only while the job exists, and forgets a job.

Backends: ``FileStates`` (``job.json`` among the job's own files, under the file store's owner
lock) and ``RedisStates`` (``redis_states.py``).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Callable, Optional

from pydantic import ValidationError

from .files import JobFiles, Place
from .model import JOB_ID_RE, STATE_FILE, JobLimits, StoredJob, check_room, owner_tag, usage_of

log = logging.getLogger("ray.serve")


def parse_state(data: bytes, where: str) -> Optional[StoredJob]:
    try:
        return StoredJob.model_validate_json(data)
    except (ValidationError, ValueError) as exc:  # never half-written: a document of another version
        log.warning("jobs: unreadable state of %s: %s", where, exc.__class__.__name__)
        return None


class JobStates(ABC):
    """Every call blocks. Reads return expired jobs too (the store filters them)."""

    @abstractmethod
    def create(self, job: StoredJob, limits: JobLimits, stage: Callable[[], None], unstage: Callable[[], None]) -> None:
        """Store the new job if its owner has room (``check_room``), atomically with the check:
        concurrent creations of one owner, from any process, cannot both pass. ``stage`` (the
        job's files) runs once the room is known and before the job appears; ``unstage`` undoes
        it when the job is not made after all."""

    @abstractmethod
    def get(self, job_id: str, owner: str, admin: bool) -> Optional[StoredJob]:
        """``owner``'s job (an admin: anyone's, its own first); another owner's id costs what a
        missing one does."""

    @abstractmethod
    def jobs(self, owner: Optional[str]) -> list[StoredJob]:
        """``owner``'s jobs (None: everyone's)."""

    def active(self) -> list[StoredJob]:
        return [j for j in self.jobs(None) if j.active]

    @abstractmethod
    def save(self, job: StoredJob) -> None:
        """Replace the job's state whole; ``JobGone`` (and nothing written) when it is forgotten."""

    @abstractmethod
    def remove(self, job: StoredJob) -> bool:
        """Forget the job: from here on it is gone for every reader and ``save`` fails. True when
        this call removed it."""


class FileStates(JobStates):
    """``job.json`` in the job's place: the job appears when it is written (after its
    ``chunks.json``), and goes with its place (``remove_place``: later writes fail)."""

    def __init__(self, files: JobFiles):
        self.files = files

    def _read(self, places: list[Place]) -> list[StoredJob]:
        found = self.files.get_many(places, STATE_FILE)
        jobs = (parse_state(found[p], p.job_id) for p in places if p in found)
        return [j for j in jobs if j is not None]

    def create(self, job: StoredJob, limits: JobLimits, stage: Callable[[], None], unstage: Callable[[], None]) -> None:
        place = Place.of(job)
        with self.files.owner_lock(place.owner_tag):
            check_room(usage_of(self.jobs(job.owner)), limits, job.reserved_bytes)
            try:
                stage()
                self.files.index_add(place)  # before the state: an active job is never missing from it
                self.files.put(place, STATE_FILE, [job.to_json().encode()])
            except BaseException:
                unstage()
                raise

    def get(self, job_id: str, owner: str, admin: bool) -> Optional[StoredJob]:
        if not JOB_ID_RE.fullmatch(job_id):
            return None
        # The owner's own place first: for a non-admin nothing else is ever looked at.
        candidates = [Place(owner_tag(owner), job_id)]
        if admin:
            candidates += [Place(t, job_id) for t in self.files.owners() if t != candidates[0].owner_tag]
        for place in candidates:
            data = self.files.get(place, STATE_FILE)
            job = parse_state(data, job_id) if data is not None else None
            if job is not None and job.id == job_id and (admin or job.owner == owner) and not self.files.removed(place):
                return job
        return None

    def jobs(self, owner: Optional[str]) -> list[StoredJob]:
        tags = [owner_tag(owner)] if owner is not None else self.files.owners()
        jobs = self._read([p for t in tags for p in self.files.places(t)])
        return [j for j in jobs if owner is None or j.owner == owner]

    def active(self) -> list[StoredJob]:
        if not self.files.indexes_active:
            return super().active()
        indexed = self.files.indexed()
        jobs = {j.id: j for j in self._read(indexed)}
        for place in indexed:
            job = jobs.get(place.job_id)
            if job is not None and not job.active:
                self.files.index_remove(place)  # it finished, then stopped before it said so
        # No state (yet): a creation in progress, or one that died (the sweep's to remove).
        return [j for j in jobs.values() if j.active]

    def save(self, job: StoredJob) -> None:
        place = Place.of(job)
        self.files.put(place, STATE_FILE, [job.to_json().encode()])
        if not job.active:
            self.files.index_remove(place)

    def remove(self, job: StoredJob) -> bool:
        return self.files.remove_place(Place.of(job))
