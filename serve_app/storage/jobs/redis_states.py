"""Job state in Redis (``RedisStates``, ``jobs.redis_url``): every node reads and writes the same
state without a shared volume; the files stay on the directory or fsspec storage.

    <prefix>:job:<job id>       the job's ``job.json`` (a string)
    <prefix>:own:<owner tag>    the owner's ids, scored by creation (its count, its listing)
    <prefix>:ids                every id, scored by creation (the runner's scan, an admin's list)

A creation is one WATCH/MULTI transaction: the owner's set and its jobs' states are watched, the
room is checked in Python with the same ``check_room`` every backend uses, and the writes go in
one MULTI; when anything watched changed meanwhile (another creation, the runner's progress) the
check runs again. A save is ``SET ... XX`` (only while the job exists), a removal one MULTI.
Owner-scoped reads use the record stores' script: another owner's id stops where a missing one
does. No persistence of its own: configure the Redis server to keep its data.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

from ...settings import JobsConfig
from ..records import GET_OWNED_LUA
from ..redis_client import open_redis
from .model import JOB_ID_RE, LOCK_TIMEOUT_S, JobGone, JobLimits, StoredJob, check_room, owner_tag, usage_of
from .states import JobStates, parse_state


class RedisStates(JobStates):
    def __init__(self, cfg: JobsConfig):
        import redis

        assert cfg.redis_url is not None
        prefix = cfg.redis_prefix
        self._WatchError = redis.WatchError
        # Sync: the store's calls already run on worker threads (the runner's, the Ingress's to_thread).
        self._redis = open_redis(cfg.redis_url, cfg.redis_timeout_s, sync=True)
        self._prefix = prefix
        self._ids = f"{prefix}:ids"
        self._get_owned = self._redis.register_script(GET_OWNED_LUA)
        self.location = f"redis {prefix}"

    def _key(self, job_id: str) -> str:
        assert JOB_ID_RE.fullmatch(job_id), job_id  # ids are generated and checked, never user text
        return f"{self._prefix}:job:{job_id}"

    def _own(self, owner: str) -> str:
        return f"{self._prefix}:own:{owner_tag(owner)}"

    def _parse(self, docs: list) -> list[StoredJob]:
        jobs = (parse_state(d, "redis") for d in docs if d is not None)
        return [j for j in jobs if j is not None]

    def create(self, job: StoredJob, limits: JobLimits, stage: Callable[[], None], unstage: Callable[[], None]) -> None:
        own, key = self._own(job.owner), self._key(job.id)
        score = time.time_ns() // 1000  # microseconds: listings keep creation order within a second
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        staged = False
        try:
            with self._redis.pipeline() as pipe:
                while True:
                    try:
                        pipe.watch(own)
                        keys = [
                            self._key(i.decode()) for i in pipe.zrange(own, 0, -1) if JOB_ID_RE.fullmatch(i.decode())
                        ]
                        if keys:
                            pipe.watch(*keys)  # their progress changes the bytes they hold
                        docs = pipe.mget(keys) if keys else []
                        check_room(usage_of(self._parse(docs)), limits, job.reserved_bytes)
                        if not staged:
                            stage()
                            staged = True
                        pipe.multi()
                        pipe.set(key, job.to_json(), nx=True)
                        pipe.zadd(own, {job.id: score})
                        pipe.zadd(self._ids, {job.id: score})
                        pipe.execute()
                        return
                    except self._WatchError:
                        if time.monotonic() >= deadline:
                            raise TimeoutError(f"job creation for {owner_tag(job.owner)} kept colliding") from None
        except BaseException:
            if staged:
                unstage()
            raise

    def get(self, job_id: str, owner: str, admin: bool) -> Optional[StoredJob]:
        if not JOB_ID_RE.fullmatch(job_id):
            return None
        doc = self._get_owned(keys=[self._own(owner), self._key(job_id)], args=[job_id])
        if doc is None and admin:
            doc = self._redis.get(self._key(job_id))
        job = parse_state(doc, job_id) if doc else None
        return job if job is not None and job.id == job_id and (admin or job.owner == owner) else None

    def jobs(self, owner: Optional[str]) -> list[StoredJob]:
        ids = [i.decode() for i in self._redis.zrange(self._ids if owner is None else self._own(owner), 0, -1)]
        keys = [self._key(i) for i in ids if JOB_ID_RE.fullmatch(i)]
        jobs = self._parse(self._redis.mget(keys)) if keys else []
        return [j for j in jobs if owner is None or j.owner == owner]

    def save(self, job: StoredJob) -> None:
        if not self._redis.set(self._key(job.id), job.to_json(), xx=True):
            raise JobGone(job.id)

    def remove(self, job: StoredJob) -> bool:
        with self._redis.pipeline(transaction=True) as pipe:
            deleted, _, _ = (
                pipe.delete(self._key(job.id)).zrem(self._own(job.owner), job.id).zrem(self._ids, job.id).execute()
            )
        return bool(deleted)
