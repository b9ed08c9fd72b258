"""``python -m bench run``: ceiling → baseline → project (closed loop, then open loop continuous
vs window batching), each alone on the machine, everything it starts stopped at the end (also on
errors, Ctrl-C and SIGTERM), and the report written (also partially, if a phase failed).

The ceiling (bench/ceiling.py) and the baseline server (bench/baseline.py) are subprocesses
(``python -m bench ceiling`` / ``baseline``); the project is a local Ray cluster started in this
process (bench/lib/serve.py). The report: bench/run_report.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from . import cache_hit
from .lib import first_audio, loadgen
from .lib.corpus import ONE_ROW_TEXTS, corpus_summary, expected_audio_s, plan_corpus, text_stream
from .lib.harness import Harness, floats, ints
from .lib.machine import busy_threads, classify_all, classify_serve, machine_cores, machine_cpu, thread_cpu
from .lib.pinning import cpu_set, pin_acoustic, pin_threads
from .lib.procs import ManagedProcess, bench_command, free_port, kill_descendants, run_to_end
from .lib.sampler import Periodic, RssSampler
from .lib.serve import (
    ServeRunner,
    apply_overrides,
    args_path,
    deployment_path,
    engine_delta,
    get_path,
    load_config,
    parse_sets,
    set_path,
    set_replicas,
    set_threads,
)
from .lib.waiting import holds_within, wait_until
from .run_report import load_key, write_all

PHASES = ("ceiling", "baseline", "serve", "first", "open")


@dataclass
class RunPlan:
    quick: bool = False
    weights: str = "random"
    phases: tuple = PHASES
    ceiling_batches: list = field(default_factory=lambda: [1, 4, 8, 16])
    ceiling_methods: list = field(default_factory=lambda: ["engine", "chat_infer"])
    ceiling_reps: int = 2
    ceiling_tokens: int = 0  # 0: the corpus mean segment length
    first_chunk_reps: int = 5
    baseline_levels: list = field(default_factory=lambda: [1, 2, 4, 8, 16])
    serve_levels: list = field(default_factory=lambda: [1, 2, 4, 8, 16])
    closed_s: dict = field(default_factory=lambda: {1: 60, 2: 60, 4: 90, 8: 120, 16: 120})
    open_s: float = 240.0  # enough requests per point for a stable window/continuous ratio (bench/README.md)
    loads_continuous: list = field(default_factory=lambda: [0.3, 0.5, 0.7, 0.9])
    loads_window: list = field(default_factory=lambda: [0.5, 0.7, 0.9])
    drain_s: float = 180.0
    timeout_s: float = 300.0
    baseline_threads: Optional[int] = None
    seed: int = 0
    front_door: str = "proxy"  # "haproxy": RAY_SERVE_ENABLE_HA_PROXY (docs/operations.md, "Fast front door")
    # The proxy's middlewares as the README's run command installs them (front guard, edge cache,
    # the client's end of back-pressure); "off" measures Serve's proxy bare.
    front_guard: bool = True
    # CPUs of the Acoustic replica and the ceiling (one torch thread each), every other process on
    # the rest (bench/lib/pinning.py): "" shares every core as deployed.
    pin_acoustic: str = ""
    # First audio before/after in one run (bench/lib/first_audio.py): ABBA pairs of halves at 1 client.
    first_pairs: int = 6
    first_per_half: int = 6
    profile: bool = False  # py-spy the replicas during the closed loop at profile_level clients
    profile_level: int = 8

    @classmethod
    def quick_plan(cls, **kw) -> "RunPlan":
        base = dict(
            quick=True,
            ceiling_batches=[1, 8],
            ceiling_reps=1,
            first_chunk_reps=3,
            baseline_levels=[1, 8],
            serve_levels=[1, 8],
            closed_s={1: 30, 8: 60},
            open_s=60.0,
            loads_continuous=[0.7],
            loads_window=[0.7],
            first_pairs=4,
            first_per_half=4,
            drain_s=90.0,
            timeout_s=180.0,
        )
        base.update(kw)
        return cls(**base)

    def closed_duration(self, c: int) -> float:
        if c in self.closed_s:
            return float(self.closed_s[c])
        return float(
            self.closed_s[max(k for k in self.closed_s if k <= c)] if any(k <= c for k in self.closed_s) else 60
        )


class Progress(Periodic):
    """One bar over the whole run, in seconds of planned work; the current phase in its label
    (moved on once a second)."""

    def __init__(self, total_s: float, enabled: bool = True):
        from tqdm import tqdm

        super().__init__(1.0, "progress")
        self.bar = tqdm(
            total=round(total_s),
            unit="s",
            desc="bench",
            disable=not enabled,
            dynamic_ncols=True,
            bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} planned s [{elapsed}<{remaining}]",
        )
        self.done_s = 0.0
        self.phase_s = 0.0
        self.phase_t0 = time.monotonic()
        self.start()

    def phase(self, name: str, planned_s: float) -> None:
        with self._lock:
            self.done_s += self.phase_s
            self.phase_s = planned_s
            self.phase_t0 = time.monotonic()
            self.bar.set_description_str(name)
            self._update()

    def _update(self) -> None:
        n = self.done_s + min(self.phase_s, time.monotonic() - self.phase_t0)
        n = min(round(n), self.bar.total)
        if n > self.bar.n:
            self.bar.update(n - self.bar.n)

    def tick(self) -> None:
        with self._lock:
            self._update()

    def write(self, msg: str) -> None:
        self.bar.write(msg)

    def close(self) -> None:
        self.stop()
        with self._lock:
            self.done_s += self.phase_s
            self.phase_s = 0
            self._update()
        self.bar.close()


class BenchRun:
    def __init__(
        self,
        plan: RunPlan,
        out: Path,
        serve_cfg: dict,
        overrides: dict,
        ray_cpus: Optional[float],
        argv: list[str],
        show_progress: bool = True,
    ):
        self.plan = plan
        self.out = out
        self.logs = out / "logs"
        self.serve_cfg = serve_cfg
        self.overrides = overrides
        self.ray_cpus = ray_cpus
        self.harness = Harness(out, write_all, argv, quick=plan.quick, weights=plan.weights, plan=asdict(plan))
        self.report = self.harness.report
        self.show_progress = show_progress
        self._procs: list[ManagedProcess] = []
        self._serve: Optional[ServeRunner] = None
        self._unpinned: Optional[set[int]] = None  # the CPUs this process had before --pin-acoustic
        # The deployed settings (the config's args over the code's defaults): the ceiling and the
        # baseline cut the same segments and chunks as the project.
        from serve_app.settings import AppConfig

        self.args = get_path(serve_cfg, args_path(serve_cfg)) or {}
        self.segments = AppConfig.model_validate(self.args).segments.model_dump()

    # -------------------------------------------------------------- planning

    def planned_seconds(self) -> dict[str, float]:
        p = self.plan
        est: dict[str, float] = {}
        if "ceiling" in p.phases:
            per = {1: 10, 4: 20, 8: 30, 16: 50}
            est["ceiling"] = (
                30
                + 10 * p.first_chunk_reps
                + sum(per.get(b, 30) for b in p.ceiling_batches) * p.ceiling_reps * len(p.ceiling_methods)
            )
        if "baseline" in p.phases:
            est["baseline"] = 30 + sum(p.closed_duration(c) + 10 for c in p.baseline_levels)
        if "serve" in p.phases or "open" in p.phases or "first" in p.phases:
            est["serve_start"] = 60
        if "first" in p.phases:
            est["first"] = p.first_pairs * 2 * (p.first_per_half * 3 + 4)
        if "serve" in p.phases:
            est["serve"] = sum(p.closed_duration(c) + 5 for c in p.serve_levels)
        if "open" in p.phases:
            est["open"] = (len(p.loads_continuous) + len(p.loads_window)) * (p.open_s + 25) + 10
        return est

    # -------------------------------------------------------------- phases

    def run(self) -> dict:
        with self.harness:
            self.logs.mkdir(exist_ok=True)
            planned = plan_corpus(segments=self.segments)
            self.expected = expected_audio_s(planned)
            self.corpus = corpus_summary(planned)
            self.report["corpus"] = self.corpus
            est = self.planned_seconds()
            self.progress = Progress(sum(est.values()), enabled=self.show_progress)
            try:
                if "ceiling" in self.plan.phases:
                    self.progress.phase("ceiling", est["ceiling"])
                    self.run_ceiling()
                if "baseline" in self.plan.phases:
                    self.progress.phase("baseline", est["baseline"])
                    self.run_baseline()
                if any(x in self.plan.phases for x in ("serve", "first", "open")):
                    self.run_serve(est)
            finally:
                self.cleanup()
                self.progress.close()
        return self.report

    def cleanup(self) -> None:
        for p in self._procs:
            p.stop()
        self._procs.clear()
        if self._serve is not None:
            self._serve.stop()
            self._serve = None
        if self._unpinned:
            pin_threads(os.getpid(), self._unpinned)
            self._unpinned = None
        left = kill_descendants(os.getpid())
        if left:
            self.harness.warn(f"stopped leftover child processes: {left}")

    # ---------------------------------------------------------- ceiling

    def run_ceiling(self) -> None:
        p = self.plan
        path = self.out / "ceiling.json"
        argv = ["--out", str(path), "--weights", p.weights, "--batches", ",".join(map(str, p.ceiling_batches))]
        argv += [
            "--methods",
            ",".join(p.ceiling_methods),
            "--reps",
            str(p.ceiling_reps),
            "--tokens",
            str(p.ceiling_tokens),
        ]
        argv += ["--args", json.dumps(self.args), "--first-chunk-reps", str(p.first_chunk_reps)]
        argv = bench_command("ceiling", *argv, *(["--cpus", p.pin_acoustic] if p.pin_acoustic else []))
        rc, log_tail = run_to_end("ceiling", argv, self.logs / "ceiling.log", timeout_s=3600)
        if rc != 0 or not path.exists():
            raise RuntimeError(f"ceiling failed (rc {rc}):\n{log_tail}")
        self.report["ceiling"] = json.loads(path.read_text())
        c = self.report["ceiling"]
        self.progress.write(
            f"ceiling: {c['ceiling']} audio s/s by batch; first chunk raw {c.get('first_chunk', {}).get('raw_s')} s"
        )

    # ---------------------------------------------------------- load phases

    def _closed(self, target: loadgen.Target, c: int) -> dict:
        run = asyncio.run(
            loadgen.closed_loop(
                target,
                c,
                self.plan.closed_duration(c),
                text_stream(self.plan.seed + c),
                self.expected,
                seed=self.plan.seed + c,
            )
        )
        s = loadgen.summarize(run)
        if target.name == "serve" and self._serve is not None:
            # Where the first audio went, hop by hop (the Ingress's log lines of these requests).
            time.sleep(0.5)  # the last requests' lines reach the log file
            s["first_audio"] = first_audio.breakdown(run.records, first_audio.read_ingress_log(self._serve.session_dir))
        return s

    def _open(self, target: loadgen.Target, rate: float, load: float, mode: str) -> dict:
        # Same arrivals and texts for both batching modes; distinct request seeds per mode.
        seed = self.plan.seed + 1000 + int(round(load * 100))
        run = asyncio.run(
            loadgen.open_loop(
                target,
                rate,
                self.plan.open_s,
                text_stream(seed),
                seed=seed,
                drain_s=self.plan.drain_s,
                expected=self.expected,
                request_seed_base=seed + (0 if mode == "continuous" else 500000),
            )
        )
        s = loadgen.summarize(run)
        s["load"] = load
        return s

    def _line(self, system: str, label: str, s: dict) -> str:
        eng = s.get("engine") or {}
        return (
            f"{system} {label}: {s['audio_s_per_s']} audio s/s, {s['requests_per_s']} req/s, "
            f"TTFB p50 {s['ttfb_s']['p50']} s, latency p50/p99 {s['latency_s']['p50']}/{s['latency_s']['p99']} s, "
            f"done {s['completed']} err {s['errors']} cut {s['cut']}"
            + (f", mean batch {eng.get('mean_rows_per_step')}" if eng else "")
        )

    def run_baseline(self) -> None:
        p = self.plan
        port = free_port()
        argv = bench_command(
            "baseline", "--port", str(port), "--weights", p.weights, "--segments", json.dumps(self.segments)
        )
        if p.baseline_threads:
            argv += ["--threads", str(p.baseline_threads)]
        proc = ManagedProcess("baseline", argv, self.logs / "baseline.log")
        self._procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if not proc.alive():
                raise RuntimeError(f"baseline exited:\n{proc.log_tail()}")
            return httpx.get(f"{url}/healthz", timeout=5, trust_env=False).status_code == 200

        t0 = time.perf_counter()
        wait_until(healthy, 600, 1.0, what=lambda: f"baseline healthy:\n{proc.log_tail()}", retry_on=(httpx.HTTPError,))
        base = {"start_s": round(time.perf_counter() - t0, 1), "pid": proc.pid, "closed": {}}
        self.report["baseline"] = base
        sampler = RssSampler(lambda: [proc.pid], classify_all).start()
        target = loadgen.Target(url, "baseline", streaming=False, timeout_s=p.timeout_s)

        def idle() -> bool:
            try:
                s = httpx.get(f"{url}/stats", timeout=5, trust_env=False).json()
                return not s["busy"] and not s["locked"] and s["waiting"] == 0
            except httpx.HTTPError:
                return False

        try:
            for c in p.baseline_levels:
                sampler.window()
                s = self._closed(target, c)
                s["rss"] = sampler.window()
                base["closed"][str(c)] = s
                self.progress.write(self._line("baseline", f"c{c}", s))
                if not holds_within(idle, p.timeout_s):
                    self.harness.warn(f"baseline still busy {p.timeout_s}s after c{c}")
            base["rss_peak"] = self._overall_rss(base["closed"])
            try:
                base["server_stats"] = httpx.get(f"{url}/stats", timeout=5, trust_env=False).json()
            except httpx.HTTPError:
                pass
        finally:
            sampler.stop()
            proc.stop()
            self._procs.remove(proc)

    @staticmethod
    def _overall_rss(phases: dict) -> dict:
        peak_total = 0.0
        by: dict[str, float] = {}
        for s in phases.values():
            r = s.get("rss") or {}
            peak_total = max(peak_total, r.get("peak_total_mib", 0))
            for k, v in (r.get("peak_by_process_mib") or {}).items():
                by[k] = max(by.get(k, 0), v)
        return {"peak_total_mib": peak_total, "peak_by_process_mib": by}

    def run_serve(self, est: dict) -> None:
        p = self.plan
        self.progress.phase("serve: starting", est["serve_start"])
        serve = ServeRunner(
            self.serve_cfg, ray_cpus=self.ray_cpus, front_door=self.plan.front_door, front_guard=self.plan.front_guard
        )
        self._serve = serve
        start_s = serve.start()
        res: dict[str, Any] = {
            "start_s": round(start_s, 1),
            "closed": {},
            "open": {},
            "overrides": self.overrides,
            "config": self.serve_cfg,
            "ray_session": serve.session_dir and self.harness.path(serve.session_dir),
        }
        self.report["serve"] = res
        if p.pin_acoustic:
            self._unpinned = os.sched_getaffinity(0)
            acoustic = serve.replica_pids().get("Acoustic", [])
            res["pinned"] = pin_acoustic(os.getpid(), acoustic, cpu_set(p.pin_acoustic))
            self.progress.write(f"pinned: {res['pinned']}")
        res["replica_env"] = serve.replica_env()
        sampler = RssSampler(lambda: [os.getpid()], classify_serve).start()
        target = loadgen.Target(serve.base_url, "serve", streaming=True, timeout_s=p.timeout_s)
        # Warm the whole path once more with concurrent traffic (not measured).
        warm_texts = iter(["你好。", "Hello there.", "好的。", "Thanks."])
        asyncio.run(loadgen.closed_loop(target, 2, 0.01, warm_texts, max_requests=2))
        serve.wait_idle(60)
        try:
            if "serve" in p.phases:
                self.progress.phase("serve: closed loop", est["serve"])
                for c in p.serve_levels:
                    prof = f"c{c}" if (p.profile and c == p.profile_level) else None
                    res["closed"][str(c)] = self._serve_phase(
                        serve,
                        sampler,
                        lambda c=c: self._closed(target, c),
                        profile=prof,
                        profile_s=p.closed_duration(c),
                    )
                    self.progress.write(self._line("serve", f"c{c}", res["closed"][str(c)]))
            if "first" in p.phases:
                self.progress.phase("serve: first audio before/after", est.get("first", 0))
                res["first_audio_ab"] = first_audio.ab_pairs(
                    serve, target, p.first_pairs, p.first_per_half, ONE_ROW_TEXTS
                )
                self.progress.write(first_audio.ab_line(res["first_audio_ab"]))
            if "open" in p.phases:
                self.progress.phase("serve: open loop", est["open"])
                self._open_phases(serve, sampler, target, res)
            if "serve" in p.phases:
                # Cache-hit path: one 10-second wav synthesised once, then answered from the cache.
                self.progress.write("serve: cache-hit path")
                res["cache_hit"] = asyncio.run(cache_hit.measure(serve.base_url, n=100 if p.quick else 300))
                self.progress.write(
                    f"cache hit p50 {res['cache_hit']['hit_p50_ms']} ms "
                    f"(from the Ingress {res['cache_hit']['ingress_hit_p50_ms']} ms), "
                    f"{res['cache_hit']['hit_req_per_s']} req/s"
                )
            res["rss_peak"] = self._overall_rss(
                {
                    **res["closed"],
                    **{f"{m}{k}": v for m, d in res["open"].items() for k, v in d.items() if isinstance(v, dict)},
                }
            )
            res["engine_total"] = serve.acoustic_stats()
        finally:
            sampler.stop()

    def _serve_phase(
        self, serve: ServeRunner, sampler: RssSampler, fn, profile: Optional[str] = None, profile_s: float = 0.0
    ) -> dict:
        before = serve.acoustic_stats()
        sampler.window()
        pids = {
            g: p for g, p in serve.replica_pids().items() if g in ("Acoustic", "Vocoder", "Ingress", "TextNormalizer")
        }
        cpu0 = {g: [thread_cpu(pid) for pid in p] for g, p in pids.items()}
        machine0 = machine_cpu()
        rec = None
        if profile:
            from .lib.pyspy import Recorder

            rec = Recorder(self.out / "profile", self.harness.path)
            for g in ("Acoustic", "Vocoder", "Ingress"):
                for i, pid in enumerate(pids.get(g, [])):
                    if not rec.start(f"{g.lower()}{i or ''}_{profile}", pid, profile_s):
                        self.harness.warn("py-spy not found: no profile")
        t0 = time.perf_counter()
        s = fn()
        wall = time.perf_counter() - t0
        if rec is not None:
            self.report["serve"].setdefault("profile", {})[profile] = rec.finish()
        s["replica_threads"] = {
            g: [busy_threads(b, thread_cpu(pid), wall) for b, pid in zip(cpu0[g], p)] for g, p in pids.items()
        }
        s["machine_cores"] = machine_cores(machine0, machine_cpu(), wall)
        if s.get("cache_hits"):
            self.harness.warn(f"{s['cache_hits']} responses came from the response cache")
        s["rss"] = sampler.window()
        if not serve.wait_idle(self.plan.timeout_s):
            self.harness.warn("Acoustic engine still busy after a phase")
        s["engine"] = engine_delta(before, serve.acoustic_stats())
        return s

    def _open_phases(self, serve: ServeRunner, sampler: RssSampler, target: loadgen.Target, res: dict) -> None:
        p = self.plan
        closed = res["closed"]
        best = max((s["audio_s_per_s"] for s in closed.values() if s.get("audio_s_per_s")), default=None)
        source = "closed loop"
        if best is None:  # open loop alone: measure capacity at 8 clients first
            s = self._serve_phase(serve, sampler, lambda: self._closed(target, 8))
            closed["8"] = s
            best = s["audio_s_per_s"]
            source = "closed loop c8 (measured for the open loop)"
        mean_audio = self.corpus["mean_audio_s_per_request"]
        cap = {
            "audio_s_per_s": best,
            "mean_audio_s_per_request": round(mean_audio, 3),
            "requests_per_s": round(best / mean_audio, 4),
            "source": source,
        }
        res["capacity"] = cap
        for mode, loads in (("continuous", p.loads_continuous), ("window", p.loads_window)):
            if not loads:
                continue
            serve.reconfigure_acoustic(continuous=(mode == "continuous"))
            res["open"][mode] = {}
            for load in loads:
                rate = load * cap["requests_per_s"]
                s = self._serve_phase(
                    serve, sampler, lambda rate=rate, load=load, mode=mode: self._open(target, rate, load, mode)
                )
                res["open"][mode][load_key(load)] = s
                self.progress.write(
                    f"open {mode} {int(load * 100)}% ({rate:.3f} req/s): latency mean {s['latency_s']['mean']} s "
                    f"p95 {s['latency_s']['p95']} s, TTFB mean {s['ttfb_s']['mean']} s, done {s['completed']}/{s['sent']}, "
                    f"err {s['errors']} cut {s['cut']}, mean batch {(s.get('engine') or {}).get('mean_rows_per_step')}"
                )
        serve.reconfigure_acoustic(continuous=True)


# ------------------------------------------------------------------ command line


def add_arguments(r: argparse.ArgumentParser) -> None:
    r.add_argument(
        "--quick",
        action="store_true",
        help="short run (~10 min on 2 cores): c1 and c8, ceiling b1/b8, first audio before/after, open loop at 70%%",
    )
    r.add_argument("--out", default=None, help="output directory (default bench/results/tmp-<date-time>, git-ignored)")
    r.add_argument(
        "--weights",
        default="random",
        choices=["random", "random-tiny"],
        help="random = full-size ChatTTS with random weights (the benchmark); random-tiny only checks the tooling",
    )
    r.add_argument(
        "--phases", default=",".join(PHASES), help="comma list of ceiling,baseline,serve,first,open (default all)"
    )
    r.add_argument("--levels", type=ints, help="closed-loop concurrencies for baseline and project, e.g. 1,2,4,8,16")
    r.add_argument("--baseline-levels", type=ints)
    r.add_argument("--serve-levels", type=ints)
    r.add_argument("--loads", type=floats, help="open-loop loads (fractions of capacity), continuous batching")
    r.add_argument("--window-loads", type=floats, help="open-loop loads for window batching")
    r.add_argument("--duration-scale", type=float, default=1.0, help="multiply every closed/open phase's duration")
    r.add_argument("--open-s", type=float, help="open-loop arrival period per load point (s)")
    r.add_argument("--timeout-s", type=float, help="per-request timeout")
    r.add_argument("--ceiling-batches", type=ints)
    r.add_argument("--ceiling-reps", type=int)
    r.add_argument("--ceiling-tokens", type=int, help="tokens per row in the ceiling (default: corpus mean segment)")
    r.add_argument("--baseline-threads", type=int, help="torch threads of the baseline (default: torch's, all cores)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument(
        "--front-guard",
        default="on",
        choices=["on", "off"],
        help="the proxy's middlewares as the README installs them (front guard, edge cache, back-pressure)",
    )
    r.add_argument(
        "--front-door",
        default="proxy",
        choices=["proxy", "haproxy"],
        help="HTTP front door of the project: Serve's proxy, or Ray's HAProxy (RAY_SERVE_ENABLE_HA_PROXY)",
    )
    r.add_argument(
        "--profile",
        action="store_true",
        help="py-spy the Acoustic/Vocoder/Ingress replicas during one closed-loop phase",
    )
    r.add_argument("--profile-level", type=int, default=8, help="the closed-loop concurrency to profile (default 8)")
    r.add_argument(
        "--pin-acoustic",
        default="",
        metavar="CPUS",
        help="e.g. 0: the Acoustic replica and the ceiling on these CPUs (a torch thread each), every other "
        "process on the rest: the decode with cores of its own (Linux)",
    )
    r.add_argument("--no-progress", action="store_true")
    g = r.add_argument_group("project deployment (overrides of the Serve config)")
    g.add_argument("--config", help="Serve config file (default config/serve.yaml)")
    g.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="any config value by dotted path, e.g. applications.chattts.deployments.Acoustic.max_ongoing_requests=64 "
        "(list items by name; VALUE is YAML)",
    )
    g.add_argument("--ray-cpus", type=float, help="CPUs Ray may schedule (default: os.cpu_count())")
    g.add_argument("--acoustic-cpus", type=float)
    g.add_argument("--vocoder-cpus", type=float)
    g.add_argument("--ingress-cpus", type=float)
    g.add_argument("--normalizer-cpus", type=float)
    g.add_argument("--acoustic-threads", type=int, help="OMP/MKL threads (torch intra-op) of the Acoustic replicas")
    g.add_argument("--vocoder-threads", type=int, help="OMP/MKL threads of the Vocoder replicas")
    g.add_argument(
        "--torch-threads", type=int, help="args.model.torch_threads (torch.set_num_threads in every model stage)"
    )
    g.add_argument("--acoustic-replicas", type=int, help="fixed Acoustic replica count (autoscaling off)")
    g.add_argument("--vocoder-replicas", type=int, help="fixed Vocoder replica count (autoscaling off)")
    g.add_argument("--max-batch-size", type=int, help="Acoustic user_config.max_batch_size (@serve.batch)")
    g.add_argument("--batch-wait-s", type=float, help="Acoustic user_config.batch_wait_timeout_s")
    g.add_argument("--max-ongoing", type=int, help="Acoustic max_ongoing_requests")
    g.add_argument("--max-rows", type=int, help="args.acoustic.max_rows (rows decoded together)")
    g.add_argument("--first-chunk-tokens", type=int, help="args.acoustic.first_chunk_tokens")
    g.add_argument("--chunk-tokens", type=int, help="args.acoustic.chunk_tokens")


def serve_config(a: argparse.Namespace, port: int) -> tuple[dict, dict]:
    """The Serve config with the command line's overrides, and those overrides as the report
    lists them (``serve.overrides``)."""
    base = load_config(a.config)
    overrides = parse_sets(a.set)
    cfg = apply_overrides(base, weights=a.weights, port=port, overrides=overrides)
    shown = dict(overrides)
    args = args_path(cfg)

    def dep(name: str, rest: str, value) -> None:
        set_path(cfg, f"{deployment_path(cfg, name)}.{rest}", value)
        shown[f"{name}.{rest}"] = value

    for flag, name in (
        ("acoustic_cpus", "Acoustic"),
        ("vocoder_cpus", "Vocoder"),
        ("ingress_cpus", "Ingress"),
        ("normalizer_cpus", "TextNormalizer"),
    ):
        if getattr(a, flag) is not None:
            dep(name, "ray_actor_options.num_cpus", getattr(a, flag))
    for flag, name, setter, what in (
        ("acoustic_threads", "Acoustic", set_threads, "threads"),
        ("vocoder_threads", "Vocoder", set_threads, "threads"),
        ("acoustic_replicas", "Acoustic", set_replicas, "replicas"),
        ("vocoder_replicas", "Vocoder", set_replicas, "replicas"),
    ):
        if getattr(a, flag):
            setter(cfg, name, getattr(a, flag))
            shown[f"{name}.{what}"] = getattr(a, flag)
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
    "baseline_levels": "baseline_levels",
    "serve_levels": "serve_levels",
    "loads": "loads_continuous",
    "window_loads": "loads_window",
    "open_s": "open_s",
    "timeout_s": "timeout_s",
    "ceiling_batches": "ceiling_batches",
    "ceiling_reps": "ceiling_reps",
    "ceiling_tokens": "ceiling_tokens",
    "baseline_threads": "baseline_threads",
}


def main(a: argparse.Namespace) -> int:
    phases = tuple(x.strip() for x in a.phases.split(",") if x.strip())
    bad = [x for x in phases if x not in PHASES]
    if bad:
        raise SystemExit(f"unknown phase(s) {bad}; choose from {PHASES}")
    kw: dict = {
        "weights": a.weights,
        "phases": phases,
        "seed": a.seed,
        "front_door": a.front_door,
        "front_guard": a.front_guard == "on",
    }
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
    if a.pin_acoustic:
        # One replica on the pinned cores, a torch thread per core; the rest of the graph elsewhere.
        plan.pin_acoustic = a.pin_acoustic
        cpus = cpu_set(a.pin_acoustic)
        a.acoustic_threads = a.acoustic_threads or len(cpus)
        a.acoustic_replicas = a.acoustic_replicas or 1
    cfg, shown = serve_config(a, free_port())
    if a.out is None:
        a.out = str(Path(__file__).parent / "results" / time.strftime("tmp-%Y%m%d-%H%M%S"))
    out = Path(a.out)
    run = BenchRun(plan, out, cfg, shown, a.ray_cpus, a.argv, show_progress=not a.no_progress)
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
