"""The GPU check's steps, each run under its budget: ``pytest -m gpu`` (its JUnit XML read back),
the engine's ceiling (``python -m bench gpu-ceiling``, ``ceiling_worker``, in a process of its
own), and Serve under closed-loop load for one variant; a step that fails keeps what it measured
(``PartialResult``).

Apart from the plan (``gpu_plan.py``), the run that orders the steps under the deadline
(``gpu.py``) and the report (``gpu_report.py``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable, Optional

from .gpu_plan import SERVE_VARIANTS, GpuPlan, serve_config
from .lib.harness import command_line, ints, logger
from .lib.procs import bench_command, free_port, run_to_end
from .lib.report import write_json
from .lib.sampler import GpuSampler


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
            cases.append(
                {
                    "name": tc.get("name"),
                    "file": tc.get("classname"),
                    "outcome": outcome,
                    "time_s": round(float(tc.get("time") or 0), 3),
                    "message": message,
                    "properties": props,
                }
            )
    summary = {k: sum(1 for c in cases if c["outcome"] == k) for k in ("passed", "failed", "error", "skipped")}
    summary["errors"] = summary.pop("error")
    summary["total"] = len(cases)
    return {"summary": summary, "cases": cases}


def run_tests(plan: GpuPlan, out: Path, budget_s: float) -> dict:
    xml = out / "pytest.xml"
    # A test module that cannot be imported (a package missing on a bare GPU machine) is reported
    # as an error case; the gpu tests elsewhere still run.
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        *plan.tests_paths,
        "-p",
        "no:cacheprovider",
        "-q",
        "-rs",
        "--continue-on-collection-errors",
        f"--junitxml={xml}",
        "-o",
        "junit_family=xunit1",
    ]
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
    c = Ceiling(
        a.weights,
        a.threads,
        args.get("segments") or {},
        int(acoustic.get("first_chunk_tokens", 12)),
        int(acoustic.get("chunk_tokens", 24)),
        args.get("vocoder") or {},
        device=a.device,
        dtype=a.dtype,
    )
    cuda = c.model.device.type == "cuda"
    tokens = c.mean_tokens
    res: dict[str, Any] = {
        "device": str(c.model.device),
        "dtype": a.dtype,
        "weights": c.model.weights.kind,
        "tokens_per_row": tokens,
        "torch_threads": c.threads,
        "load_s": round(time.perf_counter() - t0, 1),
        "batches": {},
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
    argv = bench_command(
        "gpu-ceiling",
        "--out",
        str(path),
        "--weights",
        plan.weights,
        "--device",
        plan.device,
        "--dtype",
        plan.dtype,
        "--batches",
        ",".join(map(str, plan.ceiling_batches)),
        "--reps",
        str(plan.ceiling_reps),
        "--first-chunk-reps",
        str(plan.first_chunk_reps),
        "--args",
        json.dumps(serve_args),
    )
    if plan.ceiling_threads:
        argv += ["--threads", str(plan.ceiling_threads)]
    rc, log_tail = run_to_end("ceiling", argv, out / "ceiling.log", timeout_s=budget_s)
    result = json.loads(path.read_text()) if path.exists() else {}
    missing = [n for n in plan.ceiling_batches if str(n) not in result.get("batches", {})]
    if rc is None:
        raise PartialResult(
            result, f"ceiling still running after {budget_s:.0f}s (killed); not measured: batch {missing}"
        )
    if rc != 0 or missing or "first_chunk" not in result:
        raise PartialResult(result, exited("ceiling", rc, log_tail))
    return result


def run_fidelity(plan: GpuPlan, out: Path, budget_s: float) -> dict:
    """``python -m bench fidelity`` on the device in its dtypes: its report (rows alone vs batched vs
    ChatTTS). Exit 1 means measured and not invariant, which is a finding, not a failed step."""
    argv = bench_command(
        "fidelity",
        "--sizes",
        plan.weights,
        "--precisions",
        plan.fidelity_precisions,
        "--device",
        plan.device,
        "--rows",
        str(plan.fidelity_rows),
        "--tokens",
        str(plan.fidelity_tokens),
        "--out",
        str(out / "fidelity"),
    )
    rc, log_tail = run_to_end("fidelity", argv, out / "fidelity.log", timeout_s=budget_s)
    path = out / "fidelity" / "report.json"
    result = json.loads(path.read_text()) if path.exists() else {}
    if rc is None:
        raise PartialResult(result, f"fidelity still running after {budget_s:.0f}s (killed)")
    if rc not in (0, 1) or not result.get("results"):
        raise PartialResult(result, exited("fidelity", rc, log_tail))
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


def run_serve(
    plan: GpuPlan, variant: str, deadline: Deadline, budget_s: float, state: dict, record_path: Callable[[str], str]
) -> dict:
    from .lib import loadgen
    from .lib.corpus import text_stream
    from .lib.serve import ServeRunner, engine_delta

    t_end = time.monotonic() + budget_s
    cfg, shown = serve_config(plan, variant, free_port())
    replicas = SERVE_VARIANTS[variant][0]
    res: dict[str, Any] = {
        "acoustic_replicas": replicas,
        "num_gpus": SERVE_VARIANTS[variant][1],
        "overrides": shown,
        "closed": {},
        "skipped_levels": [],
    }
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
        warm = asyncio.run(
            loadgen.closed_loop(target, 2 * replicas, warm_s, text_stream(99, plan.texts), max_requests=2 * replicas)
        )
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
            run = asyncio.run(
                loadgen.closed_loop(target, c, duration, text_stream(plan_seed(c), plan.texts), seed=plan_seed(c))
            )
            s = loadgen.summarize(run)
            s["gpu"] = gpu.window()
            if not runner.wait_idle(min(30.0, max(5.0, deadline.left() - 5))):
                s["warning"] = "Acoustic still busy after the phase"
            if before is not None:  # counters of the one replica (with two, a handle reaches either)
                s["engine"] = engine_delta(before, runner.acoustic_stats())
            res["closed"][str(c)] = s
            _log(
                f"{variant} c{c} ({duration:.0f} s): {s['audio_s_per_s']} audio s/s, TTFB p50/p99 "
                f"{s['ttfb_s']['p50']}/{s['ttfb_s']['p99']} s, latency p99 {s['latency_s']['p99']} s, "
                f"done {s['completed']} err {s['errors']} cut {s['cut']}"
            )
        if res["skipped_levels"]:
            raise PartialResult(res, f"deadline: levels {res['skipped_levels']} not measured")
        return res
    finally:
        gpu.stop()
        runner.stop()


def plan_seed(clients: int) -> int:
    return 1000 + clients
