"""``python -m bench run``: ceiling → baseline → project (closed loop, first audio before/after, open
loop continuous vs window batching), each alone on the machine (bench/README.md, "run").

The ceiling and the baseline server are subprocesses (``python -m bench ceiling`` / ``baseline``);
the project is a local Ray started in this process (bench/lib/serve.py); the report is
bench/run_report.py's, written also when a phase fails or the run is stopped.
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
from typing import Any, Callable, Optional

import httpx

from . import cache_hit
from .lib import first_audio, loadgen
from .lib.corpus import ONE_ROW_TEXTS, corpus_summary, expected_audio_s, plan_corpus, text_stream
from .lib.harness import Harness, floats, ints
from .lib.machine import busy_threads, classify_all, classify_serve, machine_cores, machine_cpu, thread_cpu
from .lib.pinning import cpu_set, pin_acoustic, pin_threads
from .lib.procs import ManagedProcess, bench_command, free_port, kill_descendants, run_to_end
from .lib.sampler import Periodic, RssSampler
from .lib.serve import ServeRunner, engine_delta
from .lib.waiting import holds_within, wait_until
from .run_report import load_key, write_all

PHASES = ("ceiling", "baseline", "serve", "first", "open")
STAGES = ("Acoustic", "Vocoder", "Ingress", "TextNormalizer")


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
        quick = dict(ceiling_batches=[1, 8], ceiling_reps=1, first_chunk_reps=3, baseline_levels=[1, 8])
        quick.update(serve_levels=[1, 8], closed_s={1: 30, 8: 60}, open_s=60.0, loads_continuous=[0.7])
        quick.update(loads_window=[0.7], first_pairs=4, first_per_half=4, drain_s=90.0, timeout_s=180.0)
        return cls(quick=True, **{**quick, **kw})

    def closed_duration(self, c: int) -> float:
        """The phase length of ``c`` clients: that of the nearest planned level at or below it (60 s)."""
        below = [k for k in self.closed_s if k <= c]
        return float(self.closed_s[max(below)]) if below else 60.0

    def planned_s(self) -> dict[str, float]:
        """Each part's planned seconds (the progress bar's), the parts the plan runs."""
        batch_s = {1: 10, 4: 20, 8: 30, 16: 50}
        ceiling = sum(batch_s.get(b, 30) for b in self.ceiling_batches) * self.ceiling_reps * len(self.ceiling_methods)
        est = {  # part: (its phase, seconds)
            "ceiling": ("ceiling", 30 + 10 * self.first_chunk_reps + ceiling),
            "baseline": ("baseline", 30 + sum(self.closed_duration(c) + 10 for c in self.baseline_levels)),
            "serve: closed loop": ("serve", sum(self.closed_duration(c) + 5 for c in self.serve_levels)),
            "serve: first audio before/after": ("first", self.first_pairs * 2 * (self.first_per_half * 3 + 4)),
            "serve: open loop": ("open", (len(self.loads_continuous) + len(self.loads_window)) * (self.open_s + 25)),
        }
        out = {part: s for part, (phase, s) in est.items() if phase in self.phases}
        if any(x in self.phases for x in ("serve", "first", "open")):
            out["serve: starting"] = 60
        return out


class Progress(Periodic):
    """One bar over the whole run in seconds of planned work, the current part in its label."""

    def __init__(self, planned: dict[str, float], enabled: bool = True):
        from tqdm import tqdm

        super().__init__(1.0, "progress")
        form = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} planned s [{elapsed}<{remaining}]"
        self.bar = tqdm(
            total=round(sum(planned.values())), unit="s", desc="bench", disable=not enabled, bar_format=form
        )
        self.planned, self.done_s, self.part_s, self.t0 = planned, 0.0, 0.0, time.monotonic()
        self.start()

    def part(self, name: str) -> None:
        with self._lock:
            self.done_s, self.part_s, self.t0 = self.done_s + self.part_s, self.planned.get(name, 0), time.monotonic()
            self.bar.set_description_str(name)
        self.tick()

    def tick(self) -> None:
        with self._lock:
            n = min(round(self.done_s + min(self.part_s, time.monotonic() - self.t0)), self.bar.total)
            if n > self.bar.n:
                self.bar.update(n - self.bar.n)

    def write(self, msg: str) -> None:
        self.bar.write(msg)

    def close(self) -> None:
        self.stop()
        self.done_s, self.part_s = self.done_s + self.part_s, 0.0
        self.tick()
        self.bar.close()


def line(system: str, label: str, s: dict) -> str:
    """A phase's progress line."""
    eng = s.get("engine") or {}
    return (
        f"{system} {label}: {s['audio_s_per_s']} audio s/s, {s['requests_per_s']} req/s, "
        f"TTFB p50 {s['ttfb_s']['p50']} s, latency p50/p99 {s['latency_s']['p50']}/{s['latency_s']['p99']} s, "
        f"done {s['completed']} err {s['errors']} cut {s['cut']}"
        + (f", mean batch {eng.get('mean_rows_per_step')}" if eng else "")
    )


def overall_rss(phases: dict) -> dict:
    """The peak RSS over phases, in all and per group."""
    peaks = [s.get("rss") or {} for s in phases.values()]
    by: dict[str, float] = {}
    for r in peaks:
        for k, v in (r.get("peak_by_process_mib") or {}).items():
            by[k] = max(by.get(k, 0), v)
    return {"peak_total_mib": max((r.get("peak_total_mib", 0) for r in peaks), default=0.0), "peak_by_process_mib": by}


class BenchRun:
    def __init__(self, plan: RunPlan, out: Path, serve_cfg: dict, overrides: dict, ray_cpus, argv, progress=True):
        from serve_app.settings import AppConfig

        from .lib.config import args_path, get_path

        self.plan, self.out, self.logs = plan, out, out / "logs"
        self.serve_cfg, self.overrides, self.ray_cpus = serve_cfg, overrides, ray_cpus
        self.harness = Harness(out, write_all, argv, quick=plan.quick, weights=plan.weights, plan=asdict(plan))
        self.report = self.harness.report
        self.show_progress = progress
        self._procs: list[ManagedProcess] = []
        self._serve: Optional[ServeRunner] = None
        self._unpinned: Optional[set[int]] = None  # the CPUs this process had before --pin-acoustic
        # The deployed settings (the config's args over the code's defaults): the ceiling and the
        # baseline cut the same segments and chunks as the project.
        self.args = get_path(serve_cfg, args_path(serve_cfg)) or {}
        self.segments = AppConfig.model_validate(self.args).segments.model_dump()

    def run(self) -> dict:
        with self.harness:
            self.logs.mkdir(exist_ok=True)
            planned = plan_corpus(segments=self.segments)
            self.expected = expected_audio_s(planned)
            self.corpus = self.report["corpus"] = corpus_summary(planned)
            self.progress = Progress(self.plan.planned_s(), enabled=self.show_progress)
            try:
                if "ceiling" in self.plan.phases:
                    self.run_ceiling()
                if "baseline" in self.plan.phases:
                    self.run_baseline()
                if any(x in self.plan.phases for x in ("serve", "first", "open")):
                    self.run_serve()
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

    # ---------------------------------------------------------- ceiling and baseline

    def run_ceiling(self) -> None:
        p, path = self.plan, self.out / "ceiling.json"
        self.progress.part("ceiling")
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
        argv += ["--cpus", p.pin_acoustic] if p.pin_acoustic else []
        rc, log_tail = run_to_end("ceiling", bench_command("ceiling", *argv), self.logs / "ceiling.log", timeout_s=3600)
        if rc != 0 or not path.exists():
            raise RuntimeError(f"ceiling failed (rc {rc}):\n{log_tail}")
        c = self.report["ceiling"] = json.loads(path.read_text())
        raw = c.get("first_chunk", {}).get("raw_s")
        self.progress.write(f"ceiling: {c.get('ceiling')} audio s/s by batch; first chunk raw {raw} s")

    def _closed(self, target: loadgen.Target, c: int) -> dict:
        seed = self.plan.seed + c
        texts = text_stream(seed)
        run = asyncio.run(loadgen.closed_loop(target, c, self.plan.closed_duration(c), texts, self.expected, seed=seed))
        s = loadgen.summarize(run)
        if target.name == "serve" and self._serve is not None:
            # Where the first audio went, hop by hop (the Ingress's log lines of these requests).
            time.sleep(0.5)  # the last requests' lines reach the log file
            s["first_audio"] = first_audio.breakdown(run.records, first_audio.read_ingress_log(self._serve.session_dir))
        return s

    def run_baseline(self) -> None:
        p, port = self.plan, free_port()
        self.progress.part("baseline")
        argv = ["--port", str(port), "--weights", p.weights, "--segments", json.dumps(self.segments)]
        argv += ["--threads", str(p.baseline_threads)] if p.baseline_threads else []
        proc = ManagedProcess("baseline", bench_command("baseline", *argv), self.logs / "baseline.log")
        self._procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def get(path: str) -> httpx.Response:
            if not proc.alive():
                raise RuntimeError(f"baseline exited:\n{proc.log_tail()}")
            return httpx.get(url + path, timeout=5, trust_env=False)

        def idle() -> bool:
            try:
                s = get("/stats").json()
            except httpx.HTTPError:
                return False
            return not s["busy"] and not s["locked"] and s["waiting"] == 0

        t0 = time.perf_counter()
        healthy = lambda: get("/healthz").status_code == 200  # noqa: E731
        wait_until(healthy, 600, 1.0, what=lambda: f"baseline healthy:\n{proc.log_tail()}", retry_on=(httpx.HTTPError,))
        base = self.report["baseline"] = {"start_s": round(time.perf_counter() - t0, 1), "pid": proc.pid, "closed": {}}
        sampler = RssSampler(lambda: [proc.pid], classify_all).start()
        target = loadgen.Target(url, "baseline", streaming=False, timeout_s=p.timeout_s)
        try:
            for c in p.baseline_levels:
                sampler.window()
                s = base["closed"][str(c)] = self._closed(target, c)
                s["rss"] = sampler.window()
                self.progress.write(line("baseline", f"c{c}", s))
                if not holds_within(idle, p.timeout_s):
                    self.harness.warn(f"baseline still busy {p.timeout_s}s after c{c}")
            base["rss_peak"] = overall_rss(base["closed"])
            base["server_stats"] = get("/stats").json() if idle() else None
        finally:
            sampler.stop()
            proc.stop()
            self._procs.remove(proc)

    # ---------------------------------------------------------- the project

    def run_serve(self) -> None:
        p = self.plan
        self.progress.part("serve: starting")
        serve = self._serve = ServeRunner(
            self.serve_cfg, self.ray_cpus, front_door=p.front_door, front_guard=p.front_guard
        )
        res: dict[str, Any] = {
            "start_s": round(serve.start(), 1),
            "closed": {},
            "open": {},
            "overrides": self.overrides,
        }
        res.update(config=self.serve_cfg, ray_session=serve.session_dir and self.harness.path(serve.session_dir))
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
                self.progress.part("serve: closed loop")
                for c in p.serve_levels:
                    profile = f"c{c}" if (p.profile and c == p.profile_level) else None
                    s = res["closed"][str(c)] = self._phase(sampler, lambda c=c: self._closed(target, c), profile, c)
                    self.progress.write(line("serve", f"c{c}", s))
            if "first" in p.phases:
                self.progress.part("serve: first audio before/after")
                ab = res["first_audio_ab"] = first_audio.ab_pairs(
                    serve, target, p.first_pairs, p.first_per_half, ONE_ROW_TEXTS
                )
                self.progress.write(first_audio.ab_line(ab))
            if "open" in p.phases:
                self.progress.part("serve: open loop")
                self._open_phases(sampler, target, res)
            if "serve" in p.phases:
                # Cache-hit path: one 10-second wav synthesised once, then answered from the cache.
                hit = res["cache_hit"] = asyncio.run(cache_hit.measure(serve.base_url, n=100 if p.quick else 300))
                self.progress.write(
                    f"cache hit p50 {hit['hit_p50_ms']} ms (from the Ingress {hit['ingress_hit_p50_ms']} ms), "
                    f"{hit['hit_req_per_s']} req/s"
                )
            opened = {f"{m}{k}": v for m, d in res["open"].items() for k, v in d.items() if isinstance(v, dict)}
            res["rss_peak"] = overall_rss({**res["closed"], **opened})
            res["engine_total"] = serve.acoustic_stats()
        finally:
            sampler.stop()

    def _phase(self, sampler: RssSampler, load: Callable[[], dict], profile: Optional[str] = None, c: int = 0) -> dict:
        """One load phase with what the project did meanwhile: the replicas' threads, every process's
        cores, the peak RSS, the engine's counters (and a py-spy profile of the replicas)."""
        serve = self._serve
        before = serve.acoustic_stats()
        sampler.window()
        pids = {g: p for g, p in serve.replica_pids().items() if g in STAGES}
        cpu0 = {g: [thread_cpu(pid) for pid in p] for g, p in pids.items()}
        machine0 = machine_cpu()
        rec = None
        if profile:
            from .lib.pyspy import Recorder

            rec = Recorder(self.out / "profile", self.harness.path)
            for g in STAGES[:3]:
                for i, pid in enumerate(pids.get(g, [])):
                    if not rec.start(f"{g.lower()}{i or ''}_{profile}", pid, self.plan.closed_duration(c)):
                        self.harness.warn("py-spy not found: no profile")
        t0 = time.perf_counter()
        s = load()
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

    def _open(self, target: loadgen.Target, rate: float, load: float, mode: str) -> dict:
        # Same arrivals and texts for both batching modes; distinct request seeds per mode.
        seed = self.plan.seed + 1000 + int(round(load * 100))
        kw = {"request_seed_base": seed + (0 if mode == "continuous" else 500000)}
        p = self.plan
        run = loadgen.open_loop(target, rate, p.open_s, text_stream(seed), seed, p.drain_s, self.expected, **kw)
        return {**loadgen.summarize(asyncio.run(run)), "load": load}

    def _open_phases(self, sampler: RssSampler, target: loadgen.Target, res: dict) -> None:
        p, closed = self.plan, res["closed"]
        best = max((s["audio_s_per_s"] for s in closed.values() if s.get("audio_s_per_s")), default=None)
        source = "closed loop"
        if best is None:  # open loop alone: measure capacity at 8 clients first
            s = closed["8"] = self._phase(sampler, lambda: self._closed(target, 8))
            best, source = s["audio_s_per_s"], "closed loop c8 (measured for the open loop)"
        mean_audio = self.corpus["mean_audio_s_per_request"]
        cap = res["capacity"] = {
            "audio_s_per_s": best,
            "mean_audio_s_per_request": round(mean_audio, 3),
            "requests_per_s": round(best / mean_audio, 4),
            "source": source,
        }
        for mode, loads in (("continuous", p.loads_continuous), ("window", p.loads_window)):
            if not loads:
                continue
            self._serve.reconfigure_acoustic(continuous=(mode == "continuous"))
            res["open"][mode] = {}
            for load in loads:
                rate = load * cap["requests_per_s"]
                s = self._phase(sampler, lambda rate=rate, load=load, mode=mode: self._open(target, rate, load, mode))
                res["open"][mode][load_key(load)] = s
                self.progress.write(
                    f"open {mode} {int(load * 100)}% ({rate:.3f} req/s): latency mean {s['latency_s']['mean']} s "
                    f"p95 {s['latency_s']['p95']} s, TTFB mean {s['ttfb_s']['mean']} s, done {s['completed']}/{s['sent']}, "
                    f"err {s['errors']} cut {s['cut']}, mean batch {(s.get('engine') or {}).get('mean_rows_per_step')}"
                )
        self._serve.reconfigure_acoustic(continuous=True)


# ------------------------------------------------------------------ command line

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
# Deployment options: (flag, deployment, what it sets: a path under the deployment, or threads / replicas).
_DEPLOYMENT_OPTIONS = (
    ("acoustic_cpus", "Acoustic", "ray_actor_options.num_cpus"),
    ("vocoder_cpus", "Vocoder", "ray_actor_options.num_cpus"),
    ("ingress_cpus", "Ingress", "ray_actor_options.num_cpus"),
    ("normalizer_cpus", "TextNormalizer", "ray_actor_options.num_cpus"),
    ("acoustic_threads", "Acoustic", "threads"),
    ("vocoder_threads", "Vocoder", "threads"),
    ("acoustic_replicas", "Acoustic", "replicas"),
    ("vocoder_replicas", "Vocoder", "replicas"),
    ("max_batch_size", "Acoustic", "user_config.max_batch_size"),
    ("batch_wait_s", "Acoustic", "user_config.batch_wait_timeout_s"),
    ("max_ongoing", "Acoustic", "max_ongoing_requests"),
)


_HELP = {"threads": "OMP/MKL threads of its replicas", "replicas": "a fixed replica count (autoscaling off)"}


def add_arguments(r: argparse.ArgumentParser) -> None:
    add = r.add_argument
    add(
        "--quick",
        action="store_true",
        help="~10 min on 2 cores: c1 and c8, ceiling b1/b8, first audio A/B, open loop 70%%",
    )
    add("--out", help="output directory (default bench/results/tmp-<date-time>, git-ignored)")
    add("--weights", default="random", choices=["random", "random-tiny"], help="random-tiny only checks the tooling")
    add("--phases", default=",".join(PHASES), help=f"comma list of {','.join(PHASES)} (default all)")
    add("--levels", type=ints, help="closed-loop concurrencies for baseline and project, e.g. 1,2,4,8,16")
    add("--baseline-levels", type=ints)
    add("--serve-levels", type=ints)
    add("--loads", type=floats, help="open-loop loads (fractions of capacity), continuous batching")
    add("--window-loads", type=floats, help="open-loop loads for window batching")
    add("--duration-scale", type=float, default=1.0, help="multiply every closed/open phase's duration")
    add("--open-s", type=float, help="open-loop arrival period per load point (s)")
    add("--timeout-s", type=float, help="per-request timeout")
    add("--ceiling-batches", type=ints)
    add("--ceiling-reps", type=int)
    add("--ceiling-tokens", type=int, help="tokens per row in the ceiling (default: corpus mean segment)")
    add("--baseline-threads", type=int, help="torch threads of the baseline (default: torch's, all cores)")
    add("--seed", type=int, default=0)
    add(
        "--front-guard", default="on", choices=["on", "off"], help="the proxy's middlewares as the README installs them"
    )
    add("--front-door", default="proxy", choices=["proxy", "haproxy"], help="Serve's proxy, or Ray's HAProxy")
    add("--profile", action="store_true", help="py-spy the Acoustic/Vocoder/Ingress replicas during one closed loop")
    add("--profile-level", type=int, default=8, help="the closed-loop concurrency to profile (default 8)")
    pin = "e.g. 0: the Acoustic replica and the ceiling on these CPUs (a torch thread each), the rest elsewhere (Linux)"
    add("--pin-acoustic", default="", metavar="CPUS", help=pin)
    add("--no-progress", action="store_true")
    g = r.add_argument_group("project deployment (overrides of the Serve config)").add_argument
    g("--config", help="Serve config file (default config/serve.yaml)")
    example = "applications.chattts.deployments.Acoustic.max_ongoing_requests=64"
    g("--set", action="append", default=[], metavar="PATH=VALUE", help=f"any config value, e.g. {example} (YAML)")
    g("--ray-cpus", type=float, help="CPUs Ray may schedule (default: os.cpu_count())")
    for flag, dep, what in _DEPLOYMENT_OPTIONS:
        kind = float if flag.endswith(("_cpus", "_s")) else int
        g("--" + flag.replace("_", "-"), type=kind, help=f"{dep}: " + _HELP.get(what, what))
    g("--torch-threads", type=int, help="args.model.torch_threads (torch.set_num_threads in every model stage)")
    for flag in ("max_rows", "first_chunk_tokens", "chunk_tokens"):
        g("--" + flag.replace("_", "-"), type=int, help=f"args.acoustic.{flag}")


def serve_config(a: argparse.Namespace, port: int) -> tuple[dict, dict]:
    """The Serve config with the command line's overrides, and those overrides as the report
    lists them (``serve.overrides``)."""
    from .lib import config

    overrides = config.parse_sets(a.set)
    cfg = config.apply_overrides(config.load_config(a.config), weights=a.weights, port=port, overrides=overrides)
    shown = dict(overrides)
    for flag, dep, what in _DEPLOYMENT_OPTIONS:
        value = getattr(a, flag)
        if value is None or (what in ("threads", "replicas") and not value):
            continue
        if what in ("threads", "replicas"):
            (config.set_threads if what == "threads" else config.set_replicas)(cfg, dep, int(value))
        else:
            config.set_path(cfg, f"{config.deployment_path(cfg, dep)}.{what}", value)
        shown[f"{dep}.{what}"] = value
    acoustic = {k: getattr(a, k) for k in ("max_rows", "first_chunk_tokens", "chunk_tokens")}
    for key, value in [*[(f"acoustic.{k}", v) for k, v in acoustic.items()], ("model.torch_threads", a.torch_threads)]:
        if value is not None:
            config.set_path(cfg, f"{config.args_path(cfg)}.{key}", value)
            shown[key] = value
    return cfg, shown


def main(a: argparse.Namespace) -> int:
    phases = tuple(x.strip() for x in a.phases.split(",") if x.strip())
    bad = [x for x in phases if x not in PHASES]
    if bad:
        raise SystemExit(f"unknown phase(s) {bad}; choose from {PHASES}")
    kw: dict = dict(weights=a.weights, phases=phases, seed=a.seed, front_door=a.front_door)
    kw.update(front_guard=a.front_guard == "on", profile=a.profile, profile_level=a.profile_level)
    plan = RunPlan.quick_plan(**kw) if a.quick else RunPlan(**kw)
    if a.levels:
        plan.baseline_levels = plan.serve_levels = a.levels
    for option, plan_field in _PLAN_OPTIONS.items():
        value = getattr(a, option)
        # Load lists may be given empty (no open-loop points); other options only when set.
        if value is not None if option in ("loads", "window_loads") else value:
            setattr(plan, plan_field, value)
    if a.duration_scale != 1.0:
        plan.closed_s = {k: v * a.duration_scale for k, v in plan.closed_s.items()}
        plan.open_s *= a.duration_scale
    if "8" not in map(str, plan.ceiling_batches) and "ceiling" in phases:
        plan.ceiling_batches = sorted(set(plan.ceiling_batches) | {8})
    if a.pin_acoustic:
        # One replica on the pinned cores, a torch thread per core; the rest of the graph elsewhere.
        plan.pin_acoustic = a.pin_acoustic
        a.acoustic_threads = a.acoustic_threads or len(cpu_set(a.pin_acoustic))
        a.acoustic_replicas = a.acoustic_replicas or 1
    cfg, shown = serve_config(a, free_port())
    out = Path(a.out or Path(__file__).parent / "results" / time.strftime("tmp-%Y%m%d-%H%M%S"))
    run = BenchRun(plan, out, cfg, shown, a.ray_cpus, a.argv, progress=not a.no_progress)
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
