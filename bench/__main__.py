"""``python -m bench run [--quick] [--out DIR]``: the whole benchmark in one go (see bench/README.md).

``python -m bench compare DIR...``: one table of several runs' key numbers (for tuning).
``python -m bench gpu --out DIR [--dry-run]``: the one-command GPU check (bench/gpu.py).
``python -m bench autoscale --out DIR``: step load on a local multi-node cluster (bench/autoscale.py).
``python -m bench realtime [--weights random-tiny] [--out DIR]``: WebSocket sessions fed like an LLM writes (bench/realtime.py).
``python -m bench.baseline`` / ``python -m bench.ceiling``: the baseline server / the ceiling alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path
from typing import Optional

import yaml


def _floats(s: str) -> list[float]:
    return [float(x) for x in s.split(",") if x.strip()]


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench", description="chattts-serve benchmarks")
    sub = ap.add_subparsers(dest="cmd", required=True)

    r = sub.add_parser("run", help="ceiling, baseline and the project under load; writes report.json/.md/.png")
    r.add_argument("--quick", action="store_true", help="short run (< 10 min on 2 cores): c1 and c8, ceiling b1/b8, open loop at 70%%")
    r.add_argument("--out", default=None, help="output directory (default bench/results/tmp-<date-time>, git-ignored)")
    r.add_argument("--weights", default="random", choices=["random", "random-tiny"],
                   help="random = full-size ChatTTS with random weights (the benchmark); random-tiny only checks the tooling")
    r.add_argument("--phases", default=",".join(("ceiling", "baseline", "serve", "open")),
                   help="comma list of ceiling,baseline,serve,open (default all)")
    r.add_argument("--levels", type=_ints, help="closed-loop concurrencies for baseline and project, e.g. 1,2,4,8,16")
    r.add_argument("--baseline-levels", type=_ints)
    r.add_argument("--serve-levels", type=_ints)
    r.add_argument("--loads", type=_floats, help="open-loop loads (fractions of capacity), continuous batching")
    r.add_argument("--window-loads", type=_floats, help="open-loop loads for window batching")
    r.add_argument("--duration-scale", type=float, default=1.0, help="multiply every closed/open phase's duration")
    r.add_argument("--open-s", type=float, help="open-loop arrival period per load point (s)")
    r.add_argument("--timeout-s", type=float, help="per-request timeout")
    r.add_argument("--ceiling-batches", type=_ints)
    r.add_argument("--ceiling-reps", type=int)
    r.add_argument("--ceiling-tokens", type=int, help="tokens per row in the ceiling (default: corpus mean segment)")
    r.add_argument("--baseline-threads", type=int, help="torch threads of the baseline (default: torch's, all cores)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--front-door", default="proxy", choices=["proxy", "haproxy"],
                   help="HTTP front door of the project: Serve's proxy, or Ray's HAProxy (RAY_SERVE_ENABLE_HA_PROXY)")
    r.add_argument("--profile", action="store_true", help="py-spy the Acoustic/Vocoder/Ingress replicas during one closed-loop phase")
    r.add_argument("--profile-level", type=int, default=8, help="the closed-loop concurrency to profile (default 8)")
    r.add_argument("--no-progress", action="store_true")
    g = r.add_argument_group("project deployment (overrides of the Serve config)")
    g.add_argument("--config", help="Serve config file (default config/serve.yaml)")
    g.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="any config value by dotted path, e.g. applications.chattts.deployments.Acoustic.max_ongoing_requests=64 "
                        "(list items by name; VALUE is YAML)")
    g.add_argument("--ray-cpus", type=float, help="CPUs Ray may schedule (default: os.cpu_count())")
    g.add_argument("--acoustic-cpus", type=float)
    g.add_argument("--vocoder-cpus", type=float)
    g.add_argument("--ingress-cpus", type=float)
    g.add_argument("--normalizer-cpus", type=float)
    g.add_argument("--acoustic-threads", type=int, help="OMP/MKL threads (torch intra-op) of the Acoustic replicas")
    g.add_argument("--vocoder-threads", type=int, help="OMP/MKL threads of the Vocoder replicas")
    g.add_argument("--torch-threads", type=int, help="args.model.torch_threads (torch.set_num_threads in every model stage)")
    g.add_argument("--acoustic-replicas", type=int, help="fixed Acoustic replica count (autoscaling off)")
    g.add_argument("--vocoder-replicas", type=int, help="fixed Vocoder replica count (autoscaling off)")
    g.add_argument("--max-batch-size", type=int, help="Acoustic user_config.max_batch_size (@serve.batch)")
    g.add_argument("--batch-wait-s", type=float, help="Acoustic user_config.batch_wait_timeout_s")
    g.add_argument("--max-ongoing", type=int, help="Acoustic max_ongoing_requests")
    g.add_argument("--max-rows", type=int, help="args.acoustic.max_rows (rows decoded together)")
    g.add_argument("--first-chunk-tokens", type=int, help="args.acoustic.first_chunk_tokens")
    g.add_argument("--chunk-tokens", type=int, help="args.acoustic.chunk_tokens")

    c = sub.add_parser("compare", help="key numbers of several runs side by side (markdown)")
    c.add_argument("dirs", nargs="+")

    from .gpu import add_parser as add_gpu_parser

    add_gpu_parser(sub)
    from .realtime import add_parser as add_realtime_parser

    add_realtime_parser(sub)
    from .autoscale import add_parser as add_autoscale_parser

    add_autoscale_parser(sub)
    return ap


def serve_config(a: argparse.Namespace, port: int) -> tuple[dict, dict]:
    from .serve_runner import (apply_overrides, args_path, deployment_path, load_config, set_path, set_replicas,
                               set_threads)

    base = load_config(a.config)
    overrides: dict = {}
    for item in a.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set needs PATH=VALUE, got {item!r}")
        overrides[key.strip()] = yaml.safe_load(value)
    cfg = apply_overrides(base, weights=a.weights, port=port, overrides=overrides)
    shown = dict(overrides)
    args = args_path(cfg)

    def dep(name: str, rest: str, value) -> None:
        set_path(cfg, f"{deployment_path(cfg, name)}.{rest}", value)
        shown[f"{name}.{rest}"] = value

    for flag, name in (("acoustic_cpus", "Acoustic"), ("vocoder_cpus", "Vocoder"), ("ingress_cpus", "Ingress"),
                       ("normalizer_cpus", "TextNormalizer")):
        if getattr(a, flag) is not None:
            dep(name, "ray_actor_options.num_cpus", getattr(a, flag))
    if a.acoustic_threads:
        set_threads(cfg, "Acoustic", a.acoustic_threads)
        shown["Acoustic.threads"] = a.acoustic_threads
    if a.vocoder_threads:
        set_threads(cfg, "Vocoder", a.vocoder_threads)
        shown["Vocoder.threads"] = a.vocoder_threads
    if a.acoustic_replicas:
        set_replicas(cfg, "Acoustic", a.acoustic_replicas)
        shown["Acoustic.replicas"] = a.acoustic_replicas
    if a.vocoder_replicas:
        set_replicas(cfg, "Vocoder", a.vocoder_replicas)
        shown["Vocoder.replicas"] = a.vocoder_replicas
    if a.max_batch_size is not None:
        dep("Acoustic", "user_config.max_batch_size", a.max_batch_size)
    if a.batch_wait_s is not None:
        dep("Acoustic", "user_config.batch_wait_timeout_s", a.batch_wait_s)
    if a.max_ongoing is not None:
        dep("Acoustic", "max_ongoing_requests", a.max_ongoing)
    for flag in ("max_rows", "first_chunk_tokens", "chunk_tokens"):
        if getattr(a, flag) is not None:
            set_path(cfg, f"{args}.acoustic.{flag}", getattr(a, flag))
            shown[f"acoustic.{flag}"] = getattr(a, flag)
    if a.torch_threads is not None:
        set_path(cfg, f"{args}.model.torch_threads", a.torch_threads)
        shown["model.torch_threads"] = a.torch_threads
    return cfg, shown


# Command-line option -> RunPlan field it overrides.
_PLAN_OPTIONS = {
    "baseline_levels": "baseline_levels", "serve_levels": "serve_levels", "loads": "loads_continuous",
    "window_loads": "loads_window", "open_s": "open_s", "timeout_s": "timeout_s",
    "ceiling_batches": "ceiling_batches", "ceiling_reps": "ceiling_reps", "ceiling_tokens": "ceiling_tokens",
    "baseline_threads": "baseline_threads",
}


def cmd_run(a: argparse.Namespace) -> int:
    from .procs import free_port
    from .runner import PHASES, BenchRun, RunPlan

    phases = tuple(x.strip() for x in a.phases.split(",") if x.strip())
    bad = [x for x in phases if x not in PHASES]
    if bad:
        raise SystemExit(f"unknown phase(s) {bad}; choose from {PHASES}")
    kw: dict = {"weights": a.weights, "phases": phases, "seed": a.seed, "front_door": a.front_door}
    plan = RunPlan.quick_plan(**kw) if a.quick else RunPlan(**kw)
    if a.levels:
        plan.baseline_levels = plan.serve_levels = a.levels
    for option, plan_field in _PLAN_OPTIONS.items():
        value = getattr(a, option)
        # Load lists may be given empty (no open-loop points); other options only when set.
        if value is not None if option in ("loads", "window_loads") else value:
            setattr(plan, plan_field, value)
    plan.profile, plan.profile_level = a.profile, a.profile_level
    if a.duration_scale != 1.0:
        plan.closed_s = {k: v * a.duration_scale for k, v in plan.closed_s.items()}
        plan.open_s *= a.duration_scale
    if "8" not in map(str, plan.ceiling_batches) and "ceiling" in phases:
        plan.ceiling_batches = sorted(set(plan.ceiling_batches) | {8})
    cfg, shown = serve_config(a, free_port())
    if a.out is None:
        import time

        a.out = str(Path(__file__).parent / "results" / time.strftime("tmp-%Y%m%d-%H%M%S"))
    out = Path(a.out)
    command = "python -m bench " + " ".join(shlex.quote(x) for x in sys.argv[1:])
    run = BenchRun(plan, out, cfg, shown, a.ray_cpus, command, show_progress=not a.no_progress)
    try:
        report = run.run()
    except KeyboardInterrupt:
        print(f"\ninterrupted; everything started was stopped; partial report in {out}/", file=sys.stderr)
        return 130
    print(f"\nreport: {out}/report.json, report.md, report.png (wall {report['meta']['wall_s']} s)")
    for name, t in report["targets"].items():
        flag = {True: "ok  ", False: "MISS", None: "n/a "}[t["met"]]
        print(f"  [{flag}] {name} = {t['value']} (target {t['target']})")
    return 0


def cmd_compare(a: argparse.Namespace) -> int:
    from .report import TARGETS, _get

    rows = []
    for d in a.dirs:
        p = Path(d) / "report.json"
        if not p.exists():
            print(f"skip {d}: no report.json", file=sys.stderr)
            continue
        r = json.loads(p.read_text())
        ov = _get(r, "serve", "overrides") or {}
        s8 = _get(r, "serve", "closed", "8") or {}
        s1 = _get(r, "serve", "closed", "1") or {}
        rows.append([
            Path(d).name,
            ", ".join(f"{k}={v}" for k, v in ov.items()) or "(config defaults)",
            s8.get("audio_s_per_s"), _get(s8, "latency_s", "p99"), _get(s8, "engine", "mean_rows_per_step"),
            _get(s1, "ttfb_s", "p50"),
            *[(r.get("ratios") or {}).get(k) for k in TARGETS],
            (r.get("meta") or {}).get("loadavg_start"),
        ])
    head = ["run", "overrides", "c8 audio s/s", "c8 p99 s", "c8 mean batch", "c1 TTFB p50", *TARGETS, "loadavg"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join("–" if v is None else (f"{v:.3f}" if isinstance(v, float) else str(v)) for v in row) + " |")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    a = build_parser().parse_args(argv)
    if a.cmd == "run":
        return cmd_run(a)
    if a.cmd == "gpu":
        from .gpu import cmd_gpu

        return cmd_gpu(a)
    if a.cmd == "realtime":
        from .realtime import cmd_realtime

        return cmd_realtime(a)
    if a.cmd == "autoscale":
        from .autoscale import cmd_autoscale

        return cmd_autoscale(a)
    return cmd_compare(a)


if __name__ == "__main__":
    sys.exit(main())
