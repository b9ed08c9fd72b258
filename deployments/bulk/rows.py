"""Input rows -> checked rows -> the rows the actors speak, and the columns they pass on.

The driver reads the input in order (``read_input``, ``raw_rows``) and checks each row
(``check_row``: JSON, the row's fields, its id); the rows that pass go to the speech actors
(``speech.py``) as ``ROWS`` and come back as ``VOICED`` rows: audio, or an error.

A row that cannot be synthesised becomes an error with its reason (``code: message``, the codes
the service answers with); one bad row never stops the run.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import PurePosixPath
from typing import Optional, Union

import pyarrow as pa
from pydantic import ValidationError

from deployments.bulk.config import INPUT_SUFFIXES, ROW_FIELDS, BatchConfig, BatchRow, InputFormat
from serve_app.errors import to_api_error

TODO, ERROR = "todo", "error"

# A checked row on its way to an actor: its id, its fields (``BatchRow`` as JSON) and its key.
ROWS = pa.schema([("id", pa.string()), ("row", pa.string()), ("key", pa.string())])
# A row back from an actor: its audio and what the manifest says of it, or an ``error`` with its
# reason (``permanent`` when the row itself is the cause: its text or options).
VOICED = pa.schema(
    [
        ("id", pa.string()),
        ("status", pa.string()),
        ("reason", pa.string()),
        ("permanent", pa.bool_()),
        ("name", pa.string()),
        ("format", pa.string()),
        ("text", pa.string()),
        ("normalized_text", pa.string()),
        ("voice", pa.string()),
        ("seed", pa.int64()),
        ("speed", pa.float64()),
        ("segments_count", pa.int32()),
        ("weights", pa.string()),
        ("audio", pa.large_binary()),
        ("seconds", pa.float64()),
    ]
)


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
        return ray.data.read_text(cfg.input, num_cpus=cfg.read_cpus)
    if kind == "csv":
        return ray.data.read_csv(cfg.input, num_cpus=cfg.read_cpus, convert_options=csv_options())
    return ray.data.read_parquet(cfg.input, num_cpus=cfg.read_cpus)


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


# ------------------------------------------------------------------ keys


def row_key(row: dict, limits: str) -> str:
    """What planning a row depends on: its fields and the segment limits (a refusal is recorded
    under it: the same row is not tried again while these stay the same)."""
    return hashlib.sha256((json.dumps(row, sort_keys=True, ensure_ascii=False) + limits).encode()).hexdigest()[:32]
