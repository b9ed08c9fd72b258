"""``python -m bench gpu --out DIR``: the whole GPU check in one command (bench/README.md, "GPU check").

A GPU machine is lent rarely and briefly, so one command does everything, in this order, each
step independent of the others (a step that fails or runs out of time is recorded and the next
one runs), under one deadline (default 8 min) after which it stops and still writes its report:

1. ``tests``: ``pytest -m gpu`` (tests/system/test_gpu.py: tokens vs the CPU float32 decode, streamed vs
   one-shot audio, KV memory freed) in a subprocess; its JUnit XML goes into the report.
2. ``ceiling``: the engine alone (bench/ceiling.py's ``Ceiling``, in a subprocess) on random
   full-size weights in bfloat16 on cuda: audio seconds per second, decode step time and peak GPU
   memory at batch 1/8/32/64, and the time to the first chunk's audio at batch 1.
3. ``serve_2x0.5`` / ``serve_1x1``: config/serve.gpu.yaml on random full-size weights
   (bench/lib/serve.py), closed loops at 1, 16 and 64 clients (bench/lib/loadgen.py): two Acoustic
   replicas at ``num_gpus: 0.5``, then one at ``num_gpus: 1`` given the same decode slots.

``--dry-run`` runs every step on CPU with random-tiny weights and tiny sizes, so the script itself
is tested where there is no GPU. The report is rewritten after every step (report.json, .md, .png),
so a machine taken away mid-run still leaves the steps done so far. The ceiling step's process is
``python -m bench gpu-ceiling`` (``ceiling_worker`` below).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .lib.harness import Harness, command_line, ints, logger
from .lib.procs import REPO_ROOT, bench_command, free_port, run_to_end
from .lib.render import (by_clients, fmt as _f, get as _get, log2_panel, pyplot, render_files, save, seconds_vs_clients,
                         write_files, write_json)
from .lib.sampler import GpuSampler
from .lib.serve import GPU_CONFIG

STEPS = ("tests", "ceiling", "serve_2x0.5", "serve_1x1")
# name -> (Acoustic replicas, num_gpus each). The single replica gets the decode slots of both.
SERVE_VARIANTS = {"serve_2x0.5": (2, 0.5), "serve_1x1": (1, 1.0)}


@dataclass
class GpuPlan:
    dry_run: bool = False
    weights: str = "random"
    device: str = "cuda"
    dtype: str = "bfloat16"
    steps: tuple = STEPS
    deadline_s: float = 480.0
    tests_timeout_s: float = 100.0
    tests_filter: str = "cuda"  # pytest -k: the CPU pairs already run in CI
    ceiling_batches: list = field(default_factory=lambda: [1, 8, 32, 64])
    ceiling_reps: int = 1
    first_chunk_reps: int = 3
    ceiling_timeout_s: float = 150.0  # the first run on a machine also builds the random weights
    ceiling_threads: Optional[int] = None  # torch's default: all cores
    serve_levels: list = field(default_factory=lambda: [1, 16, 64])
    level_s: float = 20.0
    min_level_s: float = 8.0
    vocoder_replicas: int = 4  # fixed (no autoscaling mid-phase): 4 x 2 CPUs of the box's 16
    ray_cpus: Optional[float] = None
    request_timeout_s: float = 120.0
    texts: Optional[tuple] = None  # request texts (None: bench/corpus.txt)
    config: str = GPU_CONFIG.relative_to(REPO_ROOT).as_posix()  # from the repository root

    @classmethod
    def dry(cls, **kw) -> "GpuPlan":
        # The tests step checks its own plumbing on one test's cases (CI runs the CPU pairs anyway).
        base = dict(dry_run=True, weights="random-tiny", device="cpu", tests_filter="same_tokens", tests_timeout_s=240.0,
                    ceiling_batches=[1, 2], first_chunk_reps=1, ceiling_timeout_s=120.0, ceiling_threads=1,
                    serve_levels=[1, 2],
                    level_s=4.0, min_level_s=2.0, vocoder_replicas=1,
                    # Short texts: a tiny model on 2 busy cores still completes requests in 4 s.
                    texts=("你好。", "Hello there.", "好的，谢谢。", "Thanks a lot."),
                    # Logical CPUs as on the GPU box, so the config's CPU requests fit on 2 cores.
                    ray_cpus=16.0)
        base.update(kw)
        return cls(**base)


class Deadline:
    def __init__(self, total_s: float):
        self.total_s = total_s
        self.t0 = time.monotonic()

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.t0)


_log = logger("gpu")


# ------------------------------------------------------------------ step 1: pytest -m gpu


def parse_junit(path: Path) -> dict:
    """Summary and cases of a pytest JUnit XML file (with the tests' recorded properties)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    cases = []
    for suite in suites:
        for tc in suite.iter("testcase"):
            outcome, message = "passed", None
            for kind in ("failure", "error", "skipped"):
                el = tc.find(kind)
                if el is not None:
                    outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                    message = (el.get("message") or el.text or "").strip()[:2000]
                    break
            props = {p.get("name"): p.get("value") for p in tc.iter("property")}
            cases.append({"name": tc.get("name"), "file": tc.get("classname"), "outcome": outcome,
                          "time_s": round(float(tc.get("time") or 0), 3), "message": message, "properties": props})
    summary = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    summary["errors"] = summary.pop("error")
    summary["total"] = len(cases)
    return {"summary": summary, "cases": cases}


def run_tests(plan: GpuPlan, out: Path, budget_s: float) -> dict:
    xml = out / "pytest.xml"
    # A test module that cannot be imported (a package missing on a bare GPU machine) is reported
    # as an error case; the gpu tests elsewhere still run.
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-p", "no:cacheprovider", "-q", "-rs",
            "--continue-on-collection-errors", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
    if plan.tests_filter:
        argv += ["-k", plan.tests_filter]
    rc, log_tail = run_to_end("tests", argv, out / "pytest.log", timeout_s=budget_s)
    result: dict[str, Any] = {"command": command_line(argv[1:], out, prefix=""), "rc": rc, "timed_out": rc is None}
    if xml.exists():
        result.update(parse_junit(xml))
    if rc is None:
        raise PartialResult(result, f"pytest still running after {budget_s:.0f}s (killed)")
    if rc not in (0, 1) or not xml.exists():  # 1: some test failed (recorded case by case)
        raise PartialResult(result, exited("pytest", rc, log_tail))
    if rc == 1:
        failed = [c["name"] for c in result["cases"] if c["outcome"] in ("failed", "error")]
        raise PartialResult(result, f"{len(failed)} test(s) failed: {', '.join(failed)}")
    return result


# ------------------------------------------------------------------ step 2: the ceiling


def add_worker_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--device", required=True)
    ap.add_argument("--dtype", required=True)
    ap.add_argument("--batches", type=ints, required=True)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--first-chunk-reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--args", default="{}", help="the Serve config's args (segments, acoustic, vocoder)")


def ceiling_worker(a: argparse.Namespace) -> int:
    """``python -m bench gpu-ceiling``, in a subprocess of its own (the GPU is released when it
    exits): bench/ceiling.py's engine throughput with the step time and peak GPU memory per
    batch, then the first chunk alone. Writes its JSON after every batch, so a run stopped by the
    deadline keeps what it measured."""
    import torch

    from .ceiling import Ceiling

    args = json.loads(a.args)
    acoustic = args.get("acoustic") or {}
    t0 = time.perf_counter()
    c = Ceiling(a.weights, a.threads, args.get("segments") or {}, int(acoustic.get("first_chunk_tokens", 12)),
                int(acoustic.get("chunk_tokens", 24)), args.get("vocoder") or {}, device=a.device, dtype=a.dtype)
    cuda = c.model.device.type == "cuda"
    tokens = c.mean_tokens
    res: dict[str, Any] = {
        "device": str(c.model.device), "dtype": a.dtype, "weights": c.model.weights.kind, "tokens_per_row": tokens,
        "torch_threads": c.threads, "load_s": round(time.perf_counter() - t0, 1), "batches": {},
        "gpu_name": torch.cuda.get_device_name() if cuda else None,
        "weights_gpu_mib": round(torch.cuda.memory_allocated() / 2**20, 1) if cuda else None,
    }
    path = Path(a.out)

    def run_measured(n: int, tokens: int) -> dict:
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        r = c.run_engine(n, tokens)
        r["peak_gpu_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None
        return r

    write_json(res, path)
    c.run_engine(2, 8)  # warm-up (kernels, allocator)
    res["first_chunk"] = c.first_chunk(a.first_chunk_reps)
    write_json(res, path)
    for n in a.batches:
        best, runs = c.best_of(run_measured, n, tokens, a.reps, "engine")
        res["batches"][str(n)] = {
            "batch": n,
            "audio_s_per_s": round(best["audio_s_per_s"], 4),
            "audio_s_per_s_runs": [round(r["audio_s_per_s"], 4) for r in runs],
            "wall_s": round(best["wall_s"], 3),
            "decode_s": round(best["decode_s"], 3),
            "prefill_s": round(best["prefill_s"], 3),
            "steps": best["steps"],
            "step_ms": round(1000 * best["decode_s"] / best["steps"], 3) if best["steps"] else None,
            "mean_rows": round(best["mean_rows"], 2),
            "audio_s": round(best["audio_s"], 2),
            "peak_gpu_mib": best["peak_gpu_mib"],
        }
        print(f"[ceiling] batch {n}: {res['batches'][str(n)]}", flush=True)
        write_json(res, path)
    return 0


def run_ceiling(plan: GpuPlan, out: Path, serve_args: dict, budget_s: float) -> dict:
    path = out / "ceiling.json"
    argv = bench_command("gpu-ceiling", "--out", str(path), "--weights", plan.weights,
                         "--device", plan.device, "--dtype", plan.dtype,
                         "--batches", ",".join(map(str, plan.ceiling_batches)), "--reps", str(plan.ceiling_reps),
                         "--first-chunk-reps", str(plan.first_chunk_reps), "--args", json.dumps(serve_args))
    if plan.ceiling_threads:
        argv += ["--threads", str(plan.ceiling_threads)]
    rc, log_tail = run_to_end("ceiling", argv, out / "ceiling.log", timeout_s=budget_s)
    result = json.loads(path.read_text()) if path.exists() else {}
    missing = [n for n in plan.ceiling_batches if str(n) not in result.get("batches", {})]
    if rc is None:
        raise PartialResult(result, f"ceiling still running after {budget_s:.0f}s (killed); not measured: batch {missing}")
    if rc != 0 or missing or "first_chunk" not in result:
        raise PartialResult(result, exited("ceiling", rc, log_tail))
    return result


def exited(what: str, rc: Optional[int], log_tail: str) -> str:
    """'<what> exited <rc>: <its last log line>', then the log's tail."""
    last = next((line.strip() for line in reversed(log_tail.splitlines()) if line.strip()), "")
    return f"{what} exited {rc}: {last}\n{log_tail}"


class PartialResult(RuntimeError):
    """A step failed after measuring part of what it should: keep that part in the report."""

    def __init__(self, result: dict, message: str):
        super().__init__(message)
        self.result = result


# ------------------------------------------------------------------ steps 3-4: Serve


def serve_config(plan: GpuPlan, variant: str, port: int) -> tuple[dict, dict]:
    """config/serve.gpu.yaml for one variant, and the overrides applied to it (for the report)."""
    from .lib.serve import apply_overrides, args_path, deployment_path, get_path, load_config, set_replicas

    replicas, num_gpus = SERVE_VARIANTS[variant]
    base = load_config(plan.config)
    args = args_path(base)
    acoustic = deployment_path(base, "Acoustic")
    # A dry run has no GPU to reserve: the replicas ask for none (and decode on CPU).
    overrides: dict[str, Any] = {f"{args}.model.device": plan.device,
                                 f"{acoustic}.ray_actor_options.num_gpus": 0 if plan.dry_run else num_gpus}
    if replicas == 1:
        # One replica holds the decode slots of the two it replaces (else it is half the capacity).
        per_replica = get_path(base, f"{args}.acoustic") or {}
        for key in ("max_rows", "token_budget"):
            if key in per_replica:
                overrides[f"{args}.acoustic.{key}"] = 2 * per_replica[key]
        ongoing = get_path(base, f"{acoustic}.max_ongoing_requests")
        if ongoing:
            overrides[f"{acoustic}.max_ongoing_requests"] = 2 * ongoing
    cfg = apply_overrides(base, weights=plan.weights, port=port, overrides=overrides)
    set_replicas(cfg, "Acoustic", replicas)
    set_replicas(cfg, "Vocoder", plan.vocoder_replicas)
    shown = {k.replace(f"{args}.", "args.").replace(f"{acoustic}.", "Acoustic."): v for k, v in overrides.items()}
    shown.update({"model.weights.source": plan.weights, "Acoustic.replicas": replicas,
                  "Vocoder.replicas": plan.vocoder_replicas})
    return cfg, shown


def run_serve(plan: GpuPlan, variant: str, deadline: Deadline, budget_s: float, state: dict,
              record_path: Callable[[str], str]) -> dict:
    from .lib import loadgen
    from .lib.corpus import text_stream
    from .lib.serve import ServeRunner, engine_delta

    t_end = time.monotonic() + budget_s
    cfg, shown = serve_config(plan, variant, free_port())
    replicas = SERVE_VARIANTS[variant][0]
    res: dict[str, Any] = {"acoustic_replicas": replicas, "num_gpus": SERVE_VARIANTS[variant][1],
                           "overrides": shown, "closed": {}, "skipped_levels": []}
    state["partial"] = res
    runner = ServeRunner(cfg, ray_cpus=plan.ray_cpus, ready_timeout_s=max(30.0, budget_s - 20))
    gpu = GpuSampler().start()
    try:
        res["start_s"] = round(runner.start(), 1)
        res["ray_session"] = runner.session_dir and record_path(runner.session_dir)
        _log(f"{variant}: Serve ready in {res['start_s']} s")
        target = loadgen.Target(runner.base_url, "serve", streaming=True, timeout_s=plan.request_timeout_s)
        # Warm the whole path with concurrent traffic (not measured), then settle.
        warm_s = max(5.0, min(60.0, t_end - time.monotonic() - 30))
        warm = asyncio.run(loadgen.closed_loop(target, 2 * replicas, warm_s, text_stream(99, plan.texts), max_requests=2 * replicas))
        res["warmup"] = loadgen.summarize(warm)
        runner.wait_idle(30)
        gpu.window()
        levels = list(plan.serve_levels)
        for i, c in enumerate(levels):
            # Share what is left of this step between the levels still to run (8 s each for drain).
            left = min(t_end - time.monotonic(), deadline.left()) - 8 * (len(levels) - i)
            duration = min(plan.level_s, left / (len(levels) - i))
            if duration < plan.min_level_s:
                res["skipped_levels"].append(c)
                continue
            before = runner.acoustic_stats() if replicas == 1 else None
            run = asyncio.run(loadgen.closed_loop(target, c, duration, text_stream(plan_seed(c), plan.texts), seed=plan_seed(c)))
            s = loadgen.summarize(run)
            s["gpu"] = gpu.window()
            if not runner.wait_idle(min(30.0, max(5.0, deadline.left() - 5))):
                s["warning"] = "Acoustic still busy after the phase"
            if before is not None:  # counters of the one replica (with two, a handle reaches either)
                s["engine"] = engine_delta(before, runner.acoustic_stats())
            res["closed"][str(c)] = s
            _log(f"{variant} c{c} ({duration:.0f} s): {s['audio_s_per_s']} audio s/s, TTFB p50/p99 "
                 f"{s['ttfb_s']['p50']}/{s['ttfb_s']['p99']} s, latency p99 {s['latency_s']['p99']} s, "
                 f"done {s['completed']} err {s['errors']} cut {s['cut']}")
        if res["skipped_levels"]:
            raise PartialResult(res, f"deadline: levels {res['skipped_levels']} not measured")
        return res
    finally:
        gpu.stop()
        runner.stop()


def plan_seed(clients: int) -> int:
    return 1000 + clients


# ------------------------------------------------------------------ the run


class GpuCheck:
    def __init__(self, plan: GpuPlan, out: Path, argv: list[str]):
        self.plan = plan
        self.out = out
        self.deadline = Deadline(plan.deadline_s)
        self.harness = Harness(out, write_report, argv, dry_run=plan.dry_run, host_gpu=_gpu_name())
        self.report = self.harness.report
        self.report.update(plan={**dataclasses.asdict(plan), "config": self.harness.path(plan.config)}, steps={})
        self._state: dict[str, Any] = {}

    def run(self) -> dict:
        from .lib.serve import args_path, get_path, load_config

        base = load_config(self.plan.config)
        serve_args = get_path(base, args_path(base)) or {}
        plan, state, path = self.plan, self._state, self.harness.path
        steps: dict[str, Callable[[float], dict]] = {
            "tests": lambda b: run_tests(plan, self.out, b),
            "ceiling": lambda b: run_ceiling(plan, self.out, serve_args, b),
            **{v: (lambda b, v=v: run_serve(plan, v, self.deadline, b, state, path)) for v in SERVE_VARIANTS},
        }
        caps = {"tests": plan.tests_timeout_s, "ceiling": plan.ceiling_timeout_s}
        with self.harness:
            self.harness.watchdog(self.deadline.left, self._mark_killed)
            try:
                for name in [s for s in STEPS if s in plan.steps]:
                    if name in caps:
                        budget = min(caps[name], self.deadline.left())
                    else:  # each Serve variant: an equal share of what is left when it starts
                        todo = [v for v in SERVE_VARIANTS if v in plan.steps and v not in self.report["steps"]]
                        budget = self.deadline.left() / len(todo)
                    self._step(name, budget, steps[name])
            except KeyboardInterrupt as exc:
                self.harness.warn(f"interrupted ({exc}); steps after it did not run")
        return self.report

    def _mark_killed(self) -> None:
        for step in self.report["steps"].values():
            if step.get("status") == "running":
                step["status"] = "killed"

    def _step(self, name: str, budget_s: float, fn: Callable[[float], dict]) -> None:
        key = "serve" if name.startswith("serve_") else name
        if budget_s < 20:
            self.report["steps"][name] = {"status": "skipped", "error": f"deadline: {budget_s:.0f} s left"}
            self.harness.write()
            return
        _log(f"step {name} (budget {budget_s:.0f} s, deadline in {self.deadline.left():.0f} s)")
        self.report["steps"][name] = {"status": "running", "budget_s": round(budget_s, 1)}
        t0 = time.perf_counter()
        try:
            result = fn(budget_s)
            status, error = "ok", None
        except KeyboardInterrupt:
            self._record(name, key, self._state.pop("partial", None))
            self.report["steps"][name].update(status="interrupted", wall_s=round(time.perf_counter() - t0, 1))
            raise
        except Exception as exc:  # noqa: BLE001 - one failed step must not lose the others
            result = exc.result if isinstance(exc, PartialResult) else self._state.get("partial")
            status, error = "failed", f"{exc.__class__.__name__}: {exc}"
            _log(f"step {name} failed: {error}" + ("" if isinstance(exc, PartialResult) else f"\n{traceback.format_exc()}"))
        self._state.pop("partial", None)
        self._record(name, key, result)
        self.report["steps"][name].update(status=status, wall_s=round(time.perf_counter() - t0, 1))
        if error:
            self.report["steps"][name]["error"] = error[-4000:]
        _log(f"step {name}: {status} in {self.report['steps'][name]['wall_s']} s")
        self.harness.write()

    def _record(self, name: str, key: str, result: Optional[dict]) -> None:
        if result is None:
            return
        if key == "serve":
            self.report.setdefault("serve", {})[name] = result
        else:
            self.report[key] = result


def _gpu_name() -> Optional[str]:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def write_report(report: dict, out: Path) -> None:
    """report.json, .md and .png from a snapshot (steps go on mutating theirs)."""
    write_files(json.loads(json.dumps(report, default=str)), out, "report.json", to_markdown, to_png)


def render(report: dict, out: Path) -> None:
    render_files(report, out, to_markdown, to_png)


# ------------------------------------------------------------------ report


def to_markdown(report: dict) -> str:
    meta = report.get("meta", {})
    plan = report.get("plan", {})
    lines = [
        f"# chattts-serve GPU check{' (dry run: CPU, tiny weights)' if meta.get('dry_run') else ''}",
        "",
        f"- date: {meta.get('started')} → {meta.get('finished')} (wall {_f(meta.get('wall_s'), 0)} s, "
        f"deadline {_f(plan.get('deadline_s'), 0)} s)",
        f"- machine: {meta.get('cpus')} CPUs, GPU: {meta.get('host_gpu') or 'none'}; git {meta.get('git')}",
        f"- command `{meta.get('command')}`; weights {plan.get('weights')}, {plan.get('device')} {plan.get('dtype')}",
        "", "## Steps", "", "| step | status | wall s | budget s | error |", "|---|---|---|---|---|",
    ]
    for name, s in report.get("steps", {}).items():
        err = (s.get("error") or "").splitlines()
        lines.append(f"| {name} | {s.get('status')} | {_f(s.get('wall_s'), 1)} | {_f(s.get('budget_s'), 0)} | "
                     f"{err[0][:200] if err else ''} |")
    lines += [f"- warning: {w}" for w in report.get("warnings", [])]

    tests = report.get("tests")
    if tests:
        sm = tests.get("summary", {})
        lines += ["", "## Tests (`pytest -m gpu`)", "",
                  f"`{tests.get('command')}`: {sm.get('passed')} passed, {sm.get('failed')} failed, "
                  f"{sm.get('errors')} errors, {sm.get('skipped')} skipped", "",
                  "| test | outcome | s | recorded | message |", "|---|---|---|---|---|"]
        for c in tests.get("cases", []):
            props = ", ".join(f"{k}={v}" for k, v in (c.get("properties") or {}).items())
            msg = (c.get("message") or "").splitlines()
            lines.append(f"| `{c['name']}` | {c['outcome']} | {_f(c.get('time_s'), 1)} | {props} | {msg[0][:160] if msg else ''} |")

    ceil = report.get("ceiling")
    if ceil:
        lines += ["", "## Ceiling (the engine alone, no serving)", "",
                  f"{ceil.get('weights')} weights on {ceil.get('device')} {ceil.get('dtype')} ({ceil.get('gpu_name') or 'CPU'}), "
                  f"{ceil.get('tokens_per_row')} tokens per row, loaded in {_f(ceil.get('load_s'), 1)} s, weights on the GPU "
                  f"{_f(ceil.get('weights_gpu_mib'), 0)} MiB", "",
                  "| batch | audio s/s | step ms | steps | mean rows | prefill s | wall s | peak GPU MiB |",
                  "|---|---|---|---|---|---|---|---|"]
        for n in sorted(ceil.get("batches", {}), key=int):
            b = ceil["batches"][n]
            lines.append(f"| {n} | {_f(b.get('audio_s_per_s'), 3)} | {_f(b.get('step_ms'), 2)} | {b.get('steps')} | "
                         f"{_f(b.get('mean_rows'), 1)} | {_f(b.get('prefill_s'), 3)} | {_f(b.get('wall_s'), 2)} | "
                         f"{_f(b.get('peak_gpu_mib'), 0)} |")
        fc = ceil.get("first_chunk")
        if fc:
            lines += ["", f"First chunk at batch 1 ({fc.get('tokens')} tokens to audio): engine {_f(fc.get('engine_s'), 3)} s, "
                          f"Chat.infer {_f(fc.get('chat_infer_s'), 3)} s → raw {_f(fc.get('raw_s'), 3)} s"]

    serve = report.get("serve") or {}
    if serve:
        lines += ["", "## Serve (config/serve.gpu.yaml, closed loop)", "",
                  "| variant | clients | audio s/s | req/s | TTFB p50 | TTFB p99 | lat p50 | lat p99 | done | errors | cut | "
                  "mean batch | GPU mem peak MiB | GPU util % |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, v in serve.items():
            for c in sorted(v.get("closed", {}), key=int):
                s = v["closed"][c]
                lines.append(
                    f"| {name} | {c} | {_f(s.get('audio_s_per_s'), 3)} | {_f(s.get('requests_per_s'), 3)} | "
                    f"{_f(_get(s, 'ttfb_s', 'p50'))} | {_f(_get(s, 'ttfb_s', 'p99'))} | {_f(_get(s, 'latency_s', 'p50'))} | "
                    f"{_f(_get(s, 'latency_s', 'p99'))} | {s.get('completed')} | {s.get('errors')} | {s.get('cut')} | "
                    f"{_f(_get(s, 'engine', 'mean_rows_per_step'))} | {_f(_get(s, 'gpu', 'mem_used_peak_mib'), 0)} | "
                    f"{_f(_get(s, 'gpu', 'util_mean_pct'), 0)} |")
        for name, v in serve.items():
            lines.append(f"\n{name}: Serve start {_f(v.get('start_s'), 1)} s; overrides: "
                         + ", ".join(f"`{k}={val}`" for k, val in (v.get("overrides") or {}).items()))
    lines += ["", "Throughput = seconds of audio received per wall second; TTFB = time to the first audio byte; "
                  "mean batch = decode rows per engine step (one replica only). See bench/README.md, \"GPU check\".", ""]
    return "\n".join(lines)


def to_png(report: dict, path: Path) -> None:
    serve = report.get("serve") or {}
    ceil = report.get("ceiling") or {}
    batches = ceil.get("batches") or {}
    fig, axes = pyplot().subplots(2, 2, figsize=(13, 9.5))
    styles = {"serve_2x0.5": ("tab:blue", "o-"), "serve_1x1": ("tab:orange", "s-")}

    ax = axes[0][0]
    for name, v in serve.items():
        pts = by_clients(v.get("closed", {}), "audio_s_per_s")
        if pts:
            ax.plot(*zip(*pts), styles.get(name, ("gray", "o-"))[1], color=styles.get(name, ("gray",))[0], label=f"{name} (N clients)")
    cpts = [(int(n), b.get("audio_s_per_s")) for n, b in sorted(batches.items(), key=lambda x: int(x[0]))]
    if cpts:
        ax.plot(*zip(*cpts), "^--", color="tab:green", label="ceiling (engine, batch N)")
    log2_panel(ax, "Throughput", "concurrent clients / batch size", "audio seconds per wall second",
                [p[1] for p in cpts] + [y for v in serve.values() for _, y in by_clients(v.get("closed", {}), "audio_s_per_s")])

    for ax, key, title in ((axes[0][1], "ttfb_s", "Time to first audio byte"), (axes[1][0], "latency_s", "Latency (whole response)")):
        for name, v in serve.items():
            color = styles.get(name, ("gray",))[0]
            for q, style in (("p50", "o-"), ("p99", "^:")):
                pts = by_clients(v.get("closed", {}), key, q)
                if pts:
                    ax.plot(*zip(*pts), style, color=color, label=f"{name} {q}")
        if key == "ttfb_s" and _get(ceil, "first_chunk", "raw_s"):
            ax.axhline(ceil["first_chunk"]["raw_s"], color="tab:green", ls="--", label="raw first chunk, batch 1")
        seconds_vs_clients(ax, title)

    ax = axes[1][1]
    pts = [(int(n), b.get("step_ms"), b.get("peak_gpu_mib")) for n, b in sorted(batches.items(), key=lambda x: int(x[0]))]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:green", label="decode step ms")
        mem = [(p[0], p[2]) for p in pts if p[2] is not None]
        if mem:
            ax2 = ax.twinx()
            ax2.plot(*zip(*mem), "s:", color="tab:purple", label="peak GPU MiB")
            ax2.set_ylabel("peak GPU memory, MiB")
            ax2.set_ylim(bottom=0)
            ax2.legend(fontsize=8, loc="lower right")
    log2_panel(ax, "Ceiling: decode step time and peak GPU memory", "batch size", "ms per decode step",
                [p[1] for p in pts])

    meta, plan = report.get("meta", {}), report.get("plan", {})
    fig.suptitle(f"chattts-serve GPU check{' (dry run)' if meta.get('dry_run') else ''}, {meta.get('started', '')}, "
                 f"{meta.get('host_gpu') or 'no GPU'}, {plan.get('weights')} weights, {plan.get('device')} {plan.get('dtype')}",
                 fontsize=10)
    save(fig, path)


# ------------------------------------------------------------------ command line


def add_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument("--dry-run", action="store_true", help="every step on CPU with random-tiny weights and tiny sizes (~3 min)")
    g.add_argument("--deadline-s", type=float, help="stop and write the report after this long (default 480)")
    g.add_argument("--steps", help=f"comma list of {','.join(STEPS)} (default all)")
    g.add_argument("--device", help="ceiling and Serve device (default cuda; dry run cpu)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="ceiling dtype (default bfloat16; Serve: the config's)")
    g.add_argument("--ceiling-batches", type=ints, help="default 1,8,32,64")
    g.add_argument("--serve-levels", type=ints, help="closed-loop clients, default 1,16,64")
    g.add_argument("--level-s", type=float, help="seconds per closed-loop level (default 20; shortened to meet the deadline)")
    g.add_argument("--vocoder-replicas", type=int, help="fixed Vocoder replicas (default 4)")
    g.add_argument("--config", help="Serve config (default config/serve.gpu.yaml)")


def main(a: argparse.Namespace) -> int:
    options = {"deadline_s": a.deadline_s, "device": a.device, "dtype": a.dtype, "ceiling_batches": a.ceiling_batches,
               "serve_levels": a.serve_levels, "level_s": a.level_s, "vocoder_replicas": a.vocoder_replicas,
               "config": a.config}
    kw = {k: v for k, v in options.items() if v is not None}
    if a.steps:
        kw["steps"] = tuple(x.strip() for x in a.steps.split(",") if x.strip())
        bad = [x for x in kw["steps"] if x not in STEPS]
        if bad:
            raise SystemExit(f"unknown step(s) {bad}; choose from {STEPS}")
    plan = GpuPlan.dry(**kw) if a.dry_run else GpuPlan(**kw)
    report = GpuCheck(plan, Path(a.out), a.argv).run()
    print(f"\nreport: {a.out}/report.json, report.md, report.png (wall {report['meta'].get('wall_s')} s)")
    for name, s in report["steps"].items():
        print(f"  {name}: {s['status']}" + (f" ({s['error'].splitlines()[0][:200]})" if s.get("error") else ""))
    return 0 if all(s["status"] == "ok" for s in report["steps"].values()) else 1
