"""Jobs when their store fails under them or their runner is killed, and nothing lost: the job
runner (``serve_app/jobs/runner.py``) driven in this process over the real speech pipeline
(``LocalPipeline``: the planner, the decode loop and the vocoder on random-tiny weights), the jobs
service making the jobs. No Ray. Every job's file is compared with the bytes of an uninterrupted
run of the same job.

- A full disk (a small tmpfs; root only, else skipped saying why) while a chunk's PCM is written,
  and while the final file is: the runner waits it out with the audio in hand (the job stays
  ``running``, its stored chunks whole, no half-written file listed or served, its audio 409
  until it has succeeded), and once there is room the job completes. A submission on the full
  disk is 507 ``insufficient_storage``, nothing stored.
- Redis (``jobs.redis_url``) killed and started again mid-job: the jobs API answers 503
  ``job_store_unavailable`` meanwhile (the documented degradation) and nothing else, every job it
  acknowledged is there after, and the running job completes.
- The runner killed between a chunk's PCM stored and the job's state saying so: the runner that
  takes the job up counts the chunk done from the store, and neither makes nor writes it again.

Chunks run one at a time (``chunks_per_acoustic_replica: 1``), so each is decoded alone in every
run. The store's writes are counted as they happen (``Writes``: the real store's calls, wrapped).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest
from support.asgi import job_submission
from support.disk import PAGE, Filler, small_disk
from support.redis_server import REDIS_SERVER, RedisServer

from bench.lib.procs import free_port
from serve_app.errors import APIError
from serve_app.http.security import Caller
from serve_app.jobs.runner import JobRunner
from serve_app.jobs.service import JobsService
from serve_app.settings import JobsConfig, VoiceStoreConfig
from serve_app.storage.jobs import Place, StoredJob
from serve_app.storage.voices import VoiceCatalog, make_voice_store

pytestmark = pytest.mark.timeout(300)

OWNER = "f1f1f1f1f1f1"
# Three paragraphs, four chunks of at most 12 characters: ~7 s of audio, ~330 kB of PCM.
BOOK = "山上有一座庙。庙里有个老和尚。\n\n老和尚讲故事。\n\n天黑了，睡觉了。"
BODY = {"input": BOOK, "voice": "nova", "seed": 4242, "response_format": "pcm"}
DISK = 8 * 1024 * 1024


def settings(root: Path, **changes: Any) -> JobsConfig:
    return JobsConfig(
        path=str(root),
        chunk_chars=12,
        paragraph_pause_s=0.3,
        max_bytes_per_key=2**40,
        chunks_per_acoustic_replica=1,  # one chunk decoding at a time: alone in every run
        rescan_s=0.2,
        retry_backoff_s=0.05,
        max_chunk_retries=2,
        **changes,
    )


class _Told:
    """The runner as the jobs service sees it when a job is made: told, nothing more (the
    runner under test finds the job at its next scan)."""

    class notify:  # noqa: N801 - a Ray actor method's shape
        @staticmethod
        def remote() -> None:
            return None


def service(cfg: JobsConfig) -> JobsService:
    return JobsService(
        cfg, None, None, VoiceCatalog(make_voice_store(VoiceStoreConfig(backend="memory"))), runner=_Told
    )


CALLER = Caller(id=OWNER, owner=OWNER, max_priority=0, max_streams=0, max_voices=None)


async def submit(svc: JobsService) -> str:
    answer = await svc.create(job_submission(json.dumps(BODY).encode()), CALLER)
    assert answer.status_code == 202, answer.body
    return json.loads(answer.body)["id"]


@pytest.fixture(scope="module")
def speech(tiny_model) -> Iterator[Any]:
    """The speech pipeline in this process, as the stages run it (the runner's ``pipeline``)."""
    from support.engine import fixed_chunks

    from serve_app.engine.acoustic import AcousticEngine
    from serve_app.engine.planner import Planner
    from serve_app.engine.threads import TorchThread
    from serve_app.engine.vocoder import VocoderEngine
    from serve_app.pipeline.local import LocalPipeline

    engine = AcousticEngine(tiny_model, fixed_chunks(max_rows=16))
    thread = TorchThread("vocoder", threads=1)
    engine.start()
    yield LocalPipeline(Planner(), engine, VocoderEngine(tiny_model), thread)
    engine.stop()
    thread.shutdown()


class Writes:
    """The store's writes as the runner makes them, counted (by call, and chunk for ``put_chunk``)
    as done or failed; the real store's calls, unchanged. ``after``: called in the writing thread
    once a write is done, with its key."""

    def __init__(self, store: Any, after: Any = None):
        self.done: Counter = Counter()
        self.failed: Counter = Counter()
        self._lock = threading.Lock()
        self._after = after
        for name in ("put_chunk", "save", "put_audio"):
            setattr(store, name, self._counted(name, getattr(store, name)))

    def _counted(self, name: str, call: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            key = (name, args[1]) if name == "put_chunk" else name
            try:
                result = call(*args, **kwargs)
            except Exception:
                with self._lock:
                    self.failed[key] += 1
                raise
            with self._lock:
                self.done[key] += 1
            if self._after is not None:
                self._after(key)
            return result

        return counted


class Running:
    """A job runner over ``cfg``'s store, speaking through ``speech``, its own loop scanning; its
    store's writes counted (``writes``)."""

    def __init__(self, cfg: JobsConfig, speech: Any, after_write: Any = None):
        self.runner = JobRunner(cfg, speech)
        self.writes = Writes(self.runner.store, after_write)

    def kill(self) -> None:
        """Stop the runner where it is, as a kill would: its loop and every task it runs cancelled
        at once, so that it writes nothing more."""
        self.runner._main.cancel()
        for task in list(self.runner._running):
            task.cancel()

    async def close(self) -> None:
        self.runner._main.cancel()
        tasks = [t for a in list(self.runner.jobs.values()) for t in self.runner._stop(a)]
        await asyncio.gather(self.runner._main, *tasks, *self.runner._running, return_exceptions=True)


async def until(test, what: str, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await asyncio.to_thread(test)
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def state(svc: JobsService, job_id: str) -> StoredJob:
    job = svc.store.get(job_id, OWNER)
    assert job is not None, job_id
    return job


async def finished(svc: JobsService, job_id: str, timeout_s: float = 90.0) -> StoredJob:
    job = await until(
        lambda: (j := svc.store.get(job_id, OWNER)) is not None and j.status not in ("queued", "running") and j,
        f"job {job_id} finished",
        timeout_s,
    )
    assert job.status == "succeeded", job.error
    return job


async def audio(svc: JobsService, job_id: str) -> bytes:
    job = state(svc, job_id)
    path = svc.store.local_path(job, f"audio.{job.response_format}")
    assert path is not None
    return path.read_bytes()


@pytest.fixture(scope="module")
def reference(speech, tmp_path_factory) -> dict:
    """BOOK spoken once with nothing failing: its file and each chunk's PCM size."""

    async def run() -> dict:
        cfg = settings(tmp_path_factory.mktemp("reference") / "jobs")
        svc = service(cfg)
        job_id = await submit(svc)
        running = Running(cfg, speech)
        try:
            job = await finished(svc, job_id)
        finally:
            await running.close()
        return {"audio": await audio(svc, job_id), "chunk_bytes": [2 * n for n in job.chunk_samples]}

    return asyncio.run(run())


def _files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def _temporaries(root: Path) -> list[str]:
    return [str(p.relative_to(root)) for p in _files(root) if p.name.startswith(".tmp-")]


def _pages(n: int) -> int:
    return -(-n // PAGE) * PAGE


async def _not_ready(svc: JobsService, job_id: str) -> None:
    """What a client gets of the job's audio before it has succeeded: 409, no bytes."""
    with pytest.raises(APIError) as refused:
        await svc.audio(job_id, CALLER)
    assert (refused.value.status, refused.value.code) == (409, "job_not_ready"), refused.value.message


# ------------------------------------------------------------------ a full disk


async def test_a_full_disk_mid_chunk_is_waited_out_and_the_job_completes_as_if_nothing_failed(
    tmp_path: Path, speech, reference
):
    """Room for the first chunk and half the second: the second's write fails half-way, again and
    again, until the disk has room. Before: the chunk was synthesised again for every failed write,
    then the job failed, and its failure could not be written either (job.json needs room too):
    the job stayed 'running' with a chunk no task would ever make, and never finished, room or not."""
    with small_disk(tmp_path / "disk", DISK) as disk:
        cfg = settings(disk / "jobs")
        svc = service(cfg)
        job_id = await submit(svc)
        first, second = reference["chunk_bytes"][:2]
        filler = Filler(disk)
        filler.fill(leave=_pages(first) + _pages(second) // 2 + 4 * PAGE)  # and job.json's rewrites
        running = Running(cfg, speech)
        try:
            place = disk / "jobs" / Place.of(state(svc, job_id)).key()
            await until(lambda: (place / "chunks" / "0.pcm").exists(), "chunk 0 stored")
            tries = cfg.max_chunk_retries + 2  # more than a chunk is ever made again
            await until(
                lambda: running.writes.failed["put_chunk", 1] >= tries or state(svc, job_id).status != "running",
                f"chunk 1's write failed {tries} times",
            )
            job = state(svc, job_id)
            assert job.status == "running" and job.chunks_done == 1, (job.status, job.chunks_done, job.error)
            stored = sorted(p.name for p in (place / "chunks").iterdir() if not p.name.startswith(".tmp-"))
            assert stored == ["0.pcm"] and (place / "chunks" / "0.pcm").stat().st_size == first
            await _not_ready(svc, job_id)
            filler.release()
            job = await finished(svc, job_id)
        finally:
            await running.close()
        assert await audio(svc, job_id) == reference["audio"]
        assert running.runner.chunks_done == len(reference["chunk_bytes"])  # each chunk made once
        assert running.writes.done["put_chunk", 1] == 1 and running.runner.store_waits >= tries
        assert not _temporaries(disk / "jobs") and not (place / "chunks").exists()


async def test_a_full_disk_at_the_final_file_keeps_the_chunks_and_finishes_once_there_is_room(
    tmp_path: Path, speech, reference
):
    """Room for every chunk, not for the final file (as large again). Before: the job failed
    'encode_failed' and its chunks were deleted: everything made was lost."""
    with small_disk(tmp_path / "disk", DISK) as disk:
        cfg = settings(disk / "jobs")
        svc = service(cfg)
        job_id = await submit(svc)
        chunks = reference["chunk_bytes"]
        filler = Filler(disk)
        filler.fill(leave=sum(_pages(n) for n in chunks) + len(reference["audio"]) // 2 + 4 * PAGE)
        running = Running(cfg, speech)
        try:
            place = disk / "jobs" / Place.of(state(svc, job_id)).key()
            await until(lambda: state(svc, job_id).chunks_done == len(chunks), "every chunk stored")
            await until(
                lambda: running.writes.failed["put_audio"] >= 3 or state(svc, job_id).status != "running",
                "the final file's write failed 3 times",
            )
            job = state(svc, job_id)
            assert job.status == "running" and job.error is None, (job.status, job.error)
            sizes = {p.name: p.stat().st_size for p in (place / "chunks").iterdir() if not p.name.startswith(".tmp-")}
            assert sizes == {f"{k}.pcm": n for k, n in enumerate(chunks)}, sizes  # every chunk kept, whole
            assert not (place / "audio.pcm").exists()
            await _not_ready(svc, job_id)
            filler.release()
            await finished(svc, job_id)
        finally:
            await running.close()
        assert await audio(svc, job_id) == reference["audio"]
        assert running.runner.chunks_done == len(chunks) and running.writes.done["put_audio"] == 1
        assert not _temporaries(disk / "jobs") and not (place / "chunks").exists()


async def test_a_submission_on_a_full_disk_is_507_and_stores_nothing(tmp_path: Path):
    """Before: 503 job_store_unavailable, as if a retry shortly could help."""
    with small_disk(tmp_path / "disk", 1024 * 1024) as disk:
        cfg = settings(disk / "jobs")
        svc = service(cfg)
        kept = await submit(svc)
        Filler(disk).fill(leave=0)
        with pytest.raises(APIError) as refused:
            await submit(svc)
        err = refused.value
        assert (err.status, err.code, err.type) == (507, "insufficient_storage", "server_error"), err.message
        assert [j.id for j in svc.store.list(OWNER)] == [kept]
        places = [p for p in (disk / "jobs").iterdir() if p.is_dir() and not p.name.startswith(".")]
        assert [sorted(q.name for q in owner.iterdir() if q.is_dir()) for owner in places] == [[kept]]
        assert not _temporaries(disk / "jobs")


# ------------------------------------------------------------------ Redis stopped and started again


@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server binary not found (apt-get install redis-server)")
async def test_redis_killed_and_restarted_mid_job_loses_nothing_and_the_job_completes(
    tmp_path: Path, speech, reference
):
    """The job state in Redis (persistent, as docs/operations.md asks): killed after the job's
    first chunk, started again once the runner's state writes have failed as many times as the job
    has chunks. Before: a failed state write ended its chunk's task and the next chunk ran on
    (its audio made with nowhere to say so); once the job's last chunk's write had failed, the job
    stayed 'running' for good, Redis back or not."""
    server = RedisServer(free_port(), tmp_path, persistent=True)
    server.start()
    try:
        cfg = settings(tmp_path / "jobs", redis_url=server.url, redis_timeout_s=0.5)
        svc = service(cfg)
        acknowledged = [await submit(svc), await submit(svc)]  # the second waits for the first
        running = Running(cfg, speech)
        try:
            await until(lambda: state(svc, acknowledged[0]).chunks_done >= 1, "the first chunk done")
            server.crash()
            t_down = time.monotonic()
            answers = []
            for call in (
                lambda: svc.get(acknowledged[0], CALLER),
                lambda: svc.list(CALLER),
                lambda: svc.audio(acknowledged[0], CALLER),
                lambda: svc.create(job_submission(json.dumps(BODY).encode()), CALLER),
            ):
                with pytest.raises(APIError) as refused:
                    await call()
                answers.append((refused.value.status, refused.value.code, refused.value.headers.get("Retry-After")))
            assert set(answers) == {(503, "job_store_unavailable", "2")}, answers
            failures = len(reference["chunk_bytes"])
            await until(lambda: running.writes.failed["save"] >= failures, "the runner's state writes failing")
            await asyncio.sleep(max(0.0, 2.0 - (time.monotonic() - t_down)))
            server.start()  # the same port and files
            jobs = [await finished(svc, job_id) for job_id in acknowledged]
        finally:
            await running.close()
        assert [j.id for j in sorted(svc.store.list(OWNER), key=lambda j: j.created_at)] == acknowledged
        for job in jobs:
            assert await audio(svc, job.id) == reference["audio"]
        assert running.runner.store_waits >= failures and running.runner.chunks_done == 2 * len(
            reference["chunk_bytes"]
        )
    finally:
        server.stop()


# ------------------------------------------------------------------ the runner killed


async def test_a_runner_killed_between_a_chunks_audio_and_its_state_neither_loses_nor_remakes_the_chunk(
    tmp_path: Path, speech, reference
):
    """Killed as chunk 1's PCM is stored whole, before job.json says so: the next runner finds
    the chunk in the store (``done_chunks``), makes the chunks after it only, and the job's file is
    the uninterrupted run's."""
    cfg = settings(tmp_path / "jobs")
    svc = service(cfg)
    job_id = await submit(svc)
    loop = asyncio.get_running_loop()
    first: Running

    def after(key: Any) -> None:  # in the writing thread, the write done: the kill comes first
        if key == ("put_chunk", 1):
            loop.call_soon_threadsafe(first.kill)

    first = Running(cfg, speech, after_write=after)
    try:
        await until(lambda: first.runner._main.done(), "the runner killed")
        await asyncio.gather(*first.runner._running, return_exceptions=True)
    finally:
        await first.close()
    place = tmp_path / "jobs" / Place.of(state(svc, job_id)).key()
    job = state(svc, job_id)
    assert (job.status, job.chunks_done) == ("running", 1), (job.status, job.chunk_samples)
    assert (place / "chunks" / "1.pcm").stat().st_size == reference["chunk_bytes"][1]  # stored whole
    assert first.writes.done["put_chunk", 1] == 1 and first.writes.done["put_chunk", 2] == 0

    second = Running(cfg, speech)
    try:
        job = await finished(svc, job_id)
    finally:
        await second.close()
    total = len(reference["chunk_bytes"])
    assert second.runner.resumed == {job_id: 2}  # chunk 1 counted done from the store
    assert second.runner.chunks_done == total - 2 and second.writes.done["put_chunk", 1] == 0
    assert [2 * n for n in job.chunk_samples] == reference["chunk_bytes"]
    assert await audio(svc, job_id) == reference["audio"]
