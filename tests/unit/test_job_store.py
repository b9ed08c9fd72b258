"""The job store without Ray: chunks and their seeds, atomic writes, owners, quotas (also under
concurrent submissions), the TTL sweep, and what a runner taking a job up again finds (the
runner's own resume state and the final file it encodes)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from serve_app.engine.audio import to_int16
from serve_app.engine.errors import JobQuotaExceeded, TooManyJobs
from serve_app.engine.planner import segment_seed
from serve_app.engine.wav import HEADER_BYTES, is_wav
from serve_app.serving.jobs import _encoded, _Job
from serve_app.storage.jobs import (
    DirectoryJobStore,
    JobGone,
    JobLimits,
    StoredJob,
    chunk_seed,
    cut_text,
    estimated_pcm_bytes,
    new_job_id,
    owner_tag,
)
from serve_app.storage.jobs.directory import write_atomic

ROOMY = JobLimits(max_active=100, max_jobs=100, max_bytes=10**12)
VOICE = {"name": "alloy", "seed": 2222, "spk_emb": None, "spk_smp": None, "txt_smp": None}


def make_job(owner: str = "alice", n: int = 3, fmt: str = "pcm", reserved: int = 0, **extra) -> StoredJob:
    now = time.time()
    return StoredJob(id=new_job_id(), owner=owner, voice_name="alloy", voice=VOICE, options={"seed": 7},
                     response_format=fmt, created_at=now, updated_at=now, chunks_total=n, chunk_samples=[-1] * n,
                     chars_total=10 * n, reserved_bytes=reserved, **extra)


def chunks_of(n: int, pause: float = 0.0):
    return cut_text("\n\n".join(f"第{i}段。" for i in range(n)), 7, 600, pause)


@pytest.fixture
def store(tmp_path: Path) -> DirectoryJobStore:
    return DirectoryJobStore(tmp_path / "jobs")


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


def test_a_job_appears_whole_and_writes_after_its_delete_fail(store: DirectoryJobStore):
    job = store.create(make_job(), chunks_of(3), ROOMY)
    folder = store.root / owner_tag("alice") / job.id
    assert sorted(p.name for p in folder.iterdir()) == ["chunks", "chunks.json", "job.json"]
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(".tmp-")]
    assert job.bytes == job.input_bytes == (folder / "chunks.json").stat().st_size
    store.put_chunk(job, 0, b"\x01\x00" * 10)
    assert store.delete(job.id, "alice") is not None
    assert not folder.exists() and not list(store.trash.iterdir())
    with pytest.raises(JobGone):
        store.save(job)  # the runner's next write: nothing is re-created
    with pytest.raises(JobGone):
        store.put_chunk(job, 1, b"\x00\x00")
    assert not folder.exists()


# ------------------------------------------------------------------ owners


def test_another_owners_job_reads_as_a_missing_one_and_an_admin_sees_all(store: DirectoryJobStore):
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
    # Owners are hashed: a key id never becomes a path.
    assert {p.name for p in store.root.iterdir()} == {".trash", owner_tag("alice"), owner_tag("bob")}


# ------------------------------------------------------------------ quotas


def test_active_jobs_count_and_bytes_per_owner(store: DirectoryJobStore):
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


def test_concurrent_submissions_cannot_pass_the_quota_together(tmp_path: Path):
    limits = JobLimits(max_active=3, max_jobs=100, max_bytes=10**12)
    stores = [DirectoryJobStore(tmp_path / "jobs") for _ in range(4)]  # as replicas on one host
    start = threading.Barrier(12)

    def submit(i: int) -> bool:
        start.wait()
        try:
            stores[i % 4].create(make_job("alice"), chunks_of(1), limits)
            return True
        except TooManyJobs:
            return False

    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(submit, range(12)))
    assert results.count(True) == 3, results
    assert stores[0].usage("alice").active == 3


# ------------------------------------------------------------------ expiry


def test_expired_jobs_vanish_at_once_and_the_sweep_deletes_them(store: DirectoryJobStore):
    old = store.create(make_job(), chunks_of(1), ROOMY)
    old.status, old.finished_at, old.expires_at = "succeeded", time.time() - 10, time.time() - 1
    store.save(old)
    kept = store.create(make_job(), chunks_of(1), ROOMY)
    kept.status, kept.expires_at = "succeeded", time.time() + 3 * 3600
    store.put_chunk(kept, 0, b"\x00\x00")  # finished before its chunks were removed
    store.save(kept)
    running = store.create(make_job(), chunks_of(1), ROOMY)
    stale = store.root / owner_tag("alice") / ".tmp-job_half"
    stale.mkdir()
    assert store.get(old.id, "alice") is None and old.id not in [j.id for j in store.list("alice")]
    assert store.usage("alice").jobs == 2  # an expired job holds no quota
    assert store.sweep(now=time.time() + 2 * 3600 - 10) == 1
    owner_dir = store.root / owner_tag("alice")
    assert sorted(p.name for p in owner_dir.iterdir() if not p.name.startswith(".")) == sorted([kept.id, running.id])
    assert not stale.exists()
    assert not (owner_dir / kept.id / "chunks").exists()
    assert (owner_dir / running.id / "chunks").exists()
    assert store.sweep(now=time.time() + 4 * 3600) == 1  # kept's turn
    assert [j.id for j in store.active_jobs()] == [running.id]


# ------------------------------------------------------------------ resume


def test_a_restarted_runner_takes_a_job_up_from_its_stored_chunks(tmp_path: Path):
    first = DirectoryJobStore(tmp_path / "jobs")
    chunks = chunks_of(4)
    job = first.create(make_job(n=4), chunks, ROOMY)
    job.status = "running"
    first.put_chunk(job, 0, b"\x01\x00" * 100)
    first.put_chunk(job, 2, b"\x02\x00" * 50)  # chunks run in parallel: not a prefix
    job.chunk_samples[0] = 100  # the runner died before it recorded chunk 2
    first.save(job)
    half = first.root / owner_tag("alice") / job.id / "chunks" / ".tmp-abc"
    half.write_bytes(b"\x03" * 7)  # a chunk being written when it died

    again = DirectoryJobStore(tmp_path / "jobs")  # the restarted runner's
    [found] = again.active_jobs()
    taken = _Job(found, again.chunks(found), again.done_chunks(found))
    assert taken.pending == [1, 3]
    assert found.chunk_samples == [100, -1, 50, -1] and found.chunks_done == 2
    assert found.chars_done == len(chunks[0].text) + len(chunks[2].text)
    assert found.bytes == found.input_bytes + 300
    assert not half.exists()
    assert [c.seed for c in again.chunks(found)] == [c.seed for c in chunks]


@pytest.mark.parametrize("fmt", ["pcm", "wav", "flac"])
def test_the_final_file_is_the_chunks_in_order_with_their_pauses(tmp_path: Path, fmt: str):
    store = DirectoryJobStore(tmp_path / "jobs")
    chunks = chunks_of(3, pause=0.25)
    job = store.create(make_job(n=3, fmt=fmt), chunks, ROOMY)
    rng = np.random.default_rng(0)
    pcm = [rng.integers(-20000, 20000, size=n, dtype=np.int16) for n in (1000, 0, 777)]
    for k, p in enumerate(pcm):
        store.put_chunk(job, k, p.tobytes())
        job.chunk_samples[k] = len(p)
    size = store.put_audio(job, _encoded(store, job, chunks))
    data = store.audio_file(job).read_bytes()
    assert size == len(data)
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
