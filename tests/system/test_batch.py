"""``chattts-serve batch``: bulk synthesis on Ray Data, run as the real command in a subprocess
with a local Ray of its own (2 CPUs) and random-tiny weights from the session's cache (the CPU
default, int8 GPT layers). These tests do not use the session's Ray (tests/conftest.py runs them
after it is shut down).

Random weights decode exactly their planned tokens, so every file's length is known to the
sample. An actor call speaks 4 rows at once (``--rows-per-call 4``), and a resumed run's calls
hold other rows than the uninterrupted run's: a row's file is the same byte for byte all the
same (batch invariance, deployments/bulk/speech.py).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
from support.audio import assert_duration
from support.cli import cli_command
from support.engine import expected_samples
from support.waiting import wait_until

from bench.lib.procs import MARKER_ENV, child_env, kill_marked
from deployments.bulk.config import BatchRow
from deployments.bulk.output import OutputDir
from deployments.bulk.rows import audio_stem, check_row, csv_options, raw_rows
from serve_app.engine.audio import SAMPLE_RATE
from serve_app.engine.planner import Planner
from serve_app.engine.voices import OPENAI_VOICES

GOOD = [
    {"id": "zh-1", "text": "你好，欢迎使用语音合成服务。"},
    {"id": "en-1", "text": "Hello world, it is 10:30.", "voice": "echo", "seed": 7},
    {"id": 3, "text": "今天天气很好，我们一起去公园散步吧。", "speed": 1.5, "response_format": "mp3"},
    {"id": "seeded", "text": "The quick brown fox jumps over the lazy dog.", "voice": "seed:42", "speaker": "ann"},
    # Two segments (over segments.max_seconds); an id that is not a plain file name.
    {
        "id": "two parts/1",
        "text": "今天天气很好，我们一起去公园散步吧。请在下一个路口向左转，然后直走两百米。",
        "temperature": 0.5,
    },
    {"id": "flac-1", "text": "会议改到明天下午三点，请大家准时参加。", "response_format": "flac", "voice": "nova"},
]
# (row, what its reason says); lines of JSONL, a str is written as it is.
BAD = [
    ({"id": "blank", "text": "   "}, "invalid_value: text: text is empty"),
    ({"id": "punct", "text": "。。。！"}, "empty_input"),
    ({"id": "who", "text": "hello", "voice": "bob"}, "voice_not_found"),
    ({"id": "fast", "text": "hello", "speed": 9}, "invalid_value: speed"),
    # A type Arrow's JSON reader would fail the whole file on (seed was a number above).
    ({"id": "typed", "text": "hello", "seed": "seven"}, "invalid_value: seed"),
    ("this line is not JSON", "invalid_row: not JSON"),
    ({"text": "a row without an id"}, "invalid_value: id: Field required"),
    ({"id": "twice", "text": "one"}, "duplicate_id"),
    ({"id": "twice", "text": "two"}, "duplicate_id"),
]
# The seed each good row decodes with: its own, else its voice's.
SEEDS = {
    "zh-1": OPENAI_VOICES["alloy"],
    "en-1": 7,
    "3": OPENAI_VOICES["alloy"],
    "seeded": 42,
    "two parts/1": OPENAI_VOICES["alloy"],
    "flac-1": OPENAI_VOICES["nova"],
}
COMMON = ("--num-cpus", "2", "--rows-per-call", "4")


def batch_env(marker: str) -> dict[str, str]:
    """A local Ray of its own (never another one), the session's weights (CHATTTS_SERVE_CACHE: support.engine)."""
    return child_env(CHATTTS_WEIGHTS="random-tiny", OMP_NUM_THREADS="1", **{MARKER_ENV: marker})


def run_batch(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    marker = uuid.uuid4().hex
    try:
        return subprocess.run(
            [*cli_command(), "batch", *args, *COMMON],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=batch_env(marker),
        )
    finally:
        kill_marked(marker)  # anything of its Ray left behind (nothing, normally)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n" for r in rows))
    return path


def expected(row: dict) -> dict:
    """What the manifest must say of a good row, from the planner alone."""
    opts = BatchRow.model_validate(
        {**{k: v for k, v in row.items() if k in BatchRow.model_fields}, "id": str(row["id"])}
    )
    plan = Planner().plan(opts.text, opts.request().to_options())
    fmt = opts.response_format
    return {
        "id": opts.id,
        "path": f"audio/{audio_stem(opts.id)}.{fmt}",
        "format": fmt,
        "samples": expected_samples(plan),
        "seed": SEEDS[opts.id],
        "voice": opts.voice,
        "speed": opts.speed,
        "text": opts.text,
        "normalized_text": " ".join(plan.texts),
        "segments": len(plan.segments),
    }


def manifest(out: Path) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(out / "manifest.parquet").to_pylist()}


def errors(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "errors.jsonl").read_text().splitlines()]


def journal(out: Path) -> list[dict]:
    """The journal's complete lines (a kill can cut the last one: it commits nothing)."""
    text = (out / ".batch" / "journal.jsonl").read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line]


# The rows that pass the driver's checks, in input order; the actors' planning refuses two of them.
CHECKED = [*GOOD[:3], BAD[1][0], BAD[2][0], *GOOD[3:]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, float]:
    """One uninterrupted run over the good and the bad rows (JSONL)."""
    tmp = tmp_path_factory.mktemp("batch-ref")
    refused = [r for r, _ in BAD[:1] + BAD[3:]]  # by the driver's checks
    src = write_jsonl(tmp / "in.jsonl", [*CHECKED[:2], *refused[:3], *CHECKED[2:5], *refused[3:], *CHECKED[5:]])
    t0 = time.monotonic()
    proc = run_batch(str(src), "--out", str(tmp / "out"))
    return tmp / "out", proc, time.monotonic() - t0


@pytest.mark.timeout(300)
def test_a_run_writes_every_row_its_manifest_and_its_errors(reference):
    out, proc, took = reference
    assert proc.returncode == 3, proc.stderr[-4000:]  # finished, some rows failed
    total = len(GOOD) + len(BAD)
    assert f"batch: {total} rows: {len(GOOD)} written, 0 skipped (done before), {len(BAD)} failed" in proc.stderr
    assert "MapBatches(SpeechStage)" in proc.stderr  # Ray Data's progress
    assert "columns ignored (not synthesis options): speaker (1 rows)" in proc.stderr
    want = {str(r["id"]): expected(r) for r in GOOD}
    # One file per good row, nothing else (no temporary files).
    assert sorted(p.name for p in (out / "audio").iterdir()) == sorted(Path(w["path"]).name for w in want.values())
    got = manifest(out)
    assert set(got) == set(want)
    for rid, w in want.items():
        m, data = got[rid], (out / w["path"]).read_bytes()
        assert assert_duration(data, w["format"], w["samples"]) > 0
        assert m["seconds"] == pytest.approx(w["samples"] / SAMPLE_RATE, abs=1e-6)
        for k in ("path", "format", "seed", "voice", "speed", "text", "normalized_text", "segments"):
            assert m[k] == w[k], (rid, k)
        assert m["bytes"] == len(data) and m["weights"].startswith("random:random-tiny")
    assert got["two parts/1"]["segments"] == 2 and got["en-1"]["normalized_text"] == "Hello world, it is ten thirty."
    # Every bad row in the errors file with its reason; the run went on past them.
    errs = errors(out)
    assert len(errs) == len(BAD)
    for row, reason in BAD:
        rid = row.get("id") if isinstance(row, dict) else None
        assert any(e["id"] == rid and e["reason"].startswith(reason) for e in errs), (row, errs)
    assert sum(e["id"] == "twice" for e in errs) == 2
    print(f"reference run: {took:.1f} s")


@pytest.mark.timeout(420)
def test_a_killed_run_resumes_and_writes_each_row_once(reference, tmp_path):
    """The reference's rows as Parquet (without those the driver refuses), then filler rows so
    that the first run is surely cut mid-way: it is killed (SIGKILL) once its first rows are
    committed; the next run speaks only the rest, in calls of other rows than the reference's,
    and every file equals the reference run's."""
    ref_out, ref_proc, _ = reference
    assert ref_proc.returncode == 3, ref_proc.stderr[-4000:]
    fillers = [{"id": f"filler-{i}", "text": f"这是第{i}句，用来把第一次运行拉长。"} for i in range(8)]
    rows = [{**r, "id": str(r["id"])} for r in CHECKED] + fillers
    src = tmp_path / "in.parquet"
    columns = sorted({k for r in rows for k in r})
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in columns}), src)
    out = tmp_path / "out"
    args = [str(src), "--out", str(out), "--no-progress"]

    marker = uuid.uuid4().hex
    log = tmp_path / "first.log"
    with open(log, "wb") as sink:
        first = subprocess.Popen(
            [*cli_command(), "batch", *args, *COMMON],
            env=batch_env(marker),
            start_new_session=True,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    journal_path = out / ".batch" / "journal.jsonl"
    try:

        def committed_one() -> bool:
            assert first.poll() is None, log.read_text(errors="replace")[-4000:]
            return journal_path.exists() and journal_path.read_bytes().count(b"\n") >= 1

        wait_until(committed_one, 180, 0.01, what="a row committed")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    finally:
        kill_marked(marker)  # its Ray (GCS, raylet, workers: they leave the process group), by pid
    committed = {r["id"]: r for r in journal(out) if "path" in r}
    good_ids = [r["id"] for r in rows if r["id"] not in ("punct", "who")]
    assert 1 <= len(committed) < len(good_ids), committed.keys()
    before = {rid: os.stat(out / r["path"]) for rid, r in committed.items()}
    # What a crash can leave besides: a half-written file, and a whole file never committed.
    todo = [rid for rid in good_ids if rid not in committed]
    name = Path(expected(next(r for r in rows if r["id"] == todo[0]))["path"]).name
    (out / "audio" / f".{name}.part").write_bytes(b"half")
    (out / "audio" / name).write_bytes(b"RIFF but never committed")

    second = run_batch(*args)
    assert second.returncode == 3, second.stderr[-4000:]
    assert (
        f"batch: {len(rows)} rows: {len(todo)} written, {len(committed)} skipped (done before), 2 failed"
        in second.stderr
    ), second.stderr[-3000:]
    # Each row committed once over both runs; the first run's files untouched by the second.
    assert collections.Counter(r["id"] for r in journal(out) if "path" in r) == collections.Counter(good_ids)
    for rid, st in before.items():
        now = os.stat(out / committed[rid]["path"])
        assert (now.st_ino, now.st_mtime_ns, now.st_size) == (st.st_ino, st.st_mtime_ns, st.st_size), rid
    # The same files as the uninterrupted run, byte for byte, and the same manifest rows.
    ref = manifest(ref_out)
    got = manifest(out)
    assert set(got) == set(good_ids)
    for rid, m in ref.items():
        assert (out / m["path"]).read_bytes() == (ref_out / m["path"]).read_bytes(), rid
        assert got[rid] == m, rid
    assert not [p for p in (out / "audio").iterdir() if p.name.endswith(".part")]
    assert sorted(p.name for p in (out / "audio").iterdir()) == sorted(Path(m["path"]).name for m in got.values())
    assert sorted(e["id"] for e in errors(out)) == ["punct", "who"]


def test_rows_are_checked_alike_from_csv_parquet_and_jsonl(tmp_path):
    """No Ray: what the driver makes of CSV cells (text; empty: absent; other columns never
    read), Parquet's typed columns and JSONL lines."""
    src = tmp_path / "in.csv"
    src.write_text(
        "id,text,seed,speed,notes,voice\n"
        'a,"Hello, world.",7,,12,\n'
        "b,你好。,,1.5,not a number,echo\n"
        "c,hi,x,,3,\n"
        ",no id,,,,\n"
    )
    table = pyarrow.csv.read_csv(src, convert_options=csv_options())
    checked = [check_row(raw, "wav") for raw in raw_rows(table, "csv")]
    assert [(r.id if r else None, reason) for r, reason, _ in checked][:2] == [("a", None), ("b", None)]
    a, b = checked[0][0], checked[1][0]
    assert (a.seed, a.voice, a.speed, a.response_format) == (7, "alloy", 1.0, "wav") and (b.seed, b.speed) == (
        None,
        1.5,
    )
    assert checked[2][1].startswith("invalid_value: seed") and checked[3][1] == "invalid_value: id: Field required"
    # Parquet: integer ids, unknown columns reported; JSONL: a line per row, bad lines kept as reasons.
    typed = pa.Table.from_pylist([{"id": 1, "text": "one", "extra": 1.5}, {"id": 2, "text": "。", "extra": None}])
    rows = [check_row(raw, "flac") for raw in raw_rows(typed, "parquet")]
    assert [(r.id, ignored) for r, _, ignored in rows] == [("1", ["extra"]), ("2", [])]
    lines = pa.table({"text": ['{"id": "x", "text": "hi", "seed": 3}', "[1, 2]", "{oops", ""]})
    got = [check_row(raw, "wav") for raw in raw_rows(lines, "jsonl")]
    assert got[0][0].seed == 3 and got[1][1].startswith("invalid_row: not a JSON object") and len(got) == 3


def test_file_names_and_recovery(tmp_path):
    """No Ray: ids -> file names; what a new run keeps of what an earlier one left."""
    assert audio_stem("utt_0001.a") == "utt_0001.a"
    odd = audio_stem("spk 1/utt:2")
    assert odd.startswith("spk_1_utt_2+") and "/" not in odd and odd == audio_stem("spk 1/utt:2")
    assert audio_stem("../x") != audio_stem("__x") and "/" not in audio_stem("../x")
    out = tmp_path / "out"
    with OutputDir(out) as d:
        d.recover()
        row = {
            "name": "a.wav",
            "audio": b"x" * 10,
            "id": "a",
            "format": "wav",
            "seconds": 1.0,
            "seed": 1,
            "voice": "alloy",
            "speed": 1.0,
            "text": "t",
            "normalized_text": "t",
            "segments_count": 1,
            "weights": "random:w",
        }
        d.commit(row)
        d.commit({**row, "name": "b.wav", "id": "b"})
        d.error("f", "empty_input: nothing to speak", key="k1")  # refused for what it holds: remembered
        d.error("g", "synthesis_failed: engine stopped")  # may pass next time: not remembered
    (out / "audio" / "b.wav").write_bytes(b"short")  # changed after its commit: not done
    (out / "audio" / "c.wav").write_bytes(b"never committed")  # not ours to delete: kept
    (out / "audio" / ".d.wav.part").write_bytes(b"half")
    (out / "audio" / "notes.txt").write_text("not ours")
    with open(out / ".batch" / "journal.jsonl", "a") as f:
        f.write('{"id": "e", "path": "audio/e.w')  # a line cut by a crash
    with OutputDir(out) as d:
        assert set(d.recover()) == {"a"}
        assert {k: v["key"] for k, v in d.failed.items()} == {"f": "k1"}
        with pytest.raises(Exception, match="another batch run"):
            OutputDir(out).__enter__()
        d.write_manifest()
    assert sorted(p.name for p in (out / "audio").iterdir()) == ["a.wav", "c.wav", "notes.txt"]
    assert (out / ".batch" / "journal.jsonl").read_text().endswith("}\n")
    assert [r["id"] for r in pq.read_table(out / "manifest.parquet").to_pylist()] == ["a"]
