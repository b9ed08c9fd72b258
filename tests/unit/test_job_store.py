"""The job store without Ray, on every backend: chunks and their seeds, atomic writes, owners,
quotas (also under concurrent submissions from several store instances, as Ingress replicas),
deletion while the runner writes, the TTL sweep, what a runner taking a job up again finds (the
runner's own resume state and the final file it encodes), and the ranged reads HTTP serves a
file with.

Backends are real: a directory, fsspec's ``memory://`` and ``file://``, S3 (moto's server, a
subprocess: ``support/moto_s3.py``), and Redis for the state (``redis-server``, as the voice
store's tests) over a directory or ``memory://``.
"""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from serve_app.engine.audio import to_int16
from serve_app.engine.errors import JobQuotaExceeded, TooManyJobs
from serve_app.engine.planner import segment_seed
from serve_app.engine.wav import HEADER_BYTES, is_wav
from serve_app.http import ranged
from serve_app.jobs.audio import write_audio
from serve_app.jobs.cutting import (
    chapter_first_chunks,
    chunk_seed,
    cut_script,
    cut_text,
    estimated_pcm_bytes,
    heading_title,
    split_chapters,
)
from serve_app.jobs.runner import parallel_chunks
from serve_app.jobs.running import RunningJob
from serve_app.jobs.views import file_response
from serve_app.settings import JobsConfig
from serve_app.storage.jobs import (
    JobGone,
    JobLimits,
    JobPart,
    JobStore,
    Place,
    StoredJob,
    audio_file_name,
    captions_file_name,
    make_job_store,
    new_job_id,
    owner_tag,
)
from serve_app.storage.jobs.directory import DirectoryFiles, write_atomic
from serve_app.storage.jobs.object_files import ObjectFiles
from serve_app.storage.jobs.object_lock import ObjectLock
from serve_app.storage.jobs.redis_states import RedisStates
from serve_app.storage.jobs.states import FileStates

ROOMY = JobLimits(max_active=100, max_jobs=100, max_bytes=10**12)
VOICE = {"name": "alloy", "seed": 2222, "spk_emb": None, "spk_smp": None, "txt_smp": None}
BACKENDS = ["directory", "memory", "file", "s3", "redis+directory", "redis+memory"]


def make_job(owner: str = "alice", n: int = 3, fmt: str = "pcm", reserved: int = 0, **extra) -> StoredJob:
    now = time.time()
    return StoredJob(
        id=new_job_id(),
        owner=owner,
        voice_name="alloy",
        voice=VOICE,
        options={"seed": 7},
        response_format=fmt,
        created_at=now,
        updated_at=now,
        chunks_total=n,
        chunk_samples=[-1] * n,
        chars_total=10 * n,
        reserved_bytes=reserved,
        **extra,
    )


def chunks_of(n: int, pause: float = 0.0):
    return cut_text("\n\n".join(f"第{i}段。" for i in range(n)), 7, 600, pause)


@pytest.fixture(params=BACKENDS)
def settings(request, tmp_path: Path) -> JobsConfig:
    """Settings of one backend; every store made from them shares its jobs (replicas, a runner)."""
    state, _, files = request.param.rpartition("+")
    extra = {"redis_url": request.getfixturevalue("redis_server").url} if state == "redis" else {}
    if files == "directory":
        return JobsConfig(backend="directory", path=str(tmp_path / "jobs"), **extra)
    if files == "file":
        return JobsConfig(backend="fsspec", url=(tmp_path / "jobs").as_uri(), **extra)
    if files == "memory":
        url = f"memory://jobs-{uuid.uuid4().hex}"
        request.addfinalizer(lambda: _forget_memory(url))
        return JobsConfig(backend="fsspec", url=url, **extra)
    s3 = request.getfixturevalue("moto_s3")
    return JobsConfig(
        backend="fsspec", url=f"s3://{s3.new_bucket()}/jobs", storage_options=s3.storage_options(), **extra
    )


def _forget_memory(url: str) -> None:
    import fsspec

    fs, root = fsspec.core.url_to_fs(url)
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture
def store(settings: JobsConfig) -> JobStore:
    return make_job_store(settings)


def files_of(store: JobStore, job: StoredJob) -> set[str]:
    """Every file the job's place holds, temporaries included, by name within the place."""
    place = Place.of(job)
    files = store.files
    if isinstance(files, DirectoryFiles):
        folder = files.root / place.key()
        return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}
    assert isinstance(files, ObjectFiles)
    objects = files.objects
    prefix = objects._path(place.key())
    return {p[len(prefix) + 1 :] for p in objects.fs.find(prefix)}


def state_on_files(store: JobStore) -> set[str]:
    return {"job.json"} if isinstance(store.states, FileStates) else set()


def read_all(store: JobStore, job: StoredJob, name: str) -> bytes:
    stat = store.stat(job, name)
    assert stat is not None, name
    return store.read_range(job, name, 0, stat.size)


# ------------------------------------------------------------------ chunks


def test_text_is_cut_at_paragraphs_then_whole_sentences_with_fixed_seeds():
    para1 = "第一句话。第二句话！第三句话？" * 10  # 150 characters of short sentences
    para2 = "Short one. Another sentence here."
    chunks = cut_text(f"{para1}\n\n  \n{para2}\n\n****\n", 100, 60, 0.5)
    texts = [c.text for c in chunks]
    assert all(len(t) <= 60 for t in texts), texts
    assert "".join(texts[:-1]) == para1  # whole sentences, nothing lost or reordered
    assert all(t.endswith(("。", "！", "？")) for t in texts[:-1])
    assert texts[-1] == para2  # a paragraph never joins the one before; '****' speaks nothing
    assert [c.pause_after for c in chunks] == [0.0] * (len(chunks) - 2) + [0.5, 0.0]
    assert [c.seed for c in chunks] == [chunk_seed(100, k) for k in range(len(chunks))]
    assert chunks[0].seed == 100  # a one-chunk job decodes as a request with its seed would


def test_a_sentence_longer_than_a_chunk_is_cut_at_clauses_then_hard():
    long = "，".join(["这是一个很长的分句"] * 20) + "。"  # 199 characters, one sentence
    texts = [c.text for c in cut_text(long, 1, 50, 0.0)]
    assert "".join(texts) == long and all(len(t) <= 50 for t in texts)
    assert all(t.endswith(("，", "。")) for t in texts)
    blob = "a" * 130  # no clause mark, no space
    assert [len(c.text) for c in cut_text(blob, 1, 50, 0.0)] == [50, 50, 30]


def test_chunk_seeds_never_meet_the_segment_seeds_of_a_neighbour():
    seed = 12345
    seen = {}
    for k in range(50):
        for i in range(200):  # a chunk of 600 characters makes far fewer segments
            s = segment_seed(chunk_seed(seed, k), i)
            assert seen.setdefault(s, (k, i)) == (k, i), (s, seen[s], (k, i))


def test_estimate_follows_speed():
    chunks = chunks_of(4, pause=0.5)
    assert estimated_pcm_bytes(chunks, 2.0) < estimated_pcm_bytes(chunks, 1.0) < estimated_pcm_bytes(chunks, 0.5)


def test_a_script_is_packed_into_chunks_that_keep_its_parts_and_pauses():
    long = "这是一个很长的句子，" * 30 + "结束。"  # 301 characters, no sentence end before the last
    parts = [
        JobPart(text="Hello there.", voice=0, speaker="alloy", turn=0, offset=0),
        JobPart(text="你好。", voice=1, speaker="echo", turn=1, offset=0, pause_before=0.4),
        JobPart(text="", voice=0, pause_before=1.0),  # an SSML break at the end of a turn
        JobPart(text=long, voice=0, speaker="alloy", turn=2, offset=0, pause_before=0.4, speed=1.5),
        JobPart(text="Bye.", voice=1, speaker="echo", turn=3, offset=0, pause_before=0.4),
    ]
    chunks = cut_script(parts, 7, 120)
    assert [c.seed for c in chunks] == [chunk_seed(7, k) for k in range(len(chunks))]
    assert all(len(c.text) <= 120 and c.text == "".join(p.text for p in c.parts) for c in chunks)
    assert all(c.pause_after == 0.0 for c in chunks)  # the script's pauses are in its parts
    flat = [p for c in chunks for p in c.parts]
    # Nothing lost or reordered: the long turn's pieces join to it, each where it is in the turn.
    assert "".join(p.text for p in flat) == "".join(p.text for p in parts)
    pieces = [p for p in flat if p.turn == 2]
    assert len(pieces) == 3 and "".join(p.text for p in pieces) == long
    assert [p.offset for p in pieces] == [0, len(pieces[0].text), len(pieces[0].text) + len(pieces[1].text)]
    assert [p.pause_before for p in pieces] == [0.4, 0.0, 0.0] and {p.speed for p in pieces} == {1.5}
    # The short turns and the break share the first chunk; the break stays where it was.
    assert [(p.text, p.pause_before, p.speaker) for p in chunks[0].parts] == [
        ("Hello there.", 0.0, "alloy"),
        ("你好。", 0.4, "echo"),
        ("", 1.0, None),
    ]
    assert sum(p.pause_before for p in flat) == pytest.approx(2.2)
    assert estimated_pcm_bytes(chunks, 1.0) > estimated_pcm_bytes(
        cut_script([p.model_copy(update={"pause_before": 0.0}) for p in parts], 7, 120), 1.0
    )


def test_a_job_request_is_one_of_text_ssml_or_turns():
    from serve_app.protocol import JobRequest

    assert not JobRequest(input="plain text").is_ssml
    assert JobRequest(input="<speak>Hi</speak>").is_ssml and JobRequest(input="Hi", input_format="ssml").is_ssml
    turns = JobRequest(turns=[{"voice": "alloy", "input": "Hi"}, {"voice": "echo", "input": "<speak>Yo</speak>"}])
    assert not turns.is_ssml and turns.script_chars == 2 + 17
    for bad in [
        {"input": "Hi", "turns": [{"input": "Yo"}]},
        {"input": "  "},
        {},
        {"turns": []},
        {"input": "<speak>Hi</speak>", "chapters": True},
        {"turns": [{"input": "Yo"}], "chapters": True},
        {"input": "a\x00b"},
    ]:
        with pytest.raises(ValidationError):
            JobRequest(**bad)


# ------------------------------------------------------------------ settings


def test_settings_pick_the_backend_and_refuse_bad_combinations(tmp_path: Path):
    assert isinstance(make_job_store(JobsConfig(path=str(tmp_path / "d"))).files, DirectoryFiles)
    url = f"memory://jobs-{uuid.uuid4().hex}"
    try:
        store = make_job_store(JobsConfig(backend="fsspec", url=url))
        assert isinstance(store.files, ObjectFiles) and isinstance(store.states, FileStates)
    finally:
        _forget_memory(url)
    bad = [
        {"backend": "fsspec"},  # no url
        {"backend": "fsspec", "url": "/just/a/path"},
        {"backend": "fsspec", "url": "nosuchfs://x"},
        {"backend": "fsspec", "url": "memory://x", "path": "/tmp/x"},
        {"backend": "directory", "url": "s3://bucket/jobs"},
        {"backend": "directory", "storage_options": {"key": "k"}},
        {"redis_url": "http://localhost:6379"},
        {"redis_prefix": "has space"},
    ]
    for fields in bad:
        with pytest.raises(ValidationError):
            JobsConfig(**fields)


# ------------------------------------------------------------------ atomic writes


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    path = tmp_path / "job.json"
    write_atomic(path, [b"old"])

    def pieces():
        yield b"new, half"
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_atomic(path, pieces())
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["job.json"]


def test_an_interrupted_file_leaves_the_old_one_whole_on_every_backend(store: JobStore):
    job = store.create(make_job(), chunks_of(1), ROOMY)
    store.put_audio(job, [b"old ", b"file"])

    def pieces():
        yield b"new, half"
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        store.put_audio(job, pieces())
    assert read_all(store, job, audio_file_name(job)) == b"old file"
    assert files_of(store, job) == {"chunks.json", "audio.pcm"} | state_on_files(store)  # no temporary
    other = store.create(make_job(), chunks_of(1), ROOMY)
    with pytest.raises(RuntimeError):
        store.put_audio(other, pieces())
    assert store.stat(other, audio_file_name(other)) is None


def test_a_job_appears_whole_and_writes_after_its_delete_fail(store: JobStore):
    job = store.create(make_job(), chunks_of(3), ROOMY)
    assert files_of(store, job) == {"chunks.json"} | state_on_files(store)
    assert job.bytes == job.input_bytes == len(store.files.get(Place.of(job), "chunks.json"))
    assert store.get(job.id, "alice") == job
    store.put_chunk(job, 0, b"\x01\x00" * 10)
    assert store.delete(job.id, "alice") is not None
    assert store.delete(job.id, "alice") is None  # once
    assert files_of(store, job) == set()
    with pytest.raises(JobGone):
        store.save(job)  # the runner's next write: nothing is re-created
    with pytest.raises(JobGone):
        store.put_chunk(job, 1, b"\x00\x00")
    with pytest.raises(JobGone):
        store.put_audio(job, [b"x"])
    assert files_of(store, job) == set() and store.get(job.id, "alice") is None
    assert store.list("alice") == [] and store.active_jobs() == []
    if isinstance(store.files, DirectoryFiles):
        assert not list(store.files.trash.iterdir())


def test_a_write_racing_the_delete_fails_and_leaves_nothing(settings: JobsConfig):
    """The runner writes while the Ingress (another store instance) deletes the job: the write
    that was under way when the delete came fails with JobGone, and nothing is left of it."""
    runner, ingress = make_job_store(settings), make_job_store(settings)
    job = ingress.create(make_job(), chunks_of(3), ROOMY)

    def deleted_midway():
        yield b"\x01\x00" * 100
        assert ingress.delete(job.id, "alice") is not None
        yield b"\x02\x00" * 100

    with pytest.raises(JobGone):
        runner.put_audio(job, deleted_midway())
    assert files_of(runner, job) == set()
    if isinstance(runner.states, FileStates):  # the state's own write: the same path as a save
        with pytest.raises(JobGone):
            runner.files.put(Place.of(job), "job.json", iter([job.to_json().encode()]))
    with pytest.raises(JobGone):
        runner.save(job)
    assert files_of(runner, job) == set() and ingress.get(job.id, "alice") is None


def test_delete_while_the_runner_writes_leaves_nothing(settings: JobsConfig):
    runner, ingress = make_job_store(settings), make_job_store(settings)
    job = ingress.create(make_job(n=1000), chunks_of(3), ROOMY)
    job.status = "running"
    written = threading.Event()
    outcome: list[BaseException] = []

    def run() -> None:
        try:
            for k in range(1000):
                runner.put_chunk(job, k, b"\x01\x00" * 50)
                job.chunk_samples[k] = 50
                runner.save(job)
                written.set()
        except BaseException as exc:  # noqa: BLE001 - what the runner got
            outcome.append(exc)

    writer = threading.Thread(target=run)
    writer.start()
    assert written.wait(30)
    assert ingress.delete(job.id, "alice") is not None
    writer.join(30)
    assert len(outcome) == 1 and isinstance(outcome[0], JobGone), outcome
    assert files_of(ingress, job) == set()
    assert ingress.get(job.id, "alice") is None and ingress.active_jobs() == []


# ------------------------------------------------------------------ owners


def test_another_owners_job_reads_as_a_missing_one_and_an_admin_sees_all(store: JobStore):
    mine = store.create(make_job("alice"), chunks_of(1), ROOMY)
    theirs = store.create(make_job("bob"), chunks_of(1), ROOMY)
    assert store.get(mine.id, "alice").id == mine.id
    assert store.get(mine.id, "bob") is None and store.get("job_" + "0" * 24, "bob") is None
    assert store.get("../../etc", "bob") is None  # not an id: never a path
    assert [j.id for j in store.list("alice")] == [mine.id]
    assert {j.id for j in store.list("root", admin=True)} == {mine.id, theirs.id}
    assert store.get(theirs.id, "root", admin=True).owner == "bob"
    assert store.delete(mine.id, "bob") is None and store.get(mine.id, "alice") is not None
    assert store.delete(mine.id, "root", admin=True).id == mine.id
    assert store.get(mine.id, "alice") is None
    # Owners are hashed: a key id never becomes a path or a key.
    assert set(store.files.owners()) == {owner_tag("alice"), owner_tag("bob")}
    with pytest.raises(ValueError):
        Place("../alice", mine.id)


# ------------------------------------------------------------------ quotas


def test_active_jobs_count_and_bytes_per_owner(store: JobStore):
    limits = JobLimits(max_active=2, max_jobs=3, max_bytes=1000)
    a = store.create(make_job(reserved=300), chunks_of(1), limits)
    store.create(make_job(reserved=300), chunks_of(1), limits)
    with pytest.raises(TooManyJobs):
        store.create(make_job(reserved=1), chunks_of(1), limits)
    store.create(make_job("bob", reserved=300), chunks_of(1), limits)  # another owner's own room
    a.status, a.bytes = "succeeded", 500  # done: its files count, not its estimate
    store.save(a)
    with pytest.raises(JobQuotaExceeded, match="bytes"):
        store.create(make_job(reserved=250), chunks_of(1), limits)  # 500 + 300 + 250 > 1000
    store.create(make_job(reserved=100), chunks_of(1), limits)
    assert store.usage("alice").jobs == 3
    with pytest.raises(TooManyJobs):
        store.create(make_job(reserved=1), chunks_of(1), limits)
    assert len(store.list("alice")) == 3  # a refused job left nothing
    assert sum(len(store.files.places(t)) for t in store.files.owners()) == 4


def test_concurrent_submissions_cannot_pass_the_quota_together(settings: JobsConfig):
    limits = JobLimits(max_active=3, max_jobs=100, max_bytes=10**12)
    stores = [make_job_store(settings) for _ in range(4)]  # as Ingress replicas
    start = threading.Barrier(8)

    def submit(i: int) -> bool:
        start.wait()
        try:
            stores[i % 4].create(make_job("alice"), chunks_of(1), limits)
            return True
        except TooManyJobs:
            return False

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(submit, range(8)))
    assert results.count(True) == 3, results
    assert stores[0].usage("alice").active == 3
    assert len(stores[1].files.places(owner_tag("alice"))) == 3  # the refused ones left no files


# ------------------------------------------------------------------ the object store's lock


@pytest.mark.parametrize("settings", ["memory", "s3"], indirect=True)
def test_the_object_lock_admits_one_holder_at_a_time_and_outlives_a_dead_one(settings: JobsConfig):
    objects = make_job_store(settings).files.objects
    inside, most, entries = [0], [0], []
    guard = threading.Lock()

    def hold(i: int) -> None:
        with ObjectLock(objects, "lock-test", timeout_s=30, poll_s=0.01):
            with guard:
                inside[0] += 1
                most[0] = max(most[0], inside[0])
            time.sleep(0.01)
            with guard:
                inside[0] -= 1
                entries.append(i)

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(hold, range(8)))
    assert most[0] == 1 and sorted(entries) == list(range(8))
    dead = ObjectLock(objects, "lock-test", ttl_s=0.2)
    dead.acquire()  # and never released: its holder died
    with pytest.raises(TimeoutError):
        ObjectLock(objects, "lock-test", timeout_s=0.05, poll_s=0.01).acquire()
    time.sleep(0.25)
    with ObjectLock(objects, "lock-test", timeout_s=5, poll_s=0.01):  # its time is up: taken over
        dead.release()  # too late: it must not free the lock its successor holds
        with pytest.raises(TimeoutError):
            ObjectLock(objects, "lock-test", timeout_s=0.05, poll_s=0.01).acquire()
    assert len(objects.ls("lock-test")) <= 4  # old tickets are collected


# ------------------------------------------------------------------ expiry


def test_expired_jobs_vanish_at_once_and_the_sweep_deletes_them(store: JobStore):
    old = store.create(make_job(), chunks_of(1), ROOMY)
    old.status, old.finished_at, old.expires_at = "succeeded", time.time() - 10, time.time() - 1
    store.save(old)
    kept = store.create(make_job(), chunks_of(1), ROOMY)
    kept.status, kept.expires_at = "succeeded", time.time() + 3 * 3600
    store.put_chunk(kept, 0, b"\x00\x00")  # finished before its chunks were removed
    store.save(kept)
    running = store.create(make_job(), chunks_of(1), ROOMY)
    store.put_chunk(running, 0, b"\x00\x00")
    orphan = Place(owner_tag("alice"), new_job_id())
    store.files.make_place(orphan, b"[]")  # a creation that died before its state
    stale = None
    if isinstance(store.files, DirectoryFiles):
        stale = store.files.root / owner_tag("alice") / ".tmp-job_half"  # an older version's half-made job
        stale.mkdir()
    assert store.get(old.id, "alice") is None and old.id not in [j.id for j in store.list("alice")]
    assert store.usage("alice").jobs == 2  # an expired job holds no quota
    assert store.sweep() == 1  # the orphan is young: it may be a creation in progress
    assert orphan in store.files.places(owner_tag("alice"))
    assert store.sweep(now=time.time() + 2 * 3600 - 10) == 0
    assert set(store.files.places(owner_tag("alice"))) == {Place.of(kept), Place.of(running)}
    assert stale is None or not stale.exists()
    assert files_of(store, kept) == {"chunks.json"} | state_on_files(store)
    assert store.files.listing(Place.of(running), "chunks") == {"0.pcm": 2}
    assert store.sweep(now=time.time() + 4 * 3600) == 1  # kept's turn
    assert [j.id for j in store.active_jobs()] == [running.id]


# ------------------------------------------------------------------ resume


def test_a_restarted_runner_takes_a_job_up_from_its_stored_chunks(settings: JobsConfig):
    first = make_job_store(settings)
    chunks = chunks_of(4)
    job = first.create(make_job(n=4), chunks, ROOMY)
    job.status = "running"
    first.put_chunk(job, 0, b"\x01\x00" * 100)
    first.put_chunk(job, 2, b"\x02\x00" * 50)  # chunks run in parallel: not a prefix
    job.chunk_samples[0] = 100  # the runner died before it recorded chunk 2
    first.save(job)
    half = None
    if isinstance(first.files, DirectoryFiles):
        half = first.files.root / Place.of(job).key("chunks") / ".tmp-abc"
        half.write_bytes(b"\x03" * 7)  # a chunk being written when it died

    again = make_job_store(settings)  # the restarted runner's
    [found] = again.active_jobs()
    taken = RunningJob(found, again.script(found), again.done_chunks(found))
    assert taken.pending == [1, 3]
    assert found.chunk_samples == [100, -1, 50, -1] and found.chunks_done == 2
    assert found.chars_done == len(chunks[0].text) + len(chunks[2].text)
    assert found.bytes == found.input_bytes + 300
    assert half is None or not half.exists()
    assert [c.seed for c in again.chunks(found)] == [c.seed for c in chunks]
    assert again.read_chunk(found, 2) == b"\x02\x00" * 50
    found.status = "succeeded"
    again.save(found)
    assert again.active_jobs() == [] and again.get(job.id, "alice").status == "succeeded"


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac"])
def test_the_final_file_is_the_chunks_in_order_with_their_pauses(store: JobStore, fmt: str):
    chunks = chunks_of(3, pause=0.25)
    job = store.create(make_job(n=3, fmt=fmt), chunks, ROOMY)
    rng = np.random.default_rng(0)
    pcm = [rng.integers(-20000, 20000, size=n, dtype=np.int16) for n in (1000, 0, 777)]
    for k, p in enumerate(pcm):
        store.put_chunk(job, k, p.tobytes())
        job.chunk_samples[k] = len(p)
    size = write_audio(store, job, chunks)
    store.remove_chunks(job)
    assert files_of(store, job) == {"chunks.json", f"audio.{fmt}"} | state_on_files(store)
    data = read_all(store, job, audio_file_name(job))
    assert size == len(data) == store.stat(job, audio_file_name(job)).size
    pause = np.zeros(6000, dtype=np.int16)  # 0.25 s after each paragraph's chunk, none after the last
    expected = np.concatenate([pcm[0], pause, pcm[1], pause, pcm[2]])
    if fmt == "flac":
        from support.audio import decode_av

        decoded, rate = decode_av(data, fmt)
        assert rate == 24000 and np.array_equal(to_int16(decoded), expected)  # lossless: sample for sample
        return
    if fmt == "wav":
        assert is_wav(data) and int.from_bytes(data[40:44], "little") == 2 * len(expected)
        assert int.from_bytes(data[4:8], "little") == len(data) - 8
        data = data[HEADER_BYTES:]
    assert np.array_equal(np.frombuffer(data, dtype="<i2"), expected)


BOOK = (
    "A few words before it all begins.\n\n# Chapter One\n从前有一座山。\n\n山里有一座庙。\n"
    "***\n第二章 庙里\n庙里有个老和尚。\n\n\n\nHe told a story.\nEpilogue\nThe end."
)


def test_headings_are_the_lines_that_name_a_chapter_and_nothing_else():
    for line, title in [
        ("# Notes", "Notes"),
        ("## 2. Back home", "2. Back home"),
        ("第一章 山", "第一章 山"),
        ("第十二回", "第十二回"),
        ("序言", "序言"),
        ("Chapter 2: The River", "Chapter 2: The River"),
        ("CHAPTER XII. THE END", "CHAPTER XII. THE END"),
        ("Part One", "Part One"),
        ("Chapter 3 The Storm", "Chapter 3 The Storm"),
        ("Epilogue", "Epilogue"),
    ]:
        assert heading_title(line) == title, line
    for line in [
        "Part of the problem is this.",
        "Chapter one ended badly.",
        "Introduction to physics is hard.",
        "第二部分是这样的。",
        "序言部分很长，我们慢慢读吧。",
        "Book mild",
        "#hashtag",
        "第一次见面",
        "Chapter 1 " + "x" * 100,
    ]:
        assert heading_title(line) is None, line


def test_a_book_is_cut_into_chapters_at_headings_and_scene_breaks():
    chapters = split_chapters(BOOK)
    assert [t for t, _ in chapters] == [None, "Chapter One", "第二章 庙里", None, "Epilogue"]
    chunks = cut_text(BOOK, 7, 600, 0.5, chapters, chapter_pause_s=2.0)
    assert [c.chapter for c in chunks] == [0, 1, 1, 1, 2, 2, 3, 4, 4]
    assert [c.text for c in chunks][1:3] == ["Chapter One", "从前有一座山。"]  # the heading spoken, without '#'
    # A paragraph's last chunk 0.5 s, a chapter's 2 s, the book's last none.
    assert [c.pause_after for c in chunks] == [2.0, 0.5, 0.5, 2.0, 0.5, 2.0, 2.0, 0.5, 0.0]
    assert chapter_first_chunks(chunks) == [0, 1, 4, 6, 7]
    # Without chapters: one chapter, paragraph pauses only (a heading stays in its paragraph).
    plain = cut_text(BOOK, 7, 600, 0.5)
    assert {c.chapter for c in plain} == {0} and set(c.pause_after for c in plain) == {0.5, 0.0}
    assert split_chapters("no heading at all.\n\nTwo paragraphs.") == [(None, "no heading at all.\n\nTwo paragraphs.")]


def chaptered_book(store: JobStore, **extra) -> tuple[list, StoredJob]:
    """BOOK as a job made with chapters: its chunks and the stored job."""
    chapters = split_chapters(BOOK)
    chunks = cut_text(BOOK, 7, 600, 0.5, chapters, chapter_pause_s=2.0)
    job = store.create(
        make_job(
            n=len(chunks),
            chapter_titles=[t for t, _ in chapters],
            chapter_first_chunks=chapter_first_chunks(chunks),
            **extra,
        ),
        chunks,
        ROOMY,
    )
    return chunks, job


@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_each_chapter_has_its_file_and_its_place_in_the_whole_one(store: JobStore, fmt: str):
    chunks, job = chaptered_book(store, fmt=fmt)
    rng = np.random.default_rng(1)
    pcm = [rng.integers(-20000, 20000, size=int(rng.integers(0, 3000)), dtype=np.int16) for _ in chunks]
    for k, p in enumerate(pcm):
        store.put_chunk(job, k, p.tobytes())
        job.chunk_samples[k] = len(p)
    size = write_audio(store, job, chunks)

    def samples(name: str) -> np.ndarray:
        data = read_all(store, job, name)
        return np.frombuffer(data[HEADER_BYTES:] if fmt == "wav" else data, dtype="<i2")

    whole = samples(audio_file_name(job))
    assert size == sum(len(read_all(store, job, audio_file_name(job, n))) for n in [None, *range(5)])
    pause = lambda s: np.zeros(int(round(s * 24000)), dtype=np.int16)  # noqa: E731
    joined = []
    for n, (first, end) in enumerate(job.chapter_spans()):
        own = samples(audio_file_name(job, n))
        inside = [
            x for k in range(first, end) for x in (pcm[k], pause(chunks[k].pause_after) if k < end - 1 else pause(0))
        ]
        assert np.array_equal(own, np.concatenate(inside))  # its chunks and pauses, no trailing pause
        start, duration = job.chapter_times[n]
        assert round(start * 24000) == sum(len(x) for x in joined) and round(duration * 24000) == len(own)
        assert np.array_equal(whole[round(start * 24000) : round(start * 24000) + len(own)], own)
        joined += [own, pause(chunks[end - 1].pause_after)]
    assert np.array_equal(whole, np.concatenate(joined))


@pytest.mark.parametrize("fmt", ["srt", "vtt"])
def test_captions_follow_each_chunk_to_its_place_in_the_whole_file_and_its_chapters(store: JobStore, fmt: str):
    import io

    import srt
    import webvtt

    chunks, job = chaptered_book(store, captions=fmt)
    rng = np.random.default_rng(2)
    lengths = [int(rng.integers(2400, 9600)) for _ in chunks]
    for k, (chunk, n) in enumerate(zip(chunks, lengths)):
        # One segment per chunk, 0.05 s of lead-in and tail inside the chunk's PCM.
        store.put_chunk(job, k, b"\x01\x00" * n, [[1200, n - 1200, chunk.text]])
        job.chunk_samples[k] = n
    assert set(files_of(store, job)) >= {f"chunks/{k}.json" for k in range(len(chunks))}
    write_audio(store, job, chunks)

    def cues(name: str) -> list[tuple[int, int, str]]:
        text = read_all(store, job, name).decode()
        if fmt == "srt":
            return [
                (round(c.start.total_seconds() * 1000), round(c.end.total_seconds() * 1000), c.content)
                for c in srt.parse(text)
            ]
        ms = lambda t: round(sum(float(x) * f for x, f in zip(t.split(":"), (3600_000, 60_000, 1000))))  # noqa: E731
        return [(ms(c.start), ms(c.end), c.text) for c in webvtt.from_buffer(io.StringIO(text))]

    def expected(first: int, end: int) -> list[tuple[int, int, str]]:
        out, at = [], 0
        for k in range(first, end):
            out.append(
                (round((at + 1200) * 1000 / 24000), round((at + lengths[k] - 1200) * 1000 / 24000), chunks[k].text)
            )
            at += lengths[k] + int(round(chunks[k].pause_after * 24000))
        return out

    assert cues(captions_file_name(job)) == expected(0, len(chunks))
    for n, (first, end) in enumerate(job.chapter_spans()):  # each chapter's on its own file's timeline
        assert cues(captions_file_name(job, n)) == expected(first, end)


def test_chunks_at_once_follow_the_acoustic_replicas_up_to_the_cap():
    cfg = JobsConfig(chunks_per_acoustic_replica=3, max_parallel_chunks=10)
    assert [parallel_chunks(cfg, n) for n in (0, 1, 2, 3, 4, 50)] == [3, 3, 6, 9, 10, 10]
    assert parallel_chunks(JobsConfig(), 1) == 2


# ------------------------------------------------------------------ what HTTP serves


def test_the_audio_is_served_with_ranges_from_every_backend(store: JobStore, monkeypatch):
    job = store.create(make_job(fmt="wav"), chunks_of(1), ROOMY)
    body = bytes(range(256)) * 40  # 10240 bytes
    store.put_audio(job, [body])
    name = audio_file_name(job)
    monkeypatch.setattr(ranged, "PIECE_BYTES", 1000)  # so a read takes several ranged reads
    reads: list[int] = []
    read_range = store.read_range

    def counted(j, n, start, length):
        reads.append(length)
        return read_range(j, n, start, length)

    monkeypatch.setattr(store, "read_range", counted)

    async def audio(request):
        return await file_response(store, job, name, "audio/wav", f"{job.id}.wav")

    local = store.local_path(job, name) is not None  # then Starlette's FileResponse
    assert local == (isinstance(store.files, DirectoryFiles) or store.files.location.startswith("file:"))
    with TestClient(Starlette(routes=[Route("/a", audio, methods=["GET", "HEAD"])])) as http:
        whole = http.get("/a")
        assert whole.status_code == 200 and whole.content == body
        assert whole.headers["accept-ranges"] == "bytes" and whole.headers["content-length"] == str(len(body))
        assert whole.headers["content-type"] == "audio/wav"
        assert whole.headers["content-disposition"] == f'inline; filename="{job.id}.wav"'
        etag, modified = whole.headers["etag"], whole.headers["last-modified"]
        part = http.get("/a", headers={"Range": "bytes=1500-4499"})
        assert part.status_code == 206 and part.content == body[1500:4500]
        assert part.headers["content-range"] == f"bytes 1500-4499/{len(body)}"
        assert part.headers["content-length"] == "3000"
        assert http.get("/a", headers={"Range": "bytes=10000-"}).content == body[10000:]
        assert http.get("/a", headers={"Range": "bytes=-5"}).content == body[-5:]
        assert http.get("/a", headers={"Range": "bytes=10000-99999"}).content == body[10000:]
        past = http.get("/a", headers={"Range": f"bytes={len(body)}-"})
        assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(body)}"
        assert http.get("/a", headers={"Range": "bytes=9-3"}).status_code == 400
        assert http.get("/a", headers={"Range": "lines=1-2"}).status_code == 400
        for validator in (etag, modified):
            kept = http.get("/a", headers={"Range": "bytes=0-9", "If-Range": validator})
            assert kept.status_code == 206 and kept.content == body[:10]
        changed = http.get("/a", headers={"Range": "bytes=0-9", "If-Range": '"another"'})
        assert changed.status_code == 200 and changed.content == body
        head = http.head("/a", headers={"Range": "bytes=100-199"})
        assert head.status_code == 206 and head.headers["content-length"] == "100" and head.content == b""
        head = http.head("/a")
        assert head.status_code == 200 and head.headers["content-length"] == str(len(body))
    if not local:
        assert reads and max(reads) <= 1000  # streamed piece by piece, never the whole file


def test_a_missing_file_is_a_404(store: JobStore):
    from serve_app.errors import APIError

    job = store.create(make_job(), chunks_of(1), ROOMY)

    async def audio(request):
        try:
            return await file_response(store, job, audio_file_name(job), "audio/pcm", "x.pcm")
        except APIError as exc:
            from starlette.responses import PlainTextResponse

            return PlainTextResponse(exc.message, status_code=exc.status)

    with TestClient(Starlette(routes=[Route("/a", audio)])) as http:
        assert http.get("/a").status_code == 404


@pytest.mark.parametrize("settings", ["redis+directory", "redis+memory"], indirect=True)
def test_redis_keeps_the_state_and_the_files_keep_the_rest(settings: JobsConfig):
    store = make_job_store(settings)
    assert isinstance(store.states, RedisStates)
    job = store.create(make_job(), chunks_of(2), ROOMY)
    assert files_of(store, job) == {"chunks.json"}  # the state is in Redis, not among the files
    import redis

    client = redis.Redis.from_url(settings.redis_url)
    assert client.zrange(f"chattts:jobs:own:{owner_tag('alice')}", 0, -1) == [job.id.encode()]
    assert StoredJob.model_validate_json(client.get(f"chattts:jobs:job:{job.id}")).id == job.id
    store.delete(job.id, "alice")
    assert client.zrange(f"chattts:jobs:own:{owner_tag('alice')}", 0, -1) == []
