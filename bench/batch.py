"""``python -m bench batch``: bulk synthesis (``chattts-serve batch``, 1 and 2 speech actors) and
the online service under closed-loop load, on one corpus, each alone on a local Ray of its own
(bench/README.md, "batch"). Target: bulk (1 actor) / the service's best level >= 1.2."""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from .lib.harness import Harness, ints, logger
from .lib.procs import isolate_environ
from .lib.report import TARGETS, Col, Doc, Kind, failed, fmt, target
from .lib.serve import add_app_arguments

_log = logger("batch")
TARGET = 1.2
# Speech actors -> (Ray CPUs, torch threads) each: 1 is the service's Acoustic replica's shape.
ACTOR_SHAPES = {1: (1.0, 2), 2: (0.5, 1)}


def corpus_rows(n: int, seed: int) -> list[dict]:
    from .lib.corpus import load_corpus

    texts = load_corpus()
    return [{"id": f"row-{i:05d}", "text": texts[i % len(texts)], "seed": seed * 100003 + i} for i in range(n)]


def bulk_phase(a: argparse.Namespace, actors: int, rows: list[dict]) -> dict[str, Any]:
    from deployments.bulk.config import BatchConfig
    from deployments.bulk.job import run_batch
    from serve_app.engine.config import WeightsConfig

    cpus, threads = ACTOR_SHAPES.get(actors, (1.0 / actors, 1))
    written: list[tuple[float, float, str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-batch-") as tmp:
        src = Path(tmp) / "in.jsonl"
        src.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        cfg = BatchConfig(
            input=str(src),
            out=str(Path(tmp) / "out"),
            weights=WeightsConfig(source=a.weights),
            device="cpu",
            num_cpus=a.ray_cpus,
            actors=actors,
            actor_cpus=cpus,
            actor_threads=threads,
            rows_per_call=a.rows_per_call,
        )
        t0 = time.perf_counter()
        summary = run_batch(
            cfg, progress=False, on_row=lambda rec: written.append((time.perf_counter(), rec["seconds"], rec["id"]))
        )
        wall = time.perf_counter() - t0
    g = summary.pools["call_rows"]
    ends: dict[int, float] = {}
    audio: dict[int, float] = {}
    for t, sec, rid in written:
        k = int(rid.removeprefix("row-")) // g  # every corpus row passes the checks: row i is in call i // g
        ends[k] = max(ends.get(k, 0.0), t)
        audio[k] = audio.get(k, 0.0) + sec
    first_wave = sorted(ends, key=ends.get)[:actors]  # the calls that finished first, one per actor
    later = [k for k in ends if k not in first_wave]
    t_wave = max(ends[k] for k in first_wave)
    steady = sum(audio[k] for k in later) / (max(ends.values()) - t_wave) if later else None
    out = {
        "actors": actors,
        "actor_cpus": cpus,
        "actor_threads": threads,
        "rows": summary.rows,
        "written": summary.written,
        "failed": summary.failed,
        "calls": summary.calls,
        "call_rows": summary.pools.get("call_rows"),
        "audio_s": round(summary.audio_seconds, 2),
        "wall_s": round(wall, 1),
        "pipeline_s": round(summary.pipeline_s, 1),
        "first_row_s": round(summary.first_row_s or 0.0, 1),
        "audio_s_per_s": round(steady, 4) if steady else None,
        "steady_calls": len(later),
        "audio_s_per_s_whole_run": round(summary.audio_seconds / wall, 4),
    }
    _log(
        f"bulk, {actors} speech actor(s): {out['audio_s_per_s']} audio s/s steady, {out['audio_s_per_s_whole_run']} "
        f"over the whole run ({out['audio_s']} s of audio, {out['wall_s']} s, first row after {out['first_row_s']} s)"
    )
    return out


def serve_phase(a: argparse.Namespace) -> dict[str, Any]:
    from .lib import loadgen
    from .lib.corpus import expected_audio_s, plan_corpus, text_stream
    from .lib.serve import ServeRunner, engine_delta

    runner = ServeRunner.from_args(a)
    res: dict[str, Any] = {"levels": {}}
    try:
        res["start_s"] = round(runner.start(), 1)
        target = loadgen.Target(runner.base_url, "serve", streaming=True, response_format="wav", timeout_s=600)
        asyncio.run(loadgen.closed_loop(target, 2, 0.01, iter(["你好。", "Hello there."]), max_requests=2))  # warm-up
        runner.wait_idle(60)
        expected = expected_audio_s(plan_corpus())
        for c in a.levels:
            before = runner.acoustic_stats()
            run = asyncio.run(
                loadgen.closed_loop(target, c, a.serve_s, text_stream(a.seed + c), expected, seed=a.seed + c)
            )
            s = loadgen.summarize(run)
            s["engine"] = engine_delta(before, runner.acoustic_stats())
            kept = ("concurrency", "duration_s", "completed", "errors", "cut", "audio_s_per_s", "ttfb_s", "latency_s")
            res["levels"][str(c)] = {k: s[k] for k in (*kept, "engine")}
            _log(
                f"service at {c} clients: {s['audio_s_per_s']} audio s/s ({s['completed']} done, {s['errors']} errors, "
                f"{s['engine'].get('mean_rows_per_step')} rows per step)"
            )
            runner.wait_idle(120)
    finally:
        runner.stop()
    return res


def targets(report: dict) -> dict:
    bulk = (report.get("bulk") or {}).get("1", {}).get("audio_s_per_s")
    levels = (report.get("serve") or {}).get("levels", {})
    best = max((lv["audio_s_per_s"] or 0 for lv in levels.values()), default=None)
    out: dict = {}
    if bulk and best:
        out["bulk (1 actor) / service best"] = target(round(bulk / best, 3), ">=", TARGET)
    two = (report.get("bulk") or {}).get("2", {}).get("audio_s_per_s")
    if bulk and two:
        out["bulk 2 actors / 1 actor"] = {"value": round(two / bulk, 3), "target": "(measured)", "met": None}
    return out


def _get(row: dict, key: str, before: str):
    """A bulk figure, under its earlier name in reports written before the speech actors."""
    return row.get(key, row.get(before))


BULK = [
    Col(
        "bulk: speech actors (CPUs / threads each)",
        lambda x: (
            f"{x[0]} ({_get(x[1], 'actor_cpus', 'acoustic_cpus'):g} / {_get(x[1], 'actor_threads', 'acoustic_threads')})"
        ),
    ),
    Col(
        "audio s/s, steady (calls)",
        lambda x: f"{fmt(x[1]['audio_s_per_s'], 3)} ({_get(x[1], 'steady_calls', 'steady_groups')})",
    ),
    Col("audio s/s, whole run", lambda x: x[1]["audio_s_per_s_whole_run"], nd=3),
    Col("audio (s)", lambda x: str(x[1]["audio_s"])),
    Col("wall (s)", lambda x: str(x[1]["wall_s"])),
    Col("first row after (s)", lambda x: str(x[1]["first_row_s"])),
    Col("calls x rows", lambda x: f"{_get(x[1], 'calls', 'groups')} x {_get(x[1], 'call_rows', 'group_rows')}"),
]
SERVICE = [
    Col("service: clients", 0),
    Col("audio s/s", lambda x: x[1]["audio_s_per_s"], nd=3),
    Col("TTFB p50 (s)", lambda x: x[1]["ttfb_s"].get("p50")),
    Col(
        "latency p50 / p99 (s)", lambda x: f"{fmt(x[1]['latency_s'].get('p50'))} / {fmt(x[1]['latency_s'].get('p99'))}"
    ),
    Col("done", lambda x: x[1]["completed"]),
    Col("errors", lambda x: x[1]["errors"]),
    Col("rows per step", lambda x: (x[1].get("engine") or {}).get("mean_rows_per_step")),
]


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Bulk synthesis against the service, {m['started']}", m["command"])
    doc.add(
        f"weights: {m['weights']}, {m['rows']} corpus rows per bulk run, {m['cpus']} CPUs, "
        f"load average at start {m['loadavg_start']}, at the end {m.get('loadavg_end')}",
        "",
    )
    if report.get("error"):
        doc.add(failed(report, " (the tables hold what was measured before)."), "")
    doc.table(BULK, (report.get("bulk") or {}).items(), before=())
    doc.table(SERVICE, ((report.get("serve") or {}).get("levels") or {}).items())
    doc.table(TARGETS, (report.get("targets") or {}).items())
    return doc


KIND = Kind("batch.json", to_doc)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_app_arguments(p)
    p.add_argument("--quick", action="store_true", help="96 rows in calls of 16, 30 s per service level")
    p.add_argument("--rows", type=int, default=None, help="corpus rows per bulk run (default 192; quick 96)")
    calls = "bulk rows per actor call (default: the command's, 16 on CPU): the steady state needs a few per actor"
    p.add_argument("--rows-per-call", type=int, default=None, help=calls)
    p.add_argument("--actors", type=ints, default=[1, 2], help="speech actors of each bulk run, comma list")
    p.add_argument("--levels", type=ints, default=[4, 8], help="the service's closed-loop clients, comma list")
    p.add_argument("--serve-s", type=float, default=None, help="seconds per service level (default 90; quick 30)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write batch.json and report.md here")


def main(a: argparse.Namespace) -> int:
    isolate_environ()  # the weights are --weights; every Ray is this run's own
    a.rows = a.rows or (96 if a.quick else 192)
    a.rows_per_call = a.rows_per_call or (16 if a.quick else None)
    a.serve_s = a.serve_s or (30.0 if a.quick else 90.0)
    meta = dict(weights=a.weights, rows=a.rows, levels=a.levels, serve_s=a.serve_s)
    harness = Harness(Path(a.out) if a.out else None, KIND.write, a.argv, **meta)
    report = harness.report
    with harness:
        rows = corpus_rows(a.rows, a.seed)
        report["bulk"] = {}
        for n in a.actors:
            report["bulk"][str(n)] = bulk_phase(a, n, rows)
            harness.write()
        report["serve"] = serve_phase(a)
        report["targets"] = targets(report)
    print(KIND.markdown(report))
    return 0
