"""``python -m bench gpu --out DIR``: the whole GPU check in one command (bench/README.md, "GPU check").

A GPU machine is lent rarely and briefly, so one command does everything, each step independent (a
step that fails or runs out of time is recorded with what it measured, and the next one runs), under
one deadline after which it stops and still writes its report (rewritten after every step):
``tests`` (``pytest -m gpu``, its JUnit XML read back), ``fidelity`` (``python -m bench fidelity`` in
the device's dtypes), ``ceiling`` (``python -m bench ceiling`` on the device), ``serve_2x0.5`` /
``serve_1x1`` (config/serve.gpu.yaml under closed-loop load: two Acoustic replicas at ``num_gpus:
0.5``, then one at ``num_gpus: 1`` given the decode slots of both). ``--dry-run`` runs every step on
CPU with random-tiny weights and tiny sizes, so the check itself is tested where there is no GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from .lib.config import GPU_CONFIG
from .lib.harness import Harness, command_line, ints, logger
from .lib.procs import REPO_ROOT, bench_command, free_port, run_to_end
from .lib.report import (
    Col,
    Doc,
    Figure,
    Kind,
    Panel,
    Series,
    by_clients,
    load_columns,
    log2_panel,
    points,
    seconds_panel,
)
from .lib.report import fmt as _f
from .lib.report import get as _get

_log = logger("gpu")
STEPS = ("tests", "fidelity", "ceiling", "serve_2x0.5", "serve_1x1")
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
    tests_paths: tuple = ("tests",)  # where pytest collects the gpu-marked tests
    fidelity_precisions: str = "bfloat16,float16"
    fidelity_rows: int = 4
    fidelity_tokens: int = 40
    fidelity_timeout_s: float = 90.0
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
        base = dict(
            dry_run=True,
            weights="random-tiny",
            device="cpu",
            # The tests step checks its own plumbing on one test's cases, collected from the one
            # module that holds them (CI runs the CPU pairs anyway).
            tests_filter="same_tokens",
            tests_paths=("tests/system/test_gpu.py",),
            tests_timeout_s=240.0,
            fidelity_precisions="float32",
            fidelity_rows=3,
            fidelity_tokens=12,
            fidelity_timeout_s=120.0,
            ceiling_batches=[1, 2],
            first_chunk_reps=1,
            ceiling_timeout_s=120.0,
            ceiling_threads=1,
            serve_levels=[1, 2],
            level_s=4.0,
            min_level_s=2.0,
            vocoder_replicas=1,
            # Short texts: a tiny model on 2 busy cores still completes requests in 4 s.
            texts=("你好。", "Hello there.", "好的，谢谢。", "Thanks a lot."),
            ray_cpus=16.0,  # logical CPUs as on the GPU box, so the config's CPU requests fit on 2 cores
        )
        return cls(**{**base, **kw})


def serve_config(plan: GpuPlan, variant: str, port: int) -> tuple[dict, dict]:
    """config/serve.gpu.yaml for one variant, and the overrides applied to it (for the report)."""
    from .lib.config import apply_overrides, args_path, deployment_path, get_path, load_config, set_replicas

    replicas, num_gpus = SERVE_VARIANTS[variant]
    base = load_config(plan.config)
    args, acoustic = args_path(base), deployment_path(base, "Acoustic")
    # A dry run has no GPU to reserve: the replicas ask for none (and decode on CPU).
    overrides: dict[str, Any] = {
        f"{args}.model.device": plan.device,
        f"{acoustic}.ray_actor_options.num_gpus": 0 if plan.dry_run else num_gpus,
    }
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
    shown.update(
        {"model.weights.source": plan.weights, "Acoustic.replicas": replicas, "Vocoder.replicas": plan.vocoder_replicas}
    )
    return cfg, shown


# ------------------------------------------------------------------ the steps


class PartialResult(RuntimeError):
    """A step failed after measuring part of what it should: keep that part in the report."""

    def __init__(self, result: dict, message: str):
        super().__init__(message)
        self.result = result


def exited(what: str, rc: Optional[int], log_tail: str) -> str:
    """'<what> exited <rc>: <its last log line>', then the log's tail."""
    last = next((line.strip() for line in reversed(log_tail.splitlines()) if line.strip()), "")
    return f"{what} exited {rc}: {last}\n{log_tail}"


def parse_junit(path: Path) -> dict:
    """Summary and cases of a pytest JUnit XML file (with the tests' recorded properties)."""
    root = ET.parse(path).getroot()
    cases = []
    for tc in root.iter("testcase"):
        outcome, message = "passed", None
        for kind, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            el = tc.find(kind)
            if el is not None:
                outcome, message = name, (el.get("message") or el.text or "").strip()[:2000]
                break
        case = {"name": tc.get("name"), "file": tc.get("classname"), "outcome": outcome, "message": message}
        case["time_s"] = round(float(tc.get("time") or 0), 3)
        cases.append({**case, "properties": {p.get("name"): p.get("value") for p in tc.iter("property")}})
    summary = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    summary["errors"] = summary.pop("error")
    return {"summary": {**summary, "total": len(cases)}, "cases": cases}


def run_tests(plan: GpuPlan, out: Path, budget_s: float) -> dict:
    xml = out / "pytest.xml"
    # A test module that cannot be imported (a package missing on a bare GPU machine) is reported
    # as an error case; the gpu tests elsewhere still run.
    argv = [sys.executable, "-m", "pytest", "-m", "gpu", *plan.tests_paths, "-p", "no:cacheprovider", "-q", "-rs"]
    argv += ["--continue-on-collection-errors", f"--junitxml={xml}", "-o", "junit_family=xunit1"]
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


def run_subcommand(name: str, argv: list[str], out: Path, json_path: Path, budget_s: float) -> tuple:
    """``python -m bench <name> ...`` in a process of its own (the GPU is released when it exits):
    its exit status, the JSON it wrote (what it measured so far, if stopped) and its log's tail."""
    rc, log_tail = run_to_end(name, bench_command(name, *argv), out / f"{name}.log", timeout_s=budget_s)
    result = json.loads(json_path.read_text()) if json_path.exists() else {}
    if rc is None:
        raise PartialResult(result, f"{name} still running after {budget_s:.0f}s (killed)")
    return rc, result, log_tail


def run_fidelity(plan: GpuPlan, out: Path, budget_s: float) -> dict:
    """Rows alone vs batched vs ChatTTS in the device's dtypes. Exit 1 is measured and not
    invariant: a finding, not a failed step."""
    argv = ["--sizes", plan.weights, "--precisions", plan.fidelity_precisions, "--device", plan.device]
    argv += ["--rows", str(plan.fidelity_rows), "--tokens", str(plan.fidelity_tokens), "--out", str(out / "fidelity")]
    rc, result, log_tail = run_subcommand("fidelity", argv, out, out / "fidelity" / "report.json", budget_s)
    if rc not in (0, 1) or not result.get("results"):
        raise PartialResult(result, exited("fidelity", rc, log_tail))
    return result


def run_ceiling(plan: GpuPlan, out: Path, serve_args: dict, budget_s: float) -> dict:
    """The engine's ceiling on the device: audio s/s, step time and peak GPU memory by batch, the first chunk."""
    argv = ["--out", str(out / "ceiling.json"), "--weights", plan.weights, "--device", plan.device]
    argv += ["--dtype", plan.dtype, "--batches", ",".join(map(str, plan.ceiling_batches)), "--methods", "engine"]
    argv += ["--reps", str(plan.ceiling_reps), "--first-chunk-reps", str(plan.first_chunk_reps)]
    argv += ["--args", json.dumps(serve_args)] + (
        ["--threads", str(plan.ceiling_threads)] if plan.ceiling_threads else []
    )
    rc, result, log_tail = run_subcommand("ceiling", argv, out, out / "ceiling.json", budget_s)
    missing = [n for n in plan.ceiling_batches if str(n) not in (_get(result, "methods", "engine") or {})]
    if rc != 0 or missing or "first_chunk" not in result:
        raise PartialResult(result, exited("ceiling", rc, log_tail))
    return result


class Deadline:
    def __init__(self, total_s: float):
        self.total_s, self.t0 = total_s, time.monotonic()

    def left(self) -> float:
        return self.total_s - (time.monotonic() - self.t0)


def run_serve(plan: GpuPlan, variant: str, deadline: Deadline, budget_s: float, state: dict, path: Callable) -> dict:
    """One Serve variant under closed-loop load at each level (what is left of the budget shared out)."""
    from .lib import loadgen
    from .lib.corpus import text_stream
    from .lib.sampler import GpuSampler
    from .lib.serve import ServeRunner, engine_delta

    t_end = time.monotonic() + budget_s
    cfg, shown = serve_config(plan, variant, free_port())
    replicas, num_gpus = SERVE_VARIANTS[variant]
    res: dict[str, Any] = {
        "acoustic_replicas": replicas,
        "num_gpus": num_gpus,
        "overrides": shown,
        "closed": {},
        "skipped_levels": [],
    }
    state["partial"] = res
    runner = ServeRunner(cfg, ray_cpus=plan.ray_cpus, ready_timeout_s=max(30.0, budget_s - 20))
    gpu = GpuSampler().start()
    try:
        res["start_s"] = round(runner.start(), 1)
        res["ray_session"] = runner.session_dir and path(runner.session_dir)
        _log(f"{variant}: Serve ready in {res['start_s']} s")
        target = loadgen.Target(runner.base_url, "serve", streaming=True, timeout_s=plan.request_timeout_s)
        # Warm the whole path with concurrent traffic (not measured), then settle.
        warm_s = max(5.0, min(60.0, t_end - time.monotonic() - 30))
        texts = text_stream(99, plan.texts)
        warm = asyncio.run(loadgen.closed_loop(target, 2 * replicas, warm_s, texts, max_requests=2 * replicas))
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
            seed = 1000 + c
            s = loadgen.summarize(
                asyncio.run(loadgen.closed_loop(target, c, duration, text_stream(seed, plan.texts), seed=seed))
            )
            s["gpu"] = gpu.window()
            if not runner.wait_idle(min(30.0, max(5.0, deadline.left() - 5))):
                s["warning"] = "Acoustic still busy after the phase"
            if before is not None:  # counters of the one replica (with two, a handle reaches either)
                s["engine"] = engine_delta(before, runner.acoustic_stats())
            res["closed"][str(c)] = s
            _log(
                f"{variant} c{c} ({duration:.0f} s): {s['audio_s_per_s']} audio s/s, TTFB p50/p99 "
                f"{s['ttfb_s']['p50']}/{s['ttfb_s']['p99']} s, done {s['completed']} err {s['errors']} cut {s['cut']}"
            )
        if res["skipped_levels"]:
            raise PartialResult(res, f"deadline: levels {res['skipped_levels']} not measured")
        return res
    finally:
        gpu.stop()
        runner.stop()


# ------------------------------------------------------------------ the run


class GpuCheck:
    def __init__(self, plan: GpuPlan, out: Path, argv: list[str]):
        self.plan, self.out = plan, out
        self.deadline = Deadline(plan.deadline_s)
        self.harness = Harness(out, write_report, argv, dry_run=plan.dry_run, host_gpu=_gpu_name())
        self.report = self.harness.report
        self.report.update(plan={**dataclasses.asdict(plan), "config": self.harness.path(plan.config)}, steps={})
        self._state: dict[str, Any] = {}

    def run(self) -> dict:
        from .lib.config import args_path, get_path, load_config

        base = load_config(self.plan.config)
        serve_args = get_path(base, args_path(base)) or {}
        plan, out = self.plan, self.out
        steps: dict[str, Callable[[float], dict]] = {
            "tests": lambda b: run_tests(plan, out, b),
            "fidelity": lambda b: run_fidelity(plan, out, b),
            "ceiling": lambda b: run_ceiling(plan, out, serve_args, b),
            **{
                v: (lambda b, v=v: run_serve(plan, v, self.deadline, b, self._state, self.harness.path))
                for v in SERVE_VARIANTS
            },
        }
        caps = {"tests": plan.tests_timeout_s, "fidelity": plan.fidelity_timeout_s, "ceiling": plan.ceiling_timeout_s}
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
        if budget_s < 20:
            self.report["steps"][name] = {"status": "skipped", "error": f"deadline: {budget_s:.0f} s left"}
            self.harness.write()
            return
        _log(f"step {name} (budget {budget_s:.0f} s, deadline in {self.deadline.left():.0f} s)")
        self.report["steps"][name] = {"status": "running", "budget_s": round(budget_s, 1)}
        t0 = time.perf_counter()
        error = None
        try:
            result, status = fn(budget_s), "ok"
        except KeyboardInterrupt:
            self._record(name, self._state.pop("partial", None))
            self.report["steps"][name].update(status="interrupted", wall_s=round(time.perf_counter() - t0, 1))
            raise
        except Exception as exc:  # noqa: BLE001 - one failed step must not lose the others
            result = exc.result if isinstance(exc, PartialResult) else self._state.get("partial")
            status, error = "failed", f"{exc.__class__.__name__}: {exc}"
            _log(
                f"step {name} failed: {error}"
                + ("" if isinstance(exc, PartialResult) else "\n" + traceback.format_exc())
            )
        self._state.pop("partial", None)
        self._record(name, result)
        self.report["steps"][name].update(status=status, wall_s=round(time.perf_counter() - t0, 1))
        if error:
            self.report["steps"][name]["error"] = error[-4000:]
        _log(f"step {name}: {status} in {self.report['steps'][name]['wall_s']} s")
        self.harness.write()

    def _record(self, name: str, result: Optional[dict]) -> None:
        if result is not None and name.startswith("serve_"):
            self.report.setdefault("serve", {})[name] = result
        elif result is not None:
            self.report[name] = result


def _gpu_name() -> Optional[str]:
    query = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"]
    try:
        return subprocess.run(query, capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------ the report


def _first_line(text: Optional[str], n: int) -> str:
    lines = (text or "").splitlines()
    return lines[0][:n] if lines else ""


STEP_COLUMNS = [
    Col("step", 0),
    Col("status", lambda x: str(x[1].get("status"))),
    Col("wall s", (1, "wall_s"), nd=1),
    Col("budget s", (1, "budget_s"), nd=0),
    Col("error", lambda x: _first_line(x[1].get("error"), 200)),
]
TEST_COLUMNS = [
    Col("test", lambda c: f"`{c['name']}`"),
    Col("outcome", "outcome"),
    Col("s", "time_s", nd=1),
    Col("recorded", lambda c: ", ".join(f"{k}={v}" for k, v in (c.get("properties") or {}).items())),
    Col("message", lambda c: _first_line(c.get("message"), 160)),
]
CEILING_COLUMNS = [
    Col("batch", 0),
    Col("audio s/s", (1, "audio_s_per_s"), nd=3),
    Col("step ms", (1, "step_ms")),
    Col("steps", lambda x: str(x[1].get("steps"))),
    Col("mean rows", (1, "mean_rows"), nd=1),
    Col("prefill s", (1, "prefill_s"), nd=3),
    Col("peak GPU MiB", (1, "peak_gpu_mib"), nd=0),
]
SERVE_COLUMNS = [
    Col("variant", 0),
    *load_columns(ttfb=("p50", "p99"), latency=("p50", "p99")),
    Col("GPU mem peak MiB", (2, "gpu", "mem_used_peak_mib"), nd=0),
    Col("GPU util %", (2, "gpu", "util_mean_pct"), nd=0),
]


def _ceiling_rows(report: dict) -> list[tuple[str, dict]]:
    engine = _get(report, "ceiling", "methods", "engine") or {}
    return [(n, engine[n]) for n in sorted(engine, key=int)]


def to_doc(report: dict) -> Doc:
    from .fidelity import COLUMNS as FIDELITY

    meta, plan = report.get("meta", {}), report.get("plan", {})
    doc = Doc(f"chattts-serve GPU check{' (dry run: CPU, tiny weights)' if meta.get('dry_run') else ''}", end="")
    doc.add(
        f"- date: {meta.get('started')} → {meta.get('finished')} (wall {_f(meta.get('wall_s'), 0)} s, "
        f"deadline {_f(plan.get('deadline_s'), 0)} s)",
        f"- machine: {meta.get('cpus')} CPUs, GPU: {meta.get('host_gpu') or 'none'}; git {meta.get('git')}",
        f"- command `{meta.get('command')}`; weights {plan.get('weights')}, {plan.get('device')} {plan.get('dtype')}",
    )
    doc.table(STEP_COLUMNS, report.get("steps", {}).items(), before=("", "## Steps", ""))
    doc.add(*[f"- warning: {w}" for w in report.get("warnings", [])])
    tests = report.get("tests")
    if tests:
        sm = tests.get("summary", {})
        summary = (
            f"`{tests.get('command')}`: {sm.get('passed')} passed, {sm.get('failed')} failed, "
            f"{sm.get('errors')} errors, {sm.get('skipped')} skipped"
        )
        doc.table(TEST_COLUMNS, tests.get("cases", []), before=("", "## Tests (`pytest -m gpu`)", "", summary, ""))
    fid = report.get("fidelity")
    if fid:
        doc.table(FIDELITY, fid.get("results", []), before=("", "## Batch invariance (`python -m bench fidelity`)", ""))
    ceil = report.get("ceiling")
    if ceil:
        about = (
            f"{ceil.get('weights')} weights on {ceil.get('device')} {ceil.get('dtype')} ({ceil.get('gpu_name') or 'CPU'}), "
            f"{ceil.get('tokens_per_row')} tokens per row, loaded in {_f(ceil.get('load_s'), 1)} s, weights on the GPU "
            f"{_f(ceil.get('weights_gpu_mib'), 0)} MiB"
        )
        head = ("", "## Ceiling (the engine alone, no serving)", "", about, "")
        doc.table(CEILING_COLUMNS, _ceiling_rows(report), before=head)
        fc = ceil.get("first_chunk")
        if fc:
            doc.add(
                "",
                f"First chunk at batch 1 ({fc.get('tokens')} tokens to audio): engine {_f(fc.get('engine_s'), 3)} s, "
                f"Chat.infer {_f(fc.get('chat_infer_s'), 3)} s → raw {_f(fc.get('raw_s'), 3)} s",
            )
    serve = report.get("serve") or {}
    if serve:
        rows = [(name, c, v["closed"][c]) for name, v in serve.items() for c in sorted(v.get("closed", {}), key=int)]
        doc.table(SERVE_COLUMNS, rows, before=("", "## Serve (config/serve.gpu.yaml, closed loop)", ""))
        for name, v in serve.items():
            overrides = ", ".join(f"`{k}={val}`" for k, val in (v.get("overrides") or {}).items())
            doc.add(f"\n{name}: Serve start {_f(v.get('start_s'), 1)} s; overrides: {overrides}")
    doc.add(
        "",
        "Throughput = seconds of audio received per wall second; TTFB = time to the first audio byte; "
        'mean batch = decode rows per engine step (one replica only). See bench/README.md, "GPU check".',
        "",
    )
    return doc


STYLES = {"serve_2x0.5": ("tab:blue", "o-"), "serve_1x1": ("tab:orange", "s-")}


def to_figure(report: dict) -> Figure:
    serve = report.get("serve") or {}
    batches = [(int(n), b) for n, b in _ceiling_rows(report)]

    def style(name: str) -> tuple[str, str]:
        return STYLES.get(name, ("gray", "o-"))

    series = [
        points(
            by_clients(v.get("closed", {}), "audio_s_per_s"),
            f"{name} (N clients)",
            style(name)[1],
            color=style(name)[0],
        )
        for name, v in serve.items()
    ]
    series.append(
        points([(n, b.get("audio_s_per_s")) for n, b in batches], "ceiling (engine, batch N)", "^--", color="tab:green")
    )
    panels = [log2_panel("Throughput", "concurrent clients / batch size", "audio seconds per wall second", series)]
    raw = _get(report, "ceiling", "first_chunk", "raw_s")
    for key, title in (("ttfb_s", "Time to first audio byte"), ("latency_s", "Latency (whole response)")):
        lines = [
            points(by_clients(v.get("closed", {}), key, q), f"{name} {q}", dash, color=style(name)[0])
            for name, v in serve.items()
            for q, dash in (("p50", "o-"), ("p99", "^:"))
        ]
        if key == "ttfb_s" and raw:
            lines.append(
                Series("hline", y=raw, label="raw first chunk, batch 1", kw={"color": "tab:green", "ls": "--"})
            )
        panels.append(seconds_panel(title, lines))
    steps = [(n, b.get("step_ms")) for n, b in batches]
    step_series = [points(steps, "decode step ms", color="tab:green")]
    step = log2_panel("Ceiling: decode step time and peak GPU memory", "batch size", "ms per decode step", step_series)
    mem = [(n, b["peak_gpu_mib"]) for n, b in batches if b.get("peak_gpu_mib") is not None]
    if mem:
        step.twin = Panel(ylabel="peak GPU memory, MiB", ylim=(0, None), grid=None, not_measured=False)
        step.twin.legend = {"fontsize": 8, "loc": "lower right"}
        step.twin.add(points(mem, "peak GPU MiB", "s:", color="tab:purple"))
    panels.append(step)
    meta, plan = report.get("meta", {}), report.get("plan", {})
    title = (
        f"chattts-serve GPU check{' (dry run)' if meta.get('dry_run') else ''}, {meta.get('started', '')}, "
        f"{meta.get('host_gpu') or 'no GPU'}, {plan.get('weights')} weights, {plan.get('device')} {plan.get('dtype')}"
    )
    return Figure(panels, shape=(2, 2), size=(13, 9.5), title=title)


KIND = Kind("report.json", to_doc, to_figure)


def write_report(report: dict, out: Path) -> None:
    """report.json, .md and .png from a snapshot (steps go on mutating theirs)."""
    KIND.write(json.loads(json.dumps(report, default=str)), out)


# ------------------------------------------------------------------ command line


def add_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument("--dry-run", action="store_true", help="every step on CPU, random-tiny weights, tiny sizes (~3 min)")
    g.add_argument("--deadline-s", type=float, help="stop and write the report after this long (default 480)")
    g.add_argument("--steps", help=f"comma list of {','.join(STEPS)} (default all)")
    g.add_argument("--device", help="ceiling and Serve device (default cuda; dry run cpu)")
    g.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], help="ceiling dtype (default bfloat16)")
    g.add_argument("--ceiling-batches", type=ints, help="default 1,8,32,64")
    g.add_argument("--serve-levels", type=ints, help="closed-loop clients, default 1,16,64")
    g.add_argument(
        "--level-s", type=float, help="seconds per closed-loop level (default 20; shortened to the deadline)"
    )
    g.add_argument("--vocoder-replicas", type=int, help="fixed Vocoder replicas (default 4)")
    g.add_argument("--config", help="Serve config (default config/serve.gpu.yaml)")


def main(a: argparse.Namespace) -> int:
    options = ("deadline_s", "device", "dtype", "ceiling_batches", "serve_levels", "level_s", "vocoder_replicas")
    kw = {k: getattr(a, k) for k in (*options, "config") if getattr(a, k) is not None}
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
