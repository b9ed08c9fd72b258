"""One bulk synthesis run on Ray Data.

    driver: read the input in order, check every row, cut groups     (ray.data.read_*)
      -> plan_groups (CPU tasks)
      -> AcousticStage (actor pool: a GPU share each where there are GPUs; one group per call)
      -> VocodeStage (CPU actor pool, grows with its queue)
      -> driver: each row written as it arrives; the manifest merged at the end

Why groups: a row decoded beside other rows comes out a little different (the batch's padding
and kernel shapes change float sums in the last bits: ~70 dB SNR, enough to change bytes), so
"the same audio in every run" needs every row decoded beside the same rows every time. A group
is ``rows_per_call`` consecutive rows among those that pass the driver's checks, decoded alone;
its composition depends on the input only. Resume: rows the output's journal commits are done
(``OutputDir.recover``); a group whose rows are all done is not decoded again, and a group that a
crash cut is decoded whole again with only its missing rows written. So a resumed run writes
exactly what an uninterrupted run would have, each row once.

The driver holds the checked rows (their text and options) while the run lasts: fine for
hundreds of thousands of rows; split larger inputs into several runs.
"""

from __future__ import annotations

import collections
import logging
import os
import pickle
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Optional

from deployments.bulk.config import BatchConfig, InputFormat, row_id
from deployments.bulk.output import OutputDir
from deployments.bulk.rows import (
    GROUPS,
    TODO,
    Group,
    Item,
    audio_stem,
    check_row,
    input_format,
    plan_groups,
    raw_rows,
    read_input,
    row_key,
)
from serve_app.engine.config import WeightsConfig

log = logging.getLogger(__name__)


@dataclass
class Pools:
    acoustic_actors: int
    num_gpus: float
    vocoders: int
    group_rows: int

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
    groups: int = 0  # groups decoded by this run
    removed: int = 0  # files an interrupted run left, removed before this one
    weights: str = ""
    pools: dict = field(default_factory=dict)
    ignored_columns: dict = field(default_factory=dict)  # column -> rows that had it

    @property
    def audio_s_per_s(self) -> float:
        return self.audio_seconds / self.wall_s if self.wall_s else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "audio_s_per_s": round(self.audio_s_per_s, 4)}

    def text(self) -> str:
        lines = [
            f"batch: {self.rows} rows: {self.written} written, {self.skipped} skipped (done before), "
            f"{self.failed} failed (errors.jsonl)",
            f"batch: {self.audio_seconds:.1f} s of audio in {self.wall_s:.1f} s: {self.audio_s_per_s:.2f} audio s/s "
            f"({self.pipeline_s:.1f} s in the pipeline, {self.groups} group(s) of {self.pools.get('group_rows')} rows; "
            f"{self.pools.get('acoustic_actors')} acoustic actor(s), up to {self.pools.get('vocoders')} vocoder(s))",
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
    """Actor pools from the cluster's resources: acoustic actors on every GPU share (else one
    per node with CPUs); vocoder actors up to one per CPU that the rest leaves."""
    import ray

    res = ray.cluster_resources()
    gpus, cpus = res.get("GPU", 0.0), res.get("CPU", 0.0)
    wants_gpu = cfg.device in ("auto", "cuda")
    num_gpus = cfg.num_gpus if cfg.num_gpus is not None else (0.5 if gpus and wants_gpu else 0.0)
    if cfg.device == "cuda" and num_gpus == 0:
        raise ValueError(
            f"--device cuda needs a GPU share per acoustic actor (--num-gpus); the cluster has {gpus:g} GPUs"
        )
    if num_gpus > 0 and gpus < num_gpus:
        raise ValueError(f"--num-gpus {num_gpus:g}: the cluster has {gpus:g} GPUs")
    if cfg.acoustic_actors:
        actors = cfg.acoustic_actors
    elif num_gpus > 0:
        actors = int(gpus / num_gpus + 1e-9)
    else:
        actors = sum(
            1 for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= cfg.acoustic_cpus
        )
    actors = max(1, actors)
    left = cpus - actors * cfg.acoustic_cpus - cfg.plan_cpus
    if left < cfg.vocoder_cpus - 1e-9:
        raise ValueError(
            f"{actors} acoustic actor(s) of {cfg.acoustic_cpus:g} CPU leave {max(left, 0):g} of the cluster's "
            f"{cpus:g} CPUs; a plan task and a vocoder need {cfg.plan_cpus + cfg.vocoder_cpus:g}: "
            "lower --acoustic-actors or --acoustic-cpus"
        )
    vocoders = cfg.vocoders or max(1, int(left))
    return Pools(actors, num_gpus, vocoders, cfg.group_rows(num_gpus > 0))


def checked_groups(
    ds, kind: InputFormat, cfg: BatchConfig, out: OutputDir, summary: BatchSummary, group_rows: int
) -> list[Group]:
    """Every input row in order, checked on the driver: refused rows go to the errors file, the
    others into groups of ``group_rows`` consecutive rows. Returns the groups to decode: those
    with a row neither written nor refused (for what it holds now) by an earlier run."""
    raws = [raw for batch in ds.iter_batches(batch_size=None, batch_format="pyarrow") for raw in raw_rows(batch, kind)]
    summary.rows = len(raws)
    counts = collections.Counter(row_id(raw) for raw in raws)
    # Ids whose file names differ only in case ("Utt1", "utt1") name one file on a
    # case-insensitive filesystem (macOS, Windows): one row's audio would be the other's.
    folded = collections.Counter(audio_stem(rid).casefold() for rid in counts if rid is not None)
    limits = cfg.segments.model_dump_json()
    items: list[Item] = []
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
        dump = row.model_dump()
        key = row_key(dump, limits)
        before = out.failed.get(row.id)
        items.append(
            Item(
                dump,
                key,
                done=row.id in out.done,
                failed=before["failed"] if before is not None and before["key"] == key else None,
            )
        )
    summary.skipped = sum(item.done for item in items)
    groups = [Group(k, items[i : i + group_rows]) for k, i in enumerate(range(0, len(items), group_rows))]
    todo = []
    for g in groups:
        if not all(item.settled for item in g.items):
            todo.append(g)  # its refused rows are planned again, and reported then
            continue
        for item in g.items:
            if item.failed is not None:
                out.error(item.row["id"], item.failed)
                summary.failed += 1
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

    from deployments.bulk.stages import AcousticStage, VocodeStage

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
            # Read in the input's order (groups are consecutive rows), before any actor holds CPUs.
            ctx.execution_options.preserve_order = True
            groups = checked_groups(read_input(cfg, kind), kind, cfg, out, summary, pools.group_rows)
            ctx.execution_options.preserve_order = False
            summary.groups = len(groups)
            say(
                f"batch: {summary.rows} rows: {summary.skipped} done before, {summary.failed} refused, "
                f"{len(groups)} group(s) of up to {pools.group_rows} rows to decode; {pools.acoustic_actors} acoustic "
                f"actor(s)"
                + (f" ({pools.num_gpus:g} GPU each)" if pools.gpu else "")
                + f", up to {pools.vocoders} vocoder(s)"
            )
            t_pipe = time.perf_counter()
            if groups:
                # One block per group: each plan task and each acoustic call takes one.
                source = ray.data.from_arrow(
                    [
                        pa.Table.from_pylist(
                            [{"group": pickle.dumps(g, protocol=pickle.HIGHEST_PROTOCOL)}], schema=GROUPS
                        )
                        for g in groups
                    ]
                )
                planned = source.map_batches(
                    plan_groups,
                    batch_format="pyarrow",
                    batch_size=1,
                    num_cpus=cfg.plan_cpus,
                    fn_kwargs={"limits": cfg.segments.model_dump_json()},
                )
                decoded = planned.map_batches(
                    AcousticStage,
                    batch_format="pyarrow",
                    batch_size=1,
                    num_cpus=cfg.acoustic_cpus,
                    **({"num_gpus": pools.num_gpus} if pools.gpu else {}),
                    fn_constructor_kwargs={
                        "model": cfg.acoustic_model(weights, pools.gpu).model_dump(),
                        "acoustic": cfg.acoustic_config(pools.gpu).model_dump(),
                    },
                    compute=ActorPoolStrategy(size=pools.acoustic_actors),
                )
                voiced = decoded.map_batches(
                    VocodeStage,
                    batch_format="pyarrow",
                    batch_size=cfg.vocode_rows,
                    num_cpus=cfg.vocoder_cpus,
                    fn_constructor_kwargs={
                        "model": cfg.vocoder_model(weights).model_dump(),
                        "vocoder": cfg.vocoder.model_dump(),
                    },
                    compute=ActorPoolStrategy(min_size=1, max_size=pools.vocoders),
                )
                keys = {item.row["id"]: item.key for g in groups for item in g.items}
                _write_all(voiced, out, summary, t_pipe, keys, on_row)
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
