"""The output directory of a batch, written by the driver alone:

    DIR/audio/<name>.<format>   one file per row (``rows.audio_stem``)
    DIR/manifest.parquet        every committed row: id, path, seconds, seed, voice, texts, ...
    DIR/errors.jsonl            the input's rows without audio after this run: id, reason
    DIR/.batch/journal.jsonl    the commit log, across runs: a line per row written, and per row
                                refused for what it holds (its own text or options: not retried
                                while those stay the same)
    DIR/.batch/lock             held while a run writes here

A row is written once: its bytes go to ``audio/.<name>.part``, are flushed to disk, renamed to
their final name, and only then committed by a journal line. A row is done when the journal
commits it and its file is there with the committed size; a crash anywhere before the journal
line leaves it not done, and the next run writes it again (over whatever it left).
The manifest is merged from the journal at the end of each run (latest commit per id).

Only files this tool wrote are ever removed (``recover``): its temporary files, and files the
journal commits that are no longer as committed. A directory that holds anything but this
tool's own is refused unless it has the journal (``ForeignOutput``): ``--out`` pointed at a
folder of one's own recordings must not lose them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import IO, Any, Optional

import pyarrow as pa

from serve_app.engine.audio import AUDIO_FORMATS

AUDIO_DIR = "audio"
STATE_DIR = ".batch"
JOURNAL = "journal.jsonl"
MANIFEST = "manifest.parquet"
ERRORS = "errors.jsonl"
PART = ".part"

MANIFEST_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("path", pa.string()),
        ("format", pa.string()),
        ("seconds", pa.float64()),
        ("seed", pa.int64()),
        ("voice", pa.string()),
        ("speed", pa.float64()),
        ("text", pa.string()),
        ("normalized_text", pa.string()),
        ("segments", pa.int32()),
        ("bytes", pa.int64()),
        ("sha256", pa.string()),
        ("weights", pa.string()),
    ]
)


class OutputLocked(RuntimeError):
    """Another run writes into this directory."""


class ForeignOutput(ValueError):
    """The output directory holds files and no journal of this tool's: not ours to write into."""


# A temporary file of ``commit``: ``.<row's file name>.part`` (``rows.audio_stem`` + a format).
_PART_RE = re.compile(r"\.[A-Za-z0-9._+-]+\.(?P<fmt>[a-z0-9]+)\.part\Z")


class OutputDir:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.audio = self.root / AUDIO_DIR
        self.state = self.root / STATE_DIR
        self.done: dict[str, dict] = {}  # id -> its committed record
        self.failed: dict[str, dict] = {}  # id -> {"key", "failed"}: refused for what the row holds
        self._lock: Any = None
        self._journal: Optional[IO[str]] = None
        self._errors: Optional[IO[str]] = None

    # ------------------------------------------------------------------ a run

    def __enter__(self) -> "OutputDir":
        from filelock import FileLock, Timeout

        self._check_ours()  # before anything is made in it
        self.audio.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(exist_ok=True)
        self._lock = FileLock(str(self.state / "lock"))
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            raise OutputLocked(f"another batch run is writing into {self.root}") from None
        return self

    def __exit__(self, *exc: Any) -> None:
        for f in (self._journal, self._errors):
            if f is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()
        self._journal = self._errors = None
        self._lock.release()

    def _check_ours(self) -> None:
        """``ForeignOutput`` unless the directory is new, empty, has this tool's journal, or
        holds only what a run leaves before its journal exists (an empty ``audio/``, the lock)."""
        if (self.state / JOURNAL).is_file() or not self.root.exists():
            return
        if not self.root.is_dir():
            raise ForeignOutput(f"--out {self.root} is not a directory")
        for entry in self.root.iterdir():
            if entry.name == AUDIO_DIR and entry.is_dir() and not any(entry.iterdir()):
                continue
            if entry.name == STATE_DIR and entry.is_dir() and all(p.name == "lock" for p in entry.iterdir()):
                continue
            raise ForeignOutput(
                f"--out {self.root} already holds files ({entry.name!r}) and no journal of an earlier "
                "batch run: give a new or empty directory (a run removes files it did not commit)"
            )

    def recover(self) -> dict[str, dict]:
        """What earlier runs committed and is still there (``self.done``) and the rows they
        refused (``self.failed``); removes what they left that this tool wrote and no longer
        stands: temporary files, and committed files changed or cut since. Nothing else under
        ``audio/`` is touched: a final file renamed just before a crash, never committed, is
        written over when its row is written again."""
        path = self.state / JOURNAL
        records: dict[str, dict] = {}
        failures: dict[str, dict] = {}
        if path.exists():
            data = path.read_bytes()
            complete = data[: data.rfind(b"\n") + 1]
            if len(complete) != len(data):
                # A line cut by a crash commits nothing; the next line must not be glued to it.
                with open(path, "r+b") as f:
                    f.truncate(len(complete))
            for line in complete.decode("utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    (failures if "failed" in rec else records)[rec["id"]] = rec
        self.done = {rid: rec for rid, rec in records.items() if self._intact(rec)}
        self.failed = {rid: rec for rid, rec in failures.items() if rid not in self.done}
        kept = {Path(rec["path"]).name for rec in self.done.values()}
        committed = {Path(rec["path"]).name for rec in records.values()}
        self.removed = 0
        for f in self.audio.iterdir():
            part = _PART_RE.fullmatch(f.name)
            ours = f.name in committed or (part is not None and part["fmt"] in AUDIO_FORMATS)
            if ours and f.name not in kept and f.is_file() and not f.is_symlink():
                f.unlink()
                self.removed += 1
        self._journal = open(path, "a", encoding="utf-8")
        self._errors = open(self.root / ERRORS, "w", encoding="utf-8")
        return self.done

    def _intact(self, rec: dict) -> bool:
        f = self.root / rec["path"]
        return f.is_file() and f.stat().st_size == rec["bytes"]

    # ------------------------------------------------------------------ rows

    def commit(self, row: dict) -> dict:
        """Write one synthesised row (a ``VOICED`` row) and commit it; its manifest record."""
        data: bytes = row["audio"]
        final = self.audio / row["name"]
        part = self.audio / f".{row['name']}{PART}"
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name says the file is whole
        os.replace(part, final)
        rec = {
            "id": row["id"],
            "path": f"{AUDIO_DIR}/{row['name']}",
            "format": row["format"],
            "seconds": round(float(row["seconds"]), 6),
            "seed": row["seed"],
            "voice": row["voice"],
            "speed": row["speed"],
            "text": row["text"],
            "normalized_text": row["normalized_text"],
            "segments": row["segments_count"],
            "bytes": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "weights": row["weights"],
        }
        self._journal.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self._journal.flush()  # committed: a crash of this process from here on keeps the row
        self.done[rec["id"]] = rec
        return rec

    def error(self, rid: Optional[str], reason: str, key: Optional[str] = None) -> None:
        """A row without audio, in the errors file; with ``key`` (what the row held, when the
        reason is the row's own) also in the journal, so that a later run does not try it again
        while it holds the same."""
        self._errors.write(json.dumps({"id": rid, "reason": reason}, ensure_ascii=False) + "\n")
        self._errors.flush()
        if key is not None and rid is not None and self.failed.get(rid, {}).get("key") != key:
            self._journal.write(json.dumps({"id": rid, "failed": reason, "key": key}, ensure_ascii=False) + "\n")
            self._journal.flush()
            self.failed[rid] = {"id": rid, "failed": reason, "key": key}

    # ------------------------------------------------------------------ the manifest

    def write_manifest(self) -> Path:
        """Every committed row, by id, as Parquet (written whole, then renamed into place)."""
        import pyarrow.parquet as pq

        records = [self.done[k] for k in sorted(self.done)]
        table = pa.Table.from_pylist(records, schema=MANIFEST_SCHEMA)
        final = self.root / MANIFEST
        part = self.root / f".{MANIFEST}{PART}"
        pq.write_table(table, part)
        os.replace(part, final)
        return final
