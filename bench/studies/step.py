"""The decode step: how much of it is the GPT, and what int8 buys end to end.

For each weight size (``random-tiny``: a 1-layer GPT, where what surrounds the model weighs
most; ``random``: full size) and batch size, one engine decodes ``--tokens`` tokens per row and
every step is timed twice: the whole step (admission, forward, sampling, bookkeeping, chunk
emission) and the GPT forward inside it (``AcousticEngine._forward``). The non-GPT share is what
a GPU step would still pay on the host once the GPT takes a few milliseconds.

* ``--variants fp32,int8`` (full size): the GPT's linear layers swapped in place between the
  float32 layout the CPU ships (dual layout) and int8 (``model.quantize: int8``), steps
  interleaved in one process, so the ratio shares the machine's load;
* ``--against REV``: the same measurement of another git revision (a temporary worktree, in a
  subprocess: its ``serve_app``, this bench), in the same run, for before/after.

    python -m bench step --out bench/results/step-DATE [--against REV] [--sizes random-tiny,random]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from ..lib.harness import command_line, git_revision, ints, logger, now
from ..lib.procs import REPO_ROOT
from ..lib.report import Col, Doc, Figure, Kind, Panel, bars, fmt
from ..lib.stats import median

_log = logger("step")
TEXT = "The quick brown fox jumps over the lazy dog near the river bank today."


# ---------------------------------------------------------------------------------- worker


def measure(weights: str, batches: list[int], tokens: int, reps: int, variants: list[str]) -> dict:
    """In this process, with whatever ``serve_app`` is importable: per variant and batch, the
    median over ``reps`` runs of ms per step and ms of GPT forward per step."""
    import torch

    import serve_app
    from serve_app.engine.acoustic import AcousticConfig, AcousticEngine
    from serve_app.engine.config import ModelConfig, SegmentConfig, WeightsConfig
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions
    from serve_app.engine.weights.loading import load_model

    torch.set_grad_enabled(False)
    _log(f"serve_app from {Path(serve_app.__file__).parent.parent.name}")
    # Float layers (int8 is swapped in where measured): the same baseline in any revision.
    quantize = {"quantize": "none"} if "quantize" in ModelConfig.model_fields else {}
    model = load_model(ModelConfig(weights=WeightsConfig(source=weights), torch_threads=1, **quantize))
    planner = Planner(SegmentConfig())
    planner.warmup()
    seg = planner.plan(TEXT, SynthesisOptions()).segments[0]
    swap = None
    if variants != ["fp32"]:
        from .numerics import LinearVariants

        swap = LinearVariants(model.chat.gpt.gpt)

    def run(n: int) -> tuple[float, float]:
        eng = AcousticEngine(model, AcousticConfig(max_rows=max(16, n), token_budget=1 << 20))
        forward = [0.0]
        inner = eng._forward

        def timed(last: Any) -> Any:
            t = time.perf_counter()
            out = inner(last)
            forward[0] += time.perf_counter() - t
            return out

        eng._forward = timed
        for i in range(n):
            eng.submit(
                dataclasses.replace(
                    seg, max_new_tokens=tokens, min_new_tokens=tokens, target_tokens=tokens, seed=1000 + i
                )
            )
        eng.step()  # admission and the first step stay out
        s0, f0, t0 = eng.stats.steps, forward[0], time.perf_counter()
        eng.run_until_idle()
        steps = eng.stats.steps - s0
        return (time.perf_counter() - t0) / steps * 1e3, (forward[0] - f0) / steps * 1e3

    out: dict = {"weights": weights, "torch_threads": torch.get_num_threads(), "batches": {}}
    for n in batches:
        samples: dict[str, list] = {v: [] for v in variants}
        for v in variants:  # a warm run each
            if swap is not None:
                swap.install("fp32-dual" if v == "fp32" else v)
            run(n)
        for _ in range(reps):
            for v in variants:  # interleaved: the variants share the machine's load
                if swap is not None:
                    swap.install("fp32-dual" if v == "fp32" else v)
                samples[v].append(run(n))
        row = {}
        for v, runs in samples.items():
            step_ms, fwd_ms = median([r[0] for r in runs]), median([r[1] for r in runs])
            row[v] = {
                "step_ms": step_ms,
                "forward_ms": fwd_ms,
                "non_gpt_pct": 100 * (1 - fwd_ms / step_ms),
                "tokens_per_s": n * 1e3 / step_ms,
                "forward_tokens_per_s": n * 1e3 / fwd_ms,
                "runs": [{"step_ms": a, "forward_ms": b} for a, b in runs],
            }
            _log(
                f"{weights} {v} batch {n}: step {step_ms:.2f} ms, GPT {fwd_ms:.2f} ms, non-GPT {row[v]['non_gpt_pct']:.0f}%"
            )
        if "int8" in row and "fp32" in row:
            row["int8_speedup"] = row["int8"]["tokens_per_s"] / row["fp32"]["tokens_per_s"]
            row["int8_gpt_speedup"] = row["int8"]["forward_tokens_per_s"] / row["fp32"]["forward_tokens_per_s"]
        out["batches"][str(n)] = row
    return out


def worker_main(args: argparse.Namespace) -> int:
    res = measure(args.weights, args.batches, args.tokens, args.reps, args.variants.split(","))
    Path(args.json).write_text(json.dumps(res))
    return 0


def run_tree(tree: Optional[Path], weights: str, a: argparse.Namespace, variants: str) -> dict:
    """``measure`` in a subprocess whose ``serve_app`` comes from ``tree`` (None: this checkout)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "step.json"
        # This bench first (both trees have a ``bench``), then the tree first for ``serve_app``.
        code = (
            "import sys; sys.path.insert(0, sys.argv[2]); import bench.studies.step as s; sys.path.insert(0, sys.argv[1]); "
            "sys.exit(s.cli_worker(sys.argv[3:]))"
        )
        argv = [
            sys.executable,
            "-c",
            code,
            str(tree or REPO_ROOT),
            str(REPO_ROOT),
            "--weights",
            weights,
            "--batches",
            ",".join(map(str, a.batches)),
            "--tokens",
            str(a.tokens),
            "--reps",
            str(a.reps),
            "--variants",
            variants,
            "--json",
            str(out),
        ]
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        subprocess.run(argv, check=True, env=env, cwd=str(tree or REPO_ROOT))
        return json.loads(out.read_text())


def cli_worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", required=True)
    ap.add_argument("--batches", type=ints, required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--reps", type=int, required=True)
    ap.add_argument("--variants", required=True)
    ap.add_argument("--json", required=True)
    return worker_main(ap.parse_args(argv))


# ---------------------------------------------------------------------------------- report


STEP_COLUMNS = [
    Col("weights", 0),
    Col("variant", 2),
    Col("batch", 1, right=True),
    Col("step ms", lambda x: x[3]["step_ms"], right=True),
    Col("GPT ms", lambda x: x[3]["forward_ms"], right=True),
    Col("non-GPT %", lambda x: x[3]["non_gpt_pct"], nd=0, right=True),
    Col("engine tok/s", lambda x: x[3]["tokens_per_s"], nd=1, right=True),
    Col("GPT tok/s", lambda x: x[3]["forward_tokens_per_s"], nd=1, right=True),
    Col("engine / GPT", lambda x: x[3]["tokens_per_s"] / x[3]["forward_tokens_per_s"], right=True),
]
INT8_COLUMNS = [
    Col("weights", 0),
    Col("batch", 1, right=True),
    Col("engine", lambda x: f"{fmt(x[2]['int8_speedup'])}x", right=True),
    Col("GPT forward", lambda x: f"{fmt(x[2]['int8_gpt_speedup'])}x", right=True),
]
SPEEDUP_COLUMNS = [
    Col("weights", 0),
    Col("batch", 1, right=True),
    Col("step time, before / after", lambda x: f"{fmt(x[2])}x", right=True),
]


def to_doc(r: dict) -> Doc:
    doc = Doc(f"Decode step ({r['revision']}, {r['started']})", r["command"], end="")
    doc.add(
        "Per step, median of the runs: the whole step, the GPT forward inside it, the rest's share, "
        "and tokens per second of the engine against the bare forward's rate (target: the engine within "
        "15 % of the forward at full size, batch 1 and 8).",
        "",
    )
    for tree_name, trees in (
        ("this revision", r["current"]),
        (f"against {r.get('against')}", r.get("against_results")),
    ):
        if not trees:
            continue
        rows = [
            (res["weights"], b, v, m)
            for res in trees
            for b, row in res["batches"].items()
            for v, m in row.items()
            if isinstance(m, dict)
        ]
        doc.table(STEP_COLUMNS, rows, before=(f"## {tree_name}", "")).add("")
        int8 = [(res["weights"], b, row) for res in trees for b, row in res["batches"].items() if "int8_speedup" in row]
        if int8:
            head = "int8 / float32 (dual layout), interleaved in one process (target >= 2x engine tokens/s):"
            doc.table(INT8_COLUMNS, int8, before=(head, "")).add("")
    if r.get("speedup"):
        doc.table(SPEEDUP_COLUMNS, r["speedup"], before=("## this revision against the other", "")).add("")
    return doc


def to_figure(r: dict) -> Figure:
    trees = [("now", r["current"])] + ([("before", r["against_results"])] if r.get("against_results") else [])
    weights = [res["weights"] for res in r["current"]]
    panels = []
    for w in weights:
        labels, gpt, rest = [], [], []
        for name, results in trees:
            res = next((x for x in results if x["weights"] == w), None)
            for b, row in (res or {"batches": {}})["batches"].items():
                m = row.get("fp32")
                labels.append(f"{name}\nB={b}")
                gpt.append(m["forward_ms"])
                rest.append(m["step_ms"] - m["forward_ms"])
        p = Panel(f"{w}: ms per decode step (float32)", grid=None, tick_size=7, legend={"fontsize": 7})
        panels.append(p.add(bars(labels, gpt, "GPT forward"), bars(labels, rest, "rest of the step", bottom=gpt)))
    return Figure(panels, shape=(1, len(weights)), size=(5 * len(weights), 3.6))


KIND = Kind("report.json", to_doc, to_figure)


# ---------------------------------------------------------------------------------- main


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=None, help="report directory (default bench/results/step-<time>)")
    ap.add_argument("--sizes", default="random-tiny,random", help="weights sources, comma-separated")
    ap.add_argument("--batches", type=ints, default=[1, 8, 16])
    ap.add_argument("--tokens", type=int, default=60, help="tokens per row")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--int8", choices=["on", "off"], default="on", help="full size: int8 against float32 too")
    ap.add_argument("--against", default=None, help="a git revision measured too, in the same run")


def main(a: argparse.Namespace) -> int:
    out = a.out or REPO_ROOT / "bench" / "results" / f"step-{time.strftime('%Y-%m-%d-%H%M')}"
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": now(),
        "revision": git_revision(),
        "command": command_line(a.argv, out),
        "current": [],
        "against": a.against,
    }
    sizes = [s for s in a.sizes.split(",") if s]

    def variants(w: str) -> str:
        return "fp32,int8" if a.int8 == "on" and w == "random" else "fp32"

    worktree = None
    try:
        if a.against:
            worktree = Path(tempfile.mkdtemp(prefix="bench-step-")) / "tree"
            subprocess.run(
                ["git", "worktree", "add", "--detach", "-q", str(worktree), a.against], check=True, cwd=REPO_ROOT
            )
            report["against_results"] = []
        for w in sizes:
            if worktree is not None:
                _log(f"{w}: revision {a.against}")
                report["against_results"].append(run_tree(worktree, w, a, "fp32"))
            _log(f"{w}: this revision")
            report["current"].append(run_tree(None, w, a, variants(w)))
    finally:
        if worktree is not None:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO_ROOT)
    if report.get("against_results"):
        report["speedup"] = [
            (cur["weights"], b, old["batches"][b]["fp32"]["step_ms"] / row["fp32"]["step_ms"])
            for cur, old in zip(report["current"], report["against_results"])
            for b, row in cur["batches"].items()
        ]
    KIND.write(report, out)
    print(KIND.markdown(report))
    return 0
