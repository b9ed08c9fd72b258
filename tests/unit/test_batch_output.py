"""``chattts-serve batch``'s output directory (``deployments/bulk/output.py``) with files it did not write:
a run removes only its own (temporary files, committed files changed since), and refuses a
directory of someone else's files. No Ray: the directory is driven as the run drives it."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from deployments.bulk.config import BatchConfig
from deployments.bulk.job import BatchSummary, checked_rows
from deployments.bulk.output import ForeignOutput, OutputDir
from deployments.bulk.rows import audio_stem

ROW = {
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
USERS = {"take1.wav": b"my recording", "song.mp3": b"my song", "notes.txt": b"notes", "b.flac": b"mine too"}


def _user_folder(root):
    (root / "audio").mkdir(parents=True)
    for name, data in USERS.items():
        (root / "audio" / name).write_bytes(data)


def test_an_existing_folder_of_audio_is_refused_untouched(tmp_path):
    """Before: ``recover`` removed every audio file under ``<out>/audio`` its (new, empty)
    journal did not list: the user's recordings were gone. Now the run refuses the folder
    before it makes anything in it."""
    _user_folder(tmp_path / "out")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(ForeignOutput, match="already holds files"):
        with OutputDir(tmp_path / "out") as d:
            d.recover()
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    for name, data in USERS.items():
        assert (tmp_path / "out" / "audio" / name).read_bytes() == data
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "x.wav").write_bytes(b"x")  # anything at all, not only under audio/
    with pytest.raises(ForeignOutput):
        OutputDir(tmp_path / "other").__enter__()
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(ForeignOutput, match="not a directory"):
        OutputDir(tmp_path / "file").__enter__()


def test_new_empty_and_own_directories_are_taken(tmp_path):
    (tmp_path / "empty").mkdir()
    for root in (tmp_path / "new", tmp_path / "empty"):
        with OutputDir(root) as d:
            d.recover()
            d.commit(ROW)
    # What a run leaves before its journal exists (killed right after taking the lock).
    (tmp_path / "started" / "audio").mkdir(parents=True)
    (tmp_path / "started" / ".batch").mkdir()
    (tmp_path / "started" / ".batch" / "lock").write_bytes(b"")
    with OutputDir(tmp_path / "started") as d:
        assert d.recover() == {}
    with OutputDir(tmp_path / "new") as d:  # a rerun: its own journal
        assert set(d.recover()) == {"a"}


def test_a_rerun_removes_only_what_it_wrote(tmp_path):
    out = tmp_path / "out"
    with OutputDir(out) as d:
        d.recover()
        d.commit(ROW)
        d.commit({**ROW, "name": "b.wav", "id": "b"})
    audio = out / "audio"
    (audio / "b.wav").write_bytes(b"short")  # committed, changed since: ours, not done
    (audio / ".c.wav.part").write_bytes(b"half")  # a temporary file of a row cut by a crash
    (audio / ".weird+0123456789abcdef.mp3.part").write_bytes(b"half")
    for name, data in USERS.items():  # the user's own files dropped in later
        if name != "b.flac":
            (audio / name).write_bytes(data)
    (audio / "c.wav").write_bytes(b"renamed, never committed")  # not in the journal: left alone
    (audio / ".hidden.part").write_bytes(b"not a row's temporary name")
    (audio / "sub").mkdir()
    with OutputDir(out) as d:
        assert set(d.recover()) == {"a"}
        assert d.removed == 3
    assert sorted(p.name for p in audio.iterdir()) == [
        ".hidden.part",
        "a.wav",
        "c.wav",
        "notes.txt",
        "song.mp3",
        "sub",
        "take1.wav",
    ]
    assert (audio / "take1.wav").read_bytes() == USERS["take1.wav"]


class _Rows:
    """The input as Ray Data hands it to the driver (``iter_batches`` of Arrow tables)."""

    def __init__(self, rows: list[dict]):
        self.table = pa.Table.from_pylist(rows)

    def iter_batches(self, batch_size=None, batch_format="pyarrow"):
        yield self.table


def test_ids_that_differ_only_in_case_are_refused_like_duplicates(tmp_path):
    """ "Utt1" and "utt1" are two files on Linux and one on macOS or Windows: there each row's
    audio would silently be the other's. Neither is synthesised, as for a duplicate id; ids
    whose names differ otherwise (hashed names keep their case apart) are kept."""
    rows = [{"id": i, "text": "hello"} for i in ("Utt1", "utt1", "UTT2", "spk 1", "SPK 1", "utt3")]
    cfg = BatchConfig(input="in.parquet", out=str(tmp_path / "out"))
    summary = BatchSummary()
    with OutputDir(cfg.out) as out:
        out.recover()
        kept = [r["id"] for r in checked_rows(_Rows(rows), "parquet", cfg, out, summary)]
    assert kept == ["UTT2", "spk 1", "SPK 1", "utt3"]
    assert len({audio_stem(i).casefold() for i in kept}) == len(kept)
    errors = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == ["Utt1", "utt1"] and all("only in case" in e["reason"] for e in errors)
    assert summary.failed == 2


SEGS = {"segments_count": 1, "weights": "random:w"}


def test_a_rerun_speaks_only_what_is_neither_written_nor_refused_for_what_it_holds(tmp_path):
    """The journal's commits are skipped; a row refused for its own text is reported again without
    being spoken while it holds the same, and spoken again once it changed."""
    cfg = BatchConfig(input="in.parquet", out=str(tmp_path / "out"))
    rows = [{"id": "a", "text": "hello"}, {"id": "b", "text": "。。。"}, {"id": "c", "text": "again"}]
    with OutputDir(cfg.out) as out:
        out.recover()
        first = checked_rows(_Rows(rows), "parquet", cfg, out, BatchSummary())
        assert [r["id"] for r in first] == ["a", "b", "c"]
        written = {"id": "a", "name": "a.wav", "audio": b"RIFF", "format": "wav", "seconds": 0.1, "seed": 1}
        out.commit({**written, "voice": "alloy", "speed": 1.0, "text": "hello", "normalized_text": "hello"} | SEGS)
        out.error("b", "empty_input: nothing to speak", key=first[1]["key"])  # the actor's refusal
        out.error("c", "synthesis_failed: engine stopped")  # may pass next time: not remembered
    with OutputDir(cfg.out) as out:
        out.recover()
        summary = BatchSummary()
        again = checked_rows(_Rows(rows), "parquet", cfg, out, summary)
        assert [r["id"] for r in again] == ["c"] and (summary.skipped, summary.failed) == (1, 1)
        changed = checked_rows(_Rows([{"id": "b", "text": "now it speaks"}]), "parquet", cfg, out, BatchSummary())
        assert [r["id"] for r in changed] == ["b"]
    reasons = [json.loads(line) for line in (tmp_path / "out" / "errors.jsonl").read_text().splitlines()]
    assert reasons[-1] == {"id": "b", "reason": "empty_input: nothing to speak"}
