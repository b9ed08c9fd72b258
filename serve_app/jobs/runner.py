"""The job runner's work (``JobRunner``): every queued and running job in the store spoken chunk by
chunk through a speech pipeline, each job's file encoded once all of its chunks are done. Plain
asyncio, no Ray: ``deployments/job_runner.py`` makes it the application's detached actor (its
pipeline the stages' handles, its Acoustic replicas counted from Serve's status); tests drive it
in their own process over ``LocalPipeline``.

Each chunk is one synthesis as the Ingress makes one: ``plan`` (the chunk's text, the job's
options, its seed, ``jobs.priority`` and the job's owner as the client: interactive requests are
admitted first, and the owner shares the engine fairly with everyone else; an SSML or dialogue
job's chunk is its script parts), then ``audio(plan, "pcm")``. ``jobs.chunks_per_acoustic_replica``
chunks run at once for every running Acoustic replica of the app (at most
``jobs.max_parallel_chunks``), over all jobs: a job spreads over the replicas, and a cluster with
more of them finishes it sooner. Chunks are taken owner by owner (the owner with the fewest
running first), each job's in order.

Nothing made is lost. A chunk's PCM is stored whole (``put_chunk``: temporary file + rename), then
``job.json`` is rewritten, so after a kill anywhere a chunk is either stored whole (found by
``done_chunks`` when the job is taken up again, and never made again) or made again from its start
with the same text, options and seed. A store that fails for a while (a full disk, Redis stopped or
restarting: ``passing_fault``) is waited out with the audio in hand, the same write made again, and
no chunk starts meanwhile; the final file likewise, the chunks kept until the job says it
succeeded. A chunk that fails (a replica died, a stage failed) is tried again after a backoff, at
most ``jobs.max_chunk_retries`` times, then the job fails with the reason; a refusal of the
request itself (413, 400) fails it at once. Cancelling a job (DELETE) cancels its running chunks'
streams: the Vocoder cancels its Acoustic stream and the engine drops the rows at its next step.

Nothing here imports torch or PyAV but the final encoding.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Optional, TypeVar

from ..engine.audio import SAMPLE_RATE
from ..engine.types import SegmentMark
from ..errors import to_api_error
from ..pipeline.interface import SpeechPipeline
from ..settings import JobsConfig
from ..storage.faults import passing_fault
from ..storage.jobs import JobGone, StoredJob, make_job_store, store_identity, store_location
from ..storage.jobs.model import JobScript
from ..storage.jobs.objects import clean_spool
from .audio import SAMPLE_BYTES, write_audio
from .running import ReservationExceeded, RunningJob

__all__ = ["MAX_BACKOFF_S", "JobRunner", "parallel_chunks"]

log = logging.getLogger("ray.serve")

MAX_BACKOFF_S = 10.0
T = TypeVar("T")


def _reason(exc: BaseException) -> str:
    known = to_api_error(exc)
    if known is not None:
        return known.message
    cause = getattr(exc, "cause", None) or exc
    return f"{cause.__class__.__name__}: {str(cause).splitlines()[0][:200] if str(cause) else ''}".rstrip(": ")


class JobRunner:
    """Every job of the store spoken through ``pipeline``. Async: every method runs on one event
    loop, file work in threads."""

    def __init__(self, settings: JobsConfig, pipeline: SpeechPipeline):
        self.settings = settings
        self.store = make_job_store(settings)
        self.pipeline = pipeline
        self.jobs: dict[str, RunningJob] = {}
        self._running: set[asyncio.Task] = set()
        self._wake = asyncio.Event()
        self._rescan_now = True
        self._last_scan = 0.0
        self._last_sweep = 0.0
        self.acoustic_replicas = 1  # running Acoustic replicas of the app, at the last scan
        self.chunks_done = 0  # this process's, for tests and the bench
        self.chunks_retried = 0
        self.store_waits = 0  # store calls tried again after a passing fault (a full disk, Redis down)
        self._waiting = 0  # store calls waiting out a fault now: no chunk starts meanwhile
        self.resumed: dict[str, int] = {}  # job id -> chunks it had stored when this process took it up
        self.started_at = time.time()
        self._main = asyncio.get_event_loop().create_task(self._run())

    # ------------------------------------------------------------------ calls from the Ingress

    def reconfigure(self, new: JobsConfig) -> None:
        """New settings (a new app version's): a job store of another identity replaces the old one,
        whose jobs stay there."""
        if store_identity(new) != store_identity(self.settings):
            log.warning("jobs: store changed; jobs in the old one stay there")
            for active in list(self.jobs.values()):
                self._stop(active)
            self.store = make_job_store(new)
            self._rescan_now = True
        self.settings = new
        self._wake.set()

    async def notify(self) -> None:
        """A job was made: look now rather than at the next scan."""
        self._rescan_now = True
        self._wake.set()

    async def cancel(self, job_id: str, keep: bool = False) -> bool:
        """Stop the job's running chunks (their streams are cancelled: the engine drops the rows
        at its next step) and forget it. Without ``keep`` its files are the caller's to delete
        (DELETE); with ``keep`` it stays, ``cancelled``, its chunks dropped (POST .../cancel):
        written here, the only writer of a job after it is made. False when it was not active."""
        job = await self._stop_and_wait(job_id)
        if not keep:
            return job is not None
        if job is None:  # not taken up yet (or by a runner that is gone): from the store
            job = await asyncio.to_thread(self.store.get, job_id, "", True)
            await self._stop_and_wait(job_id)  # a scan may have taken it up meanwhile
            if job is None or not job.active:
                return False
        now = time.time()
        job.status = "cancelled"
        job.finished_at = now
        job.expires_at = now + self.settings.ttl_s
        job.updated_at = now
        try:
            await asyncio.to_thread(self.store.save, job)
            await asyncio.to_thread(self.store.remove_chunks, job)
        except JobGone:
            return False
        log.info("jobs: %s cancelled at %d of %d chunks", job.id, job.chunks_done, job.chunks_total)
        return True

    async def _stop_and_wait(self, job_id: str) -> Optional[StoredJob]:
        """Stop the job if this runner holds it (its tasks ended); its state then, else None."""
        active = self.jobs.get(job_id)
        if active is None:
            return None
        tasks = self._stop(active)
        if tasks:
            await asyncio.wait(tasks, timeout=5.0)
        return active.job

    async def info(self) -> dict[str, Any]:
        return {
            "root": store_location(self.settings),
            "settings": self.settings.model_dump(),
            "acoustic_replicas": self.acoustic_replicas,
            "parallel_chunks": self.parallel_chunks,
            "running_chunks": len(self._running),
            "chunks_done": self.chunks_done,
            "chunks_retried": self.chunks_retried,
            "store_waits": self.store_waits,
            "started_at": self.started_at,
            "resumed": dict(self.resumed),
            "jobs": {i: {"pending": len(a.pending), "running": sorted(a.tasks)} for i, a in self.jobs.items()},
        }

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        while True:
            try:
                now = time.time()
                if now - self._last_sweep >= self.settings.sweep_interval_s:
                    self._last_sweep = now
                    swept = await asyncio.to_thread(self.store.sweep)
                    if swept:
                        log.info("jobs: %d expired jobs deleted", swept)
                    # The first round (at the start): what a killed runner was uploading from this node.
                    spooled = await asyncio.to_thread(clean_spool)
                    if spooled:
                        log.info("jobs: %d spool files of stopped processes removed", spooled)
                if self._rescan_now or now - self._last_scan >= self.settings.rescan_s:
                    self._rescan_now = False
                    self._last_scan = now
                    await self._scan()
                self._fill()
            except Exception:  # noqa: BLE001 - a store hiccup: the next round tries again
                log.exception("jobs: runner loop")
            try:
                await asyncio.wait_for(self._wake.wait(), self.settings.rescan_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()

    @property
    def parallel_chunks(self) -> int:
        return parallel_chunks(self.settings, self.acoustic_replicas)

    def _count_replicas(self) -> Optional[int]:
        """Running Acoustic replicas of the app now (the actor asks Serve); None when it cannot be
        told, and the last count stays."""
        return None

    async def _scan(self) -> None:
        """Take up every queued or running job of the store not held yet (all of them after a
        restart: each from its chunks stored whole); let go of held ones deleted meanwhile."""
        replicas = await asyncio.to_thread(self._count_replicas)
        if replicas is not None:
            self.acoustic_replicas = max(1, replicas)
        stored = await asyncio.to_thread(self.store.active_jobs)
        ids = {j.id for j in stored}
        for job in stored:
            if job.id in self.jobs:
                continue
            try:
                script, done = await asyncio.to_thread(self._take_up, job)
            except JobGone:
                continue
            active = RunningJob(job, script, done)
            self.jobs[job.id] = active
            if done:
                self.resumed[job.id] = len(done)
                log.info("jobs: %s resumed at %d of %d chunks", job.id, len(done), len(active.chunks))
            if active.complete:
                self._spawn(self._finish(active))
        for job_id, active in list(self.jobs.items()):
            if job_id not in ids and not active.finishing:
                self._stop(active)  # deleted without a cancel reaching us (we were down, or it was lost)

    def _take_up(self, job: StoredJob) -> tuple[JobScript, dict[int, int]]:
        """What a job's run starts from: its script and chunks stored whole; what a killed run was
        writing into its place (a final file's temporaries) goes first."""
        self.store.clean_temporaries(job)
        return self.store.script(job), self.store.done_chunks(job)

    def _spawn(self, coro: Any) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self._running.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self._running.discard(task)
        self._wake.set()

    def _fill(self) -> None:
        """Start chunks while fewer than ``parallel_chunks`` run: the owner with the fewest
        running chunks first, then the job with the fewest, then the oldest; its next chunk."""
        if self._waiting:
            return  # the store is failing: new audio would only wait in memory for it
        while sum(len(a.tasks) for a in self.jobs.values()) < self.parallel_chunks:
            ready = [a for a in self.jobs.values() if a.pending and not a.stopped]
            if not ready:
                return
            owners = Counter({a.job.owner: 0 for a in ready})
            for a in self.jobs.values():
                owners[a.job.owner] += len(a.tasks)
            active = min(ready, key=lambda a: (owners[a.job.owner], len(a.tasks), a.job.created_at))
            k = active.pending.pop(0)
            active.tasks[k] = self._spawn(self._chunk(active, k))

    def _stop(self, active: RunningJob) -> list[asyncio.Task]:
        active.stopped = True
        self.jobs.pop(active.job.id, None)
        tasks = list(active.tasks.values())
        for task in tasks:
            task.cancel()
        return tasks

    # ------------------------------------------------------------------ one chunk

    async def _chunk(self, active: RunningJob, k: int) -> None:
        job = active.job
        try:
            if job.status == "queued":
                job.status = "running"
                job.started_at = job.started_at or time.time()
                await self._save(active)
            tries = 0
            while True:
                try:
                    pcm, timing = await asyncio.wait_for(self._synthesise(active, k), self.settings.chunk_timeout_s)
                    # Stored whole before the state says so; a store that fails for a while is
                    # waited out with this audio in hand (``_durable``), never made again.
                    await self._durable(
                        active,
                        f"chunk {k}",
                        lambda: asyncio.to_thread(
                            self.store.put_chunk,
                            job,
                            k,
                            pcm,  # noqa: B023 - awaited in this iteration
                            timing if job.captions else None,  # noqa: B023
                        ),
                    )
                    break
                except (asyncio.CancelledError, JobGone):
                    raise
                except ReservationExceeded as exc:
                    await self._fail(active, "reservation_exceeded", str(exc))
                    return
                except Exception as exc:  # noqa: BLE001 - sorted below: the request's fault, or a stage's
                    known = to_api_error(exc)
                    if known is not None and known.status < 500 and known.status != 429:
                        await self._fail(active, known.code or "chunk_failed", f"chunk {k}: {known.message}")
                        return
                    busy = known is not None and known.code == "overloaded"  # a full queue: wait for room
                    tries += 0 if busy else 1
                    if tries > self.settings.max_chunk_retries:
                        await self._fail(
                            active, "chunk_failed", f"chunk {k} failed {tries} times; the last time: {_reason(exc)}"
                        )
                        return
                    job.retries += 1
                    self.chunks_retried += 1
                    delay = min(MAX_BACKOFF_S, self.settings.retry_backoff_s * 2 ** max(0, tries - 1))
                    log.warning("jobs: %s chunk %d failed (%s); again in %.1f s", job.id, k, _reason(exc), delay)
                    await asyncio.sleep(delay)
            samples = len(pcm) // SAMPLE_BYTES
            active.streaming.pop(k, None)
            job.chunk_samples[k] = samples
            job.chars_done += len(active.chunks[k].text)
            job.bytes += SAMPLE_BYTES * samples
            self.chunks_done += 1
            await self._save(active)
        except JobGone:
            self._stop(active)  # deleted: nothing of it is to be written
            return
        except Exception:  # noqa: BLE001 - the store failed in a way no wait mends: start it over
            log.exception("jobs: %s chunk %d: the store failed; the job is taken up again at the next scan", job.id, k)
            self._stop(active)  # the next scan resumes it from its chunks stored whole
            return
        finally:
            active.tasks.pop(k, None)
            active.streaming.pop(k, None)
        if active.complete and not active.finishing and not active.stopped:
            await self._finish(active)

    async def _synthesise(self, active: RunningJob, k: int) -> tuple[bytes, list[list]]:
        """Plan and speak chunk ``k`` as one request: its PCM and where its segments lie in it."""
        job, chunk = active.job, active.chunks[k]
        options = active.options.model_copy(update={"seed": chunk.seed, "priority": self.settings.priority})
        script = active.script_parts(chunk) if chunk.parts is not None else chunk.text
        try:
            plan = await self.pipeline.plan(script, options, active.voice, client=job.owner)
        except Exception as exc:  # noqa: BLE001
            known = to_api_error(exc)
            if known is None or known.code != "empty_input":
                raise
            plan = None  # nothing the normaliser can say (symbols only): an empty chunk
        parts: list[bytes] = []
        size = 0
        timing: list[list] = []  # [start, end, text] per segment, samples in this chunk's PCM
        active.streaming[k] = 0
        if plan is not None:
            # Cancelled, timed out or failed: the stream stops the stages' work too.
            async with self.pipeline.audio(plan, "pcm") as stream:
                async for item in stream:
                    if isinstance(item, bytes):
                        size += len(item)
                        active.check_room(k, size)  # as it comes: a runaway chunk is never held whole
                        parts.append(item)
                    elif isinstance(item, SegmentMark):
                        timing.append([item.start, item.end, plan.source_of(item.index), plan.speaker_of(item.index)])
        return b"".join(parts), timing

    async def _durable(self, active: RunningJob, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """``attempt()`` (a store call) until it is done: a fault that passes (no room on the disk,
        Redis stopped or restarting, a network store's I/O error: ``passing_fault``) is waited out
        and the same call made again, backing off up to ``MAX_BACKOFF_S``; no chunk starts
        meanwhile. ``JobGone`` once the job is deleted or stopped; any other failure is raised."""
        delay = self.settings.retry_backoff_s
        since: Optional[float] = None
        try:
            while True:
                if active.stopped:
                    raise JobGone(active.job.id)
                try:
                    result = await attempt()
                except JobGone:
                    raise
                except Exception as exc:
                    if not passing_fault(exc):
                        raise
                    if since is None:
                        since = time.monotonic()
                        self._waiting += 1
                        log.warning(
                            "jobs: %s: %s could not be stored (%s); trying again until the store takes it",
                            active.job.id,
                            what,
                            _reason(exc),
                        )
                    self.store_waits += 1
                    await asyncio.sleep(delay)
                    delay = min(MAX_BACKOFF_S, delay * 2)
                    continue
                if since is not None:
                    log.warning("jobs: %s: %s stored after %.1f s", active.job.id, what, time.monotonic() - since)
                return result
        finally:
            if since is not None:
                self._waiting -= 1
                self._wake.set()  # chunks may start again

    async def _save(self, active: RunningJob) -> None:
        async with active.save_lock:  # one write at a time, the newest state last

            def attempt() -> Awaitable[None]:
                active.job.updated_at = time.time()
                return asyncio.to_thread(self.store.save, active.job.model_copy(deep=True))

            await self._durable(active, "its state", attempt)

    # ------------------------------------------------------------------ the end of a job

    async def _finish(self, active: RunningJob) -> None:
        """Every chunk is stored: encode the file once, mark the job succeeded, drop its chunks.
        A store that fails for a while is waited out (the file written again whole); the chunks
        stay until the job says it succeeded."""
        active.finishing = True
        job = active.job
        try:
            size = await self._durable(
                active, "its file", lambda: asyncio.to_thread(write_audio, self.store, job, active.chunks)
            )
        except JobGone:
            self.jobs.pop(job.id, None)
            return
        except Exception as exc:  # noqa: BLE001
            log.exception("jobs: %s could not be encoded", job.id)
            await self._fail(active, "encode_failed", f"the audio could not be encoded: {_reason(exc)}")
            return
        now = time.time()
        job.status = "succeeded"
        job.finished_at = now
        job.expires_at = now + self.settings.ttl_s
        job.bytes = job.input_bytes + size
        try:
            await self._save(active)
        except JobGone:
            self.jobs.pop(job.id, None)
            return
        await self._drop_chunks(job)
        log.info(
            "jobs: %s succeeded: %d chunks, %.1f s of audio",
            job.id,
            len(active.chunks),
            job.audio_samples / SAMPLE_RATE,
        )
        self.jobs.pop(job.id, None)

    async def _drop_chunks(self, job: StoredJob) -> None:
        """A finished job's chunks, gone; left to the sweep when the store fails now."""
        try:
            await asyncio.to_thread(self.store.remove_chunks, job)
        except Exception as exc:  # noqa: BLE001 - the sweep removes a finished job's chunks
            log.warning("jobs: %s: its chunks stay until the next sweep (%s)", job.id, _reason(exc))

    async def _fail(self, active: RunningJob, code: str, message: str) -> None:
        job = active.job
        log.warning("jobs: %s failed: %s", job.id, message)
        for task in list(active.tasks.values()):
            if task is not asyncio.current_task():
                task.cancel()
        now = time.time()
        job.status = "failed"
        job.error = {"code": code, "message": message}
        job.finished_at = now
        job.expires_at = now + self.settings.ttl_s
        try:
            await self._save(active)
            await self._drop_chunks(job)
            job.bytes = job.input_bytes
        except JobGone:
            pass
        active.stopped = True
        self.jobs.pop(job.id, None)


def parallel_chunks(settings: JobsConfig, acoustic_replicas: int) -> int:
    """Chunks the runner keeps going at once for this many running Acoustic replicas."""
    return max(1, min(settings.max_parallel_chunks, settings.chunks_per_acoustic_replica * max(1, acoustic_replicas)))
