"""One bulk synthesis run on Ray Data.

    driver: read the input in order, check every row                  (ray.data.read_*)
      -> SpeechStage (actor pool: the speech pipeline in each actor; a GPU share each where there
         are GPUs): plan, decode, vocode, encode
      -> driver: each row written as it arrives; the manifest merged at the end

Resume: rows the output's journal commits are done (``OutputDir.recover``) and are not spoken
again, nor are rows refused for what they hold (the journal keeps their key, ``rows.row_key``);
every other row is. A row's audio depends on the row alone (batch invariance on CPU:
``speech.py``), so a resumed run writes exactly what an uninterrupted run would have, each row
once.

The driver holds the checked rows (their text and options) while the run lasts: fine for
hundreds of thousands of rows; split larger inputs into several runs.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from deployments.bulk.config import CALLS_PER_ACTOR, BatchConfig, InputFormat, row_id
from deployments.bulk.output import OutputDir
from deployments.bulk.rows import ROWS, TODO, audio_stem, check_row, input_format, raw_rows, read_input, row_key
from serve_app.engine.config import WeightsConfig

log = logging.getLogger(__name__)


@dataclass
class Pools:
    actors: int
    num_gpus: float
    actor_cpus: float
    call_rows: int

    @property
    def gpu(self) -> bool:
        return self.num_gpus > 0


@dataclass
class BatchSummary:
    rows: int = 0  # input rows
    written: int = 0  # synthesised and written by this run
    skipped: int = 0  # done by an earlier run
    failed: int = 0  # in the errors file
    audio_seconds: float = 0.0  # written by this run
    wall_s: float = 0.0  # the whole run, start-up included
    pipeline_s: float = 0.0  # from the pipeline's start (actors loading their models) to its last row
    first_row_s: Optional[float] = None  # from the pipeline's start to the first row written
    calls: int = 0  # actor calls of this run (blocks of rows)
    removed: int = 0  # files an interrupted run left, removed before this one
    weights: str = ""
    pools: dict = field(default_factory=dict)
    ignored_columns: dict = field(default_factory=dict)  # column -> rows that had it

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_seconds / self.wall_s if self.wall_s else 0.0

    def text(self) -> str:
        lines = [
            f"batch: {self.rows} rows: {self.written} written, {self.skipped} skipped (done before), "
            f"{self.failed} failed (errors.jsonl)",
            f"batch: {self.audio_seconds:.1f} s of audio in {self.wall_s:.1f} s: {self.audio_s_per_s:.2f} audio s/s "
            f"({self.pipeline_s:.1f} s in the pipeline, {self.calls} call(s) of up to {self.pools.get('call_rows')} "
            f"rows, {self.pools.get('actors')} speech actor(s))",
        ]
        if self.ignored_columns:
            cols = ", ".join(f"{k} ({n} rows)" for k, n in sorted(self.ignored_columns.items()))
            lines.append(f"batch: columns ignored (not synthesis options): {cols}")
        return "\n".join(lines)


def pin_weights(weights: WeightsConfig) -> tuple[WeightsConfig, str]:
    """Resolve ``auto`` and the CHATTTS_WEIGHTS override once, on the driver, so every actor
    loads the same kind of weights (random ones are built here; other nodes rebuild the
    identical tree from the same seed). Returns the pinned config and the weights' kind."""
    from serve_app.engine.weights.sources import resolve_weights

    resolved = resolve_weights(weights)
    pinned = weights.resolved().model_copy(update={"source": resolved.source})
    if resolved.source == "local":
        pinned = pinned.model_copy(update={"path": str(resolved.root)})
    return pinned, resolved.kind


def connect(cfg: BatchConfig) -> bool:
    """Join the cluster the config or ``RAY_ADDRESS`` names (``ray job submit`` sets it), else
    start a local Ray of this run's own: never one a ``ray start`` left on this machine.
    True if this call connected (the run disconnects at its end)."""
    import ray

    if ray.is_initialized():
        return False
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(address="local", num_cpus=cfg.num_cpus or os.cpu_count(), include_dashboard=False, log_to_driver=False)
    return True


def size_pools(cfg: BatchConfig) -> Pools:
    """The speech actors from the cluster's resources: one on every GPU share, else one per node
    with CPUs, each with that node's CPUs less a read task's (the smallest node's)."""
    import ray

    res = ray.cluster_resources()
    gpus = res.get("GPU", 0.0)
    wants_gpu = cfg.device in ("auto", "cuda")
    num_gpus = cfg.num_gpus if cfg.num_gpus is not None else (0.5 if gpus and wants_gpu else 0.0)
    if cfg.device == "cuda" and num_gpus == 0:
        raise ValueError(f"--device cuda needs a GPU share per actor (--num-gpus); the cluster has {gpus:g} GPUs")
    if num_gpus > 0 and gpus < num_gpus:
        raise ValueError(f"--num-gpus {num_gpus:g}: the cluster has {gpus:g} GPUs")
    nodes = [n["Resources"].get("CPU", 0.0) for n in ray.nodes() if n.get("Alive")]
    cpus = cfg.actor_cpus or (1.0 if num_gpus > 0 else max(0.5, min(c for c in nodes if c > 0) - cfg.read_cpus))
    if cfg.actors:
        actors = cfg.actors
    elif num_gpus > 0:
        actors = int(gpus / num_gpus + 1e-9)
    else:
        actors = sum(1 for c in nodes if c >= cpus)
    actors = max(1, actors)
    if actors * cpus > res.get("CPU", 0.0) + 1e-9:
        raise ValueError(
            f"{actors} actor(s) of {cpus:g} CPUs need more than the cluster's {res.get('CPU', 0.0):g}: "
            "lower --actors or --actor-cpus"
        )
    return Pools(actors, num_gpus, cpus, cfg.call_rows(num_gpus > 0))


def checked_rows(ds, kind: InputFormat, cfg: BatchConfig, out: OutputDir, summary: BatchSummary) -> list[dict]:
    """Every input row in order, checked on the driver: refused rows go to the errors file, and so
    do rows an earlier run refused for what they hold now. Returns the rows to speak (``ROWS``
    records): those neither written nor refused."""
    raws = [raw for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow") for raw in raw_rows(batch, kind)]
    summary.rows = len(raws)
    counts = collections.Counter(row_id(raw) for raw in raws)
    # Ids whose file names differ only in case ("Utt1", "utt1") name one file on a
    # case-insensitive filesystem (macOS, Windows): one row's audio would be the other's.
    folded = collections.Counter(audio_stem(rid).casefold() for rid in counts if rid is not None)
    limits = cfg.segments.model_dump_json()
    todo: list[dict] = []
    for raw in raws:
        row, reason, ignored = check_row(raw, cfg.default_format)
        for col in ignored:
            summary.ignored_columns[col] = summary.ignored_columns.get(col, 0) + 1
        if row is not None and counts[row.id] > 1:
            # Which of them to keep would depend on the order: none is synthesised.
            row, reason = None, f"duplicate_id: {counts[row.id]} input rows have this id (none of them is synthesised)"
        elif row is not None and folded[audio_stem(row.id).casefold()] > 1:
            row, reason = (
                None,
                (
                    f"duplicate_id: {folded[audio_stem(row.id).casefold()]} input ids differ from this one "
                    "only in case, and would share one file where names ignore case (none of them is "
                    "synthesised)"
                ),
            )
        if row is None:
            out.error(row_id(raw), reason)
            summary.failed += 1
            continue
        if row.id in out.done:
            summary.skipped += 1
            continue
        key = row_key(row.model_dump(), limits)
        before = out.failed.get(row.id)
        if before is not None and before["key"] == key:
            out.error(row.id, before["failed"])  # refused before for what it holds now: not tried again
            summary.failed += 1
            continue
        todo.append({"id": row.id, "row": row.model_dump_json(), "key": key})
    return todo


def run_batch(
    cfg: BatchConfig,
    progress: bool = True,
    say: Callable[[str], None] = lambda m: print(m, file=sys.stderr),
    on_row: Optional[Callable[[dict], None]] = None,
) -> BatchSummary:
    """The whole run (module docstring); ``on_row`` sees each manifest record as it is committed."""
    import pyarrow as pa
    import ray
    import ray.data
    from ray.data import ActorPoolStrategy

    from deployments.bulk.speech import SpeechStage

    t0 = time.perf_counter()
    summary = BatchSummary()
    kind = cfg.input_format or input_format(cfg.input)
    weights, summary.weights = pin_weights(cfg.weights)
    if summary.weights == "random":
        say("batch: warning: RANDOM weights (noise, not speech): no real ChatTTS weights found")
    with OutputDir(cfg.out) as out:
        out.recover()
        summary.removed = out.removed
        started = connect(cfg)
        try:
            pools = size_pools(cfg)
            summary.pools = asdict(pools)
            ctx = ray.data.DataContext.get_current()
            ctx.enable_progress_bars = progress
            ctx.execution_options.preserve_order = True  # the errors file in the input's order
            todo = checked_rows(read_input(cfg, kind), kind, cfg, out, summary)
            ctx.execution_options.preserve_order = False  # rows are written as they are spoken
            n = pools.call_rows
            summary.calls = -(-len(todo) // n)
            say(
                f"batch: {summary.rows} rows: {summary.skipped} done before, {summary.failed} refused, "
                f"{len(todo)} to speak in {summary.calls} call(s) of up to {n} rows; {pools.actors} speech "
                f"actor(s) of {pools.actor_cpus:g} CPUs"
                + (f" and {pools.num_gpus:g} GPU" if pools.gpu else "")
                + " each"
            )
            t_pipe = time.perf_counter()
            if todo:
                # One block per call.
                source = ray.data.from_arrow(
                    [pa.Table.from_pylist(todo[i : i + n], schema=ROWS) for i in range(0, len(todo), n)]
                )
                voiced = source.map_batches(
                    SpeechStage,
                    batch_format="pyarrow",
                    batch_size=n,
                    num_cpus=pools.actor_cpus,
                    **({"num_gpus": pools.num_gpus} if pools.gpu else {}),
                    fn_constructor_kwargs={
                        "engine": cfg.engine_config(weights, pools.gpu, pools.actor_cpus).model_dump()
                    },
                    compute=ActorPoolStrategy(
                        size=pools.actors,
                        max_concurrent_calls_per_actor=CALLS_PER_ACTOR,
                        enable_true_multi_threading=True,
                    ),
                )
                _write_all(voiced, out, summary, t_pipe, {r["id"]: r["key"] for r in todo}, on_row)
            summary.pipeline_s = time.perf_counter() - t_pipe
        finally:
            out.write_manifest()
            summary.wall_s = time.perf_counter() - t0
            if started:
                ray.shutdown()
    return summary


def _write_all(
    voiced,
    out: OutputDir,
    summary: BatchSummary,
    t_pipe: float,
    keys: dict[str, str],
    on_row: Optional[Callable[[dict], None]],
) -> None:
    """The driver's loop: every row as its block arrives, written (or its error) at once."""
    for batch in voiced.iter_batches(batch_size=None, batch_format="pyarrow"):
        for row in batch.to_pylist():
            if row["status"] == TODO and row["id"] not in out.done:
                record = out.commit(row)
                if on_row is not None:
                    on_row(record)
                summary.written += 1
                summary.audio_seconds += row["seconds"]
                if summary.first_row_s is None:
                    summary.first_row_s = time.perf_counter() - t_pipe
            elif row["status"] != TODO:
                out.error(row["id"], row["reason"], keys.get(row["id"]) if row["permanent"] else None)
                summary.failed += 1
