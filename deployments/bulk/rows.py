"""Input rows -> checked rows -> groups -> planned groups, and the columns the stages pass on.

The driver reads the input in order (``read_input``, ``raw_rows``), checks each row
(``check_row``: JSON, the row's fields, its id) and cuts the rows that pass into groups of
consecutive rows (``Group``). A group is the unit of decoding: its rows decode together, alone in
one engine, so a row's audio depends only on its group, never on timing, actors or what an earlier
run finished (see ``job.py``). The plan tasks run ``plan_groups``; they import no torch (the
planner is the TextNormalizer's).

A row that cannot be synthesised becomes an error with its reason (``code: message``, the codes
the service answers with); one bad row never stops the run.
"""

from __future__ import annotations

import functools
import hashlib
import json
import pickle
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Optional, Union

import pyarrow as pa
from pydantic import ValidationError

from deployments.bulk.config import INPUT_SUFFIXES, ROW_FIELDS, BatchConfig, BatchRow, InputFormat
from serve_app.engine.config import SegmentConfig
from serve_app.engine.planner import Planner
from serve_app.engine.voices import effective_seed
from serve_app.errors import to_api_error

TODO, ERROR = "todo", "error"
HIDDEN_SIZE = 768  # ChatTTS's GPT hidden size (the tiny random weights keep it)

# One row of the acoustic stage's output (a row to vocode, or an error passed on: ``permanent``
# when the row itself is the cause); the vocoder stage replaces ``hidden`` and ``lengths`` with
# ``audio`` and ``seconds``.
_COMMON = [
    ("id", pa.string()),
    ("status", pa.string()),
    ("reason", pa.string()),
    ("name", pa.string()),
    ("format", pa.string()),
    ("text", pa.string()),
    ("normalized_text", pa.string()),
    ("voice", pa.string()),
    ("seed", pa.int64()),
    ("speed", pa.float64()),
    ("segments_count", pa.int32()),
    # How the plan shapes the audio (engine/types.py Plan), for the vocoder stage's AudioAssembler.
    ("pauses", pa.list_(pa.float64())),
    ("gain_db", pa.float64()),
    ("lead_in", pa.float64()),
    ("loudness", pa.float64()),
    ("weights", pa.string()),
    ("permanent", pa.bool_()),
]
DECODED = pa.schema([*_COMMON, ("hidden", pa.large_binary()), ("lengths", pa.list_(pa.int32()))])
VOICED = pa.schema([*_COMMON, ("audio", pa.large_binary()), ("seconds", pa.float64())])
# A group between the driver, the plan tasks and the acoustic actors: one pickled ``Group``.
GROUPS = pa.schema([("group", pa.large_binary())])


def error_reason(exc: BaseException) -> str:
    """``code: message``, the code from the service's one error table where it has a row."""
    if isinstance(exc, ValidationError):
        # pydantic words a validator's ValueError "Value error, <message>": the message is the reason.
        parts = [
            f"{'.'.join(str(x) for x in e['loc']) or 'row'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        ]
        return "invalid_value: " + "; ".join(parts)
    known = to_api_error(exc)
    code = known.code if known is not None and known.code else f"failed ({exc.__class__.__name__})"
    return f"{code}: {exc}"


# ------------------------------------------------------------------ reading

_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")


def audio_stem(rid: str) -> str:
    """The file name (without suffix) of a row's audio: the id itself where it is a plain name,
    else a readable part and a hash of the id (``+`` never appears in a plain name, so the two
    kinds cannot collide). The same id always gives the same name."""
    if _SAFE_ID.fullmatch(rid):
        return rid
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", rid)[:40].strip("._-") or "row"
    return f"{slug}+{hashlib.sha256(rid.encode()).hexdigest()[:16]}"


def input_format(path: str) -> InputFormat:
    for suffix in reversed(PurePosixPath(path.rstrip("/")).suffixes):
        if suffix.lower() in INPUT_SUFFIXES:
            return INPUT_SUFFIXES[suffix.lower()]
    raise ValueError(
        f"cannot tell the input format of {path!r} from its name: pass --input-format jsonl, csv or parquet"
    )


def read_input(cfg: BatchConfig, kind: InputFormat):
    """The input as a Ray Data dataset of raw rows, in the input's order.

    JSONL is read as lines and parsed row by row: Arrow's JSON reader fails the whole file on one
    row whose field has another type than in the rows before it (``"seed": "7"`` after
    ``"seed": 7``), which is a bad row, not a bad file. CSV cells are read as text (pydantic
    converts them, as for a form) and only the row fields are read, so a column the job ignores
    cannot fail the read either.
    """
    import ray.data

    if kind == "jsonl":
        return ray.data.read_text(cfg.input, num_cpus=cfg.plan_cpus)
    if kind == "csv":
        return ray.data.read_csv(cfg.input, num_cpus=cfg.plan_cpus, convert_options=csv_options())
    return ray.data.read_parquet(cfg.input, num_cpus=cfg.plan_cpus)


def csv_options():
    """Arrow's CSV conversion for the input: the row fields as text (empty cells: absent), and
    nothing else, so no other column's types are inferred (and can fail)."""
    from pyarrow import csv

    return csv.ConvertOptions(
        column_types={f: pa.string() for f in ROW_FIELDS},
        strings_can_be_null=True,
        include_columns=sorted(ROW_FIELDS),
        include_missing_columns=True,
    )


class BadLine(str):
    """A JSONL line that is not a JSON object: the reason, in place of the row."""


def raw_rows(batch: pa.Table, kind: InputFormat) -> list[Union[dict, BadLine]]:
    if kind != "jsonl":
        return batch.to_pylist()
    rows: list[Union[dict, BadLine]] = []
    for line in batch.column("text").to_pylist():
        line = (line or "").lstrip("\ufeff")
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError as exc:
            rows.append(BadLine(f"invalid_row: not JSON ({exc.msg} at column {exc.colno}): {line[:80]!r}"))
            continue
        rows.append(value if isinstance(value, dict) else BadLine(f"invalid_row: not a JSON object: {line[:80]!r}"))
    return rows


def check_row(raw: Union[dict, BadLine], default_format: str) -> tuple[Optional[BatchRow], Optional[str], list[str]]:
    """(the row, None, its ignored columns) or (None, the reason it is refused, ...)."""
    if isinstance(raw, BadLine):
        return None, str(raw), []
    values = {k: v for k, v in raw.items() if v is not None}  # null cells: the option's default
    ignored = sorted(k for k in values if k not in ROW_FIELDS)
    fields = {k: v for k, v in values.items() if k in ROW_FIELDS}
    fields.setdefault("response_format", default_format)
    try:
        return BatchRow.model_validate(fields), None, ignored
    except ValidationError as exc:
        return None, error_reason(exc), ignored


# ------------------------------------------------------------------ groups and planning


@dataclass
class Item:
    """A checked row in its group: ``done`` rows decode for their neighbours' sake only."""

    row: dict  # BatchRow.model_dump()
    key: str = ""  # row_key: what a refusal of this row is recorded under
    done: bool = False  # written by an earlier run
    failed: Optional[str] = None  # refused by an earlier run, for this same row: the reason

    @property
    def settled(self) -> bool:
        return self.done or self.failed is not None


def row_key(row: dict, limits: str) -> str:
    """What planning a row depends on: its fields and the segment limits."""
    return hashlib.sha256((json.dumps(row, sort_keys=True, ensure_ascii=False) + limits).encode()).hexdigest()[:32]


@dataclass
class Group:
    index: int
    items: list[Item]
    planned: list[dict] = field(default_factory=list)  # plan_groups' output, one per item


@functools.lru_cache(maxsize=4)
def _planner(limits_json: str) -> Planner:
    """One planner per worker process: its text front end's tables load once."""
    planner = Planner(SegmentConfig.model_validate_json(limits_json))
    planner.warmup()
    return planner


def plan_item(planner: Planner, item: Item) -> dict:
    """A checked row -> what the acoustic stage decodes (``todo``) or an ``error`` row."""
    row = BatchRow.model_validate(item.row)
    base = {"id": row.id, "text": row.text, "done": item.done}
    try:
        plan = planner.plan(row.text, row.options())
    except Exception as exc:  # noqa: BLE001 - any failure is this row's, reported with it
        return {**base, "status": ERROR, "reason": error_reason(exc), "permanent": True}
    return {
        **base,
        "status": TODO,
        "reason": None,
        "permanent": False,
        "name": f"{audio_stem(row.id)}.{row.response_format}",
        "format": row.response_format,
        "normalized_text": " ".join(plan.texts),
        "voice": plan.voice.name,
        "seed": effective_seed(plan.voice, row.seed),
        "speed": row.speed,
        "segments_count": len(plan.segments),
        "pauses": list(plan.pauses),
        "gain_db": plan.gain_db,
        "lead_in": plan.lead_in,
        "loudness": plan.loudness,
        "segments": plan.segments,
    }


def plan_groups(batch: pa.Table, limits: str) -> pa.Table:
    """A plan task (``map_batches``): every group of the batch planned, row by row."""
    planner = _planner(limits)
    out = []
    for blob in batch.column("group").to_pylist():
        group: Group = pickle.loads(blob)
        group.planned = [plan_item(planner, item) for item in group.items]
        out.append(pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL))
    return pa.table({"group": pa.array(out, pa.large_binary())})


def hidden_bytes(parts: list[Any]) -> tuple[bytes, list[int]]:
    """Segments' hidden states (float16 numpy arrays, (n, 768) each) as one buffer and lengths."""
    import numpy as np

    return (np.concatenate(parts).astype(np.float16).tobytes() if parts else b""), [int(p.shape[0]) for p in parts]


def split_hidden(data: bytes, lengths: list[int]) -> list[Any]:
    import numpy as np

    flat = np.frombuffer(data, dtype=np.float16).reshape(-1, HIDDEN_SIZE)
    bounds = np.cumsum([0, *lengths])
    return [flat[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
