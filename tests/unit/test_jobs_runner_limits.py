"""The job runner's own bounds, without Ray: a job whose audio outgrows its reservation stops,
failed, as the audio comes (its reservation released); what a killed runner left (spool files in
the node's temporary directory, half-written files in a job's place) goes when a runner starts or
takes the job up; job ids are lower-case and checked whole.

The stages are stand-ins with the stages' call shapes: the TextNormalizer plans with the real
planner, the Vocoder streams PCM of a length the test picks.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from deployments.job_runner import JobRunner
from serve_app.engine.planner import Planner
from serve_app.jobs.cutting import cut_text
from serve_app.jobs.planning import reservation
from serve_app.jobs.running import RunningJob
from serve_app.settings import JobsConfig
from serve_app.storage.jobs import JOB_ID_RE, JobLimits, Place, StoredJob, make_job_store, new_job_id
from serve_app.storage.jobs.objects import SPOOL_BYTES, clean_spool, open_objects, spool_dir

ROOMY = JobLimits(max_active=100, max_jobs=100, max_bytes=10**12)
VOICE = {"name": "alloy", "seed": 2222, "spk_emb": None, "spk_smp": None, "txt_smp": None}


class _Normalizer:
    def __init__(self) -> None:
        self.planner = Planner()

        class plan:  # noqa: N801 - a handle method's shape
            @staticmethod
            async def remote(text, options, voice=None, client=""):
                return self.planner.plan(text, options, voice, client=client)

        self.plan = plan


class _Stream:
    """A Vocoder stream of ``total`` bytes in pieces; counts what was taken and whether it was cancelled."""

    def __init__(self, total: int):
        self.total = total
        self.sent = 0
        self.cancelled = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._items()

    async def _items(self) -> AsyncIterator[bytes]:
        while self.sent < self.total:
            piece = min(9600, self.total - self.sent)
            self.sent += piece
            yield b"\x01\x00" * (piece // 2)
            await asyncio.sleep(0)

    def cancel(self) -> None:
        self.cancelled = True


class _Vocoder:
    app_name = "none"

    def __init__(self, total: int):
        self.streams: list[_Stream] = []
        outer = self

        class stream:  # noqa: N801
            @staticmethod
            def remote(plan, fmt, _):
                outer.streams.append(_Stream(total))
                return outer.streams[-1]

        self.stream = stream

    def options(self, **_: Any) -> "_Vocoder":
        return self


def _runner(settings: JobsConfig, vocoder: _Vocoder) -> JobRunner:
    runner = JobRunner(settings.model_dump(), _Normalizer(), vocoder)
    runner._main.cancel()  # the test drives it: no scans, no Serve status
    return runner


async def _job(settings: JobsConfig, pcm_limit: int, chapters: bool = False) -> tuple[Any, StoredJob]:
    store = make_job_store(settings)
    chunks = cut_text("山上有一座庙。庙里有个老和尚。", 7, 600, 0.0)
    now = time.time()
    limit, reserved = (pcm_limit, pcm_limit * (2 if chapters else 1))
    job = StoredJob(
        id=new_job_id(),
        owner="alice",
        voice_name="alloy",
        options={"seed": 7},
        response_format="pcm",
        created_at=now,
        updated_at=now,
        chunks_total=len(chunks),
        chunk_samples=[-1] * len(chunks),
        chars_total=10,
        reserved_bytes=reserved,
        pcm_limit_bytes=limit,
    )
    store.create(job, chunks, ROOMY, VOICE)
    return store, job


@pytest.fixture
def settings(tmp_path: Path) -> JobsConfig:
    return JobsConfig(path=str(tmp_path / "jobs"), retry_backoff_s=0.01)


async def test_a_job_that_outgrows_its_reservation_stops_failed_as_the_audio_comes(settings: JobsConfig):
    limit = 48_000  # one second of PCM
    store, job = await _job(settings, limit)
    vocoder = _Vocoder(total=10 * limit)  # the stage makes ten times what was reserved
    runner = _runner(settings, vocoder)
    active = RunningJob(job, store.script(job), {})
    runner.jobs[job.id] = active
    await runner._chunk(active, 0)
    stored = store.get(job.id, "alice")
    assert stored.status == "failed" and stored.error["code"] == "reservation_exceeded", stored.error
    assert "reservation" in stored.error["message"]
    # Stopped as it came: the stream was cancelled a piece past the limit, nothing stored.
    [stream] = vocoder.streams
    assert stream.cancelled and stream.sent <= limit + 9600
    assert store.done_chunks(stored) == {}
    assert not stored.active and stored.held_bytes == stored.input_bytes  # its reservation released
    assert job.id not in runner.jobs


async def test_a_job_within_its_reservation_stores_its_chunk(settings: JobsConfig):
    store, job = await _job(settings, 48_000)
    vocoder = _Vocoder(total=40_000)
    runner = _runner(settings, vocoder)
    active = RunningJob(job, store.script(job), {})
    runner.jobs[job.id] = active
    await runner._chunk(active, 0)
    stored = store.get(job.id, "alice")
    assert stored.status == "succeeded" and stored.error is None
    assert store.stat(stored, "audio.pcm").size == 40_000


def test_the_reservation_has_its_headroom_and_a_copy_per_chapter():
    assert reservation(10.0, False, 0.0) == (480_000, 480_000)
    assert reservation(10.0, False, 0.5) == (720_000, 720_000)
    assert reservation(10.0, True, 0.5) == (720_000, 1_440_000)


# ------------------------------------------------------------------ what a killed runner left


def test_spool_files_of_processes_that_are_gone_are_removed(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    folder = spool_dir()
    folder.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (folder / f"{dead.pid}-abc").write_bytes(b"x" * 100)  # a runner killed mid-upload
    (folder / f"{os.getpid()}-def").write_bytes(b"y")  # ours, uploading now
    (folder / "notes").write_bytes(b"z")  # not a spool file
    assert clean_spool() == 1
    assert sorted(p.name for p in folder.iterdir()) == sorted([f"{os.getpid()}-def", "notes"])


def test_a_large_put_spools_to_a_file_named_by_its_process(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    objects = open_objects(f"memory://spool-{os.getpid()}-{time.time_ns()}", {})
    seen: list[str] = []

    def pieces():
        yield b"\0" * (SPOOL_BYTES + 1)
        seen.extend(p.name for p in spool_dir().iterdir())  # while the upload is under way
        yield b"\1"

    assert objects.put("big", pieces()) == SPOOL_BYTES + 2
    assert len(seen) == 1 and seen[0].startswith(f"{os.getpid()}-")
    assert list(spool_dir().iterdir()) == []  # gone once uploaded
    objects.delete("big")


@pytest.mark.parametrize("backend", ["directory", "file"])
async def test_a_killed_runs_half_written_files_go_when_the_job_is_taken_up(tmp_path: Path, backend: str):
    settings = (
        JobsConfig(path=str(tmp_path / "jobs"))
        if backend == "directory"
        else JobsConfig(backend="fsspec", url=(tmp_path / "jobs").as_uri())
    )
    store, job = await _job(settings, 48_000)
    folder = tmp_path / "jobs" / Place.of(job).key()
    (folder / "chapters").mkdir()
    left = [folder / ".tmp-audio", folder / "chapters" / ".tmp-0"]  # a final file and a chapter's, half written
    for path in left:
        path.write_bytes(b"\0" * 1000)
    runner = _runner(settings, _Vocoder(0))
    script, done = runner._take_up(job)
    assert done == {} and len(script.chunks) == job.chunks_total
    assert not any(p.exists() for p in left)
    assert (folder / "chunks.json").exists()


# ------------------------------------------------------------------ ids


def test_job_ids_are_lower_case_and_checked_whole(settings: JobsConfig):
    ids = {new_job_id() for _ in range(200)}
    assert all(JOB_ID_RE.fullmatch(i) and i == i.lower() for i in ids)
    store = make_job_store(settings)
    job = StoredJob(
        id=new_job_id(),
        owner="alice",
        voice_name="alloy",
        options={},
        response_format="pcm",
        created_at=time.time(),
        updated_at=time.time(),
        chunks_total=1,
        chunk_samples=[-1],
        chars_total=1,
    )
    store.create(job, cut_text("你好。", 1, 600, 0.0), ROOMY, VOICE)
    assert store.get(job.id, "alice") is not None
    # Another case, or a trailing newline (which ``$`` let through): no job, and never a path.
    for other in (job.id.upper(), "job_" + job.id[4:].upper(), job.id + "\n", job.id + "\r", " " + job.id):
        assert not JOB_ID_RE.fullmatch(other)
        assert store.get(other, "alice") is None and store.delete(other, "alice") is None
        with pytest.raises(ValueError):
            Place("0" * 24, other)
