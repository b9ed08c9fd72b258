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
``python -m bench gpu-ceiling`` (``gpu_steps.ceiling_worker``).

The parts: ``gpu_plan.py`` (the steps, the variants, ``GpuPlan``, each variant's Serve config),
``gpu_steps.py`` (running each step), ``gpu_report.py`` (report.json, .md, .png); here the run
that orders the steps under the deadline, and the command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import subprocess
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from .gpu_plan import SERVE_VARIANTS, STEPS, GpuPlan
from .gpu_report import write_report
from .gpu_steps import Deadline, PartialResult, run_ceiling, run_fidelity, run_serve, run_tests
from .lib.harness import Harness, ints, logger

_log = logger("gpu")


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
            "fidelity": lambda b: run_fidelity(plan, self.out, b),
            "ceiling": lambda b: run_ceiling(plan, self.out, serve_args, b),
            **{v: (lambda b, v=v: run_serve(plan, v, self.deadline, b, state, path)) for v in SERVE_VARIANTS},
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
            _log(
                f"step {name} failed: {error}"
                + ("" if isinstance(exc, PartialResult) else f"\n{traceback.format_exc()}")
            )
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
        return (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None


# ------------------------------------------------------------------ command line


def add_arguments(g: argparse.ArgumentParser) -> None:
    g.add_argument("--out", required=True, help="output directory")
    g.add_argument(
        "--dry-run", action="store_true", help="every step on CPU with random-tiny weights and tiny sizes (~3 min)"
    )
    g.add_argument("--deadline-s", type=float, help="stop and write the report after this long (default 480)")
    g.add_argument("--steps", help=f"comma list of {','.join(STEPS)} (default all)")
    g.add_argument("--device", help="ceiling and Serve device (default cuda; dry run cpu)")
    g.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="ceiling dtype (default bfloat16; Serve: the config's)",
    )
    g.add_argument("--ceiling-batches", type=ints, help="default 1,8,32,64")
    g.add_argument("--serve-levels", type=ints, help="closed-loop clients, default 1,16,64")
    g.add_argument(
        "--level-s", type=float, help="seconds per closed-loop level (default 20; shortened to meet the deadline)"
    )
    g.add_argument("--vocoder-replicas", type=int, help="fixed Vocoder replicas (default 4)")
    g.add_argument("--config", help="Serve config (default config/serve.gpu.yaml)")


def main(a: argparse.Namespace) -> int:
    options = {
        "deadline_s": a.deadline_s,
        "device": a.device,
        "dtype": a.dtype,
        "ceiling_batches": a.ceiling_batches,
        "serve_levels": a.serve_levels,
        "level_s": a.level_s,
        "vocoder_replicas": a.vocoder_replicas,
        "config": a.config,
    }
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
