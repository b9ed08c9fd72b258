"""One benchmark run: ceiling → baseline → project (closed loop, then open loop continuous vs
window), each alone on the machine, everything it starts stopped at the end (also on errors and
Ctrl-C), and the report written (also partially, if a phase failed)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

import httpx

from . import cache_hit, loadgen
from .corpus import corpus_summary, plan_corpus, text_stream
from .procs import (
    ManagedProcess,
    RssSampler,
    bench_env,
    classify_all,
    classify_serve,
    free_port,
    kill_descendants,
    load_average,
    busy_threads,
    python_module,
    thread_cpu,
    wait_until,
)
from .report import load_key, write_all
from .serve_runner import ServeRunner, args_path, engine_delta, get_path

PHASES = ("ceiling", "baseline", "serve", "open")


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
    profile: bool = False  # py-spy the replicas during the closed loop at profile_level clients
    profile_level: int = 8

    @classmethod
    def quick_plan(cls, **kw) -> "RunPlan":
        base = dict(quick=True, ceiling_batches=[1, 8], ceiling_reps=1, first_chunk_reps=3,
                    baseline_levels=[1, 8], serve_levels=[1, 8], closed_s={1: 30, 8: 60}, open_s=60.0,
                    loads_continuous=[0.7], loads_window=[0.7], drain_s=90.0, timeout_s=180.0)
        base.update(kw)
        return cls(**base)

    def closed_duration(self, c: int) -> float:
        if c in self.closed_s:
            return float(self.closed_s[c])
        return float(self.closed_s[max(k for k in self.closed_s if k <= c)] if any(k <= c for k in self.closed_s) else 60)


class Progress:
    """One bar over the whole run, in seconds of planned work; the current phase in its label."""

    def __init__(self, total_s: float, enabled: bool = True):
        from tqdm import tqdm

        self.bar = tqdm(total=round(total_s), unit="s", desc="bench", disable=not enabled, dynamic_ncols=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} planned s [{elapsed}<{remaining}]")
        self.done_s = 0.0
        self.phase_s = 0.0
        self.phase_t0 = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._t = threading.Thread(target=self._tick, daemon=True)
        self._t.start()

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

    def _tick(self) -> None:
        while not self._stop.wait(1.0):
            with self._lock:
                self._update()

    def write(self, msg: str) -> None:
        self.bar.write(msg)

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self.done_s += self.phase_s
            self.phase_s = 0
            self._update()
        self.bar.close()


def _git() -> str:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                             cwd=Path(__file__).parent).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, timeout=5,
                               cwd=Path(__file__).parent).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except Exception:  # noqa: BLE001
        return "unknown"


def _now() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


class BenchRun:
    def __init__(self, plan: RunPlan, out: Path, serve_cfg: dict, overrides: dict, ray_cpus: Optional[float],
                 command: str, show_progress: bool = True):
        self.plan = plan
        self.out = out
        self.logs = out / "logs"
        self.serve_cfg = serve_cfg
        self.overrides = overrides
        self.ray_cpus = ray_cpus
        self.report: dict[str, Any] = {"meta": {}, "warnings": []}
        self.command = command
        self.show_progress = show_progress
        self._procs: list[ManagedProcess] = []
        self._serve: Optional[ServeRunner] = None
        args = get_path(serve_cfg, args_path(serve_cfg)) or {}
        self.segments = dict(args.get("segments") or {})  # the project's SegmentLimits: same segments everywhere
        acoustic = args.get("acoustic") or {}
        self.first_chunk_tokens = int(acoustic.get("first_chunk_tokens", 12))
        self.chunk_tokens = int(acoustic.get("chunk_tokens", 24))
        self.vocoder_cfg = args.get("vocoder") or {}

    # -------------------------------------------------------------- planning

    def planned_seconds(self) -> dict[str, float]:
        p = self.plan
        est: dict[str, float] = {}
        if "ceiling" in p.phases:
            per = {1: 10, 4: 20, 8: 30, 16: 50}
            est["ceiling"] = 30 + 10 * p.first_chunk_reps + sum(per.get(b, 30) for b in p.ceiling_batches) * p.ceiling_reps * len(p.ceiling_methods)
        if "baseline" in p.phases:
            est["baseline"] = 30 + sum(p.closed_duration(c) + 10 for c in p.baseline_levels)
        if "serve" in p.phases or "open" in p.phases:
            est["serve_start"] = 60
        if "serve" in p.phases:
            est["serve"] = sum(p.closed_duration(c) + 5 for c in p.serve_levels)
        if "open" in p.phases:
            est["open"] = (len(p.loads_continuous) + len(p.loads_window)) * (p.open_s + 25) + 10
        return est

    # -------------------------------------------------------------- phases

    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        t_start = time.perf_counter()
        import psutil

        self.report["meta"] = {
            "started": _now(),
            "quick": self.plan.quick,
            "command": self.command,
            "cpus": os.cpu_count(),
            "mem_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": f"{platform.system()} {platform.machine()} python {platform.python_version()}",
            "loadavg_start": load_average(),
            "weights": self.plan.weights,
            "git": _git(),
            "plan": asdict(self.plan),
        }
        planned = plan_corpus(segments=self.segments)
        self.expected = {text: sum(512 * t - 256 for t in toks) / 24000 for text, toks, _ in planned}
        self.corpus = corpus_summary(planned)
        self.report["corpus"] = self.corpus
        est = self.planned_seconds()
        self.progress = Progress(sum(est.values()), enabled=self.show_progress)
        self._install_signal_handlers()
        try:
            if "ceiling" in self.plan.phases:
                self.progress.phase("ceiling", est["ceiling"])
                self.run_ceiling()
            if "baseline" in self.plan.phases:
                self.progress.phase("baseline", est["baseline"])
                self.run_baseline()
            if "serve" in self.plan.phases or "open" in self.plan.phases:
                self.run_serve(est)
        except BaseException as exc:  # noqa: BLE001 - write what we have, then re-raise
            self.report["error"] = f"{exc.__class__.__name__}: {exc}"
            raise
        finally:
            self.cleanup()
            self.progress.close()
            self.report["meta"]["finished"] = _now()
            self.report["meta"]["wall_s"] = round(time.perf_counter() - t_start, 1)
            self.report["meta"]["loadavg_end"] = load_average()
            write_all(self.report, self.out)
        return self.report

    def _install_signal_handlers(self) -> None:
        def on_term(signum, frame):
            raise KeyboardInterrupt(f"signal {signum}")

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)

    def cleanup(self) -> None:
        for p in self._procs:
            p.stop()
        self._procs.clear()
        if self._serve is not None:
            self._serve.stop()
            self._serve = None
        left = kill_descendants(os.getpid())
        if left:
            self.report["warnings"].append(f"stopped leftover child processes: {left}")

    # ---------------------------------------------------------- ceiling

    def run_ceiling(self) -> None:
        p = self.plan
        path = self.out / "ceiling.json"
        argv = python_module(
            "bench.ceiling", "--out", str(path), "--weights", p.weights,
            "--batches", ",".join(map(str, p.ceiling_batches)), "--methods", ",".join(p.ceiling_methods),
            "--reps", str(p.ceiling_reps), "--tokens", str(p.ceiling_tokens), "--segments", json.dumps(self.segments),
            "--first-chunk-tokens", str(self.first_chunk_tokens), "--chunk-tokens", str(self.chunk_tokens),
            "--first-chunk-reps", str(p.first_chunk_reps), "--vocoder", json.dumps(self.vocoder_cfg),
        )
        proc = ManagedProcess("ceiling", argv, self.logs / "ceiling.log", env=bench_env(), cwd=str(Path(__file__).parents[1]))
        self._procs.append(proc)
        rc = proc.wait(timeout=3600)
        proc.stop()
        self._procs.remove(proc)
        if rc != 0 or not path.exists():
            raise RuntimeError(f"ceiling failed (rc {rc}):\n{proc.log_tail()}")
        self.report["ceiling"] = json.loads(path.read_text())
        c = self.report["ceiling"]
        self.progress.write(f"ceiling: {c['ceiling']} audio s/s by batch; first chunk raw {c.get('first_chunk', {}).get('raw_s')} s")

    # ---------------------------------------------------------- load phases

    def _closed(self, target: loadgen.Target, c: int) -> dict:
        run = asyncio.run(loadgen.closed_loop(target, c, self.plan.closed_duration(c),
                                              text_stream(self.plan.seed + c), self.expected, seed=self.plan.seed + c))
        return loadgen.summarize(run)

    def _open(self, target: loadgen.Target, rate: float, load: float, mode: str) -> dict:
        # Same arrivals and texts for both batching modes; distinct request seeds per mode.
        seed = self.plan.seed + 1000 + int(round(load * 100))
        run = asyncio.run(loadgen.open_loop(target, rate, self.plan.open_s, text_stream(seed), seed=seed,
                                            drain_s=self.plan.drain_s, expected=self.expected,
                                            request_seed_base=seed + (0 if mode == "continuous" else 500000)))
        s = loadgen.summarize(run)
        s["load"] = load
        return s

    def _line(self, system: str, label: str, s: dict) -> str:
        eng = s.get("engine") or {}
        return (f"{system} {label}: {s['audio_s_per_s']} audio s/s, {s['requests_per_s']} req/s, "
                f"TTFB p50 {s['ttfb_s']['p50']} s, latency p50/p99 {s['latency_s']['p50']}/{s['latency_s']['p99']} s, "
                f"done {s['completed']} err {s['errors']} cut {s['cut']}"
                + (f", mean batch {eng.get('mean_rows_per_step')}" if eng else ""))

    def run_baseline(self) -> None:
        p = self.plan
        port = free_port()
        argv = python_module("bench.baseline", "--port", str(port), "--weights", p.weights, "--segments", json.dumps(self.segments))
        if p.baseline_threads:
            argv += ["--threads", str(p.baseline_threads)]
        proc = ManagedProcess("baseline", argv, self.logs / "baseline.log", env=bench_env(), cwd=str(Path(__file__).parents[1]))
        self._procs.append(proc)
        url = f"http://127.0.0.1:{port}"

        def healthy() -> bool:
            if not proc.alive():
                raise RuntimeError(f"baseline exited:\n{proc.log_tail()}")
            try:
                return httpx.get(f"{url}/healthz", timeout=5, trust_env=False).status_code == 200
            except httpx.HTTPError:
                return False

        t0 = time.perf_counter()
        if not wait_until(healthy, timeout=600, interval=1.0):
            raise TimeoutError(f"baseline not healthy after 600s:\n{proc.log_tail()}")
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
                if not wait_until(idle, timeout=p.timeout_s, interval=0.5):
                    self.report["warnings"].append(f"baseline still busy {p.timeout_s}s after c{c}")
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
        serve = ServeRunner(self.serve_cfg, ray_cpus=self.ray_cpus, front_door=self.plan.front_door)
        self._serve = serve
        start_s = serve.start()
        res: dict[str, Any] = {"start_s": round(start_s, 1), "closed": {}, "open": {}, "overrides": self.overrides,
                               "config": self.serve_cfg, "ray_session_dir": serve.session_dir}
        self.report["serve"] = res
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
                    res["closed"][str(c)] = self._serve_phase(serve, sampler, lambda: self._closed(target, c),
                                                              profile=prof, profile_s=p.closed_duration(c))
                    self.progress.write(self._line("serve", f"c{c}", res["closed"][str(c)]))
            if "open" in p.phases:
                self.progress.phase("serve: open loop", est["open"])
                self._open_phases(serve, sampler, target, res)
            if "serve" in p.phases:
                # Cache-hit path: one 10-second wav synthesised once, then answered from the cache.
                self.progress.write("serve: cache-hit path")
                res["cache_hit"] = asyncio.run(cache_hit.measure(serve.base_url, n=100 if p.quick else 300))
                self.progress.write(f"cache hit p50 {res['cache_hit']['hit_p50_ms']} ms, "
                                    f"{res['cache_hit']['hit_req_per_s']} req/s")
            res["rss_peak"] = self._overall_rss({**res["closed"], **{f"{m}{k}": v for m, d in res["open"].items() for k, v in d.items() if isinstance(v, dict)}})
            res["engine_total"] = serve.acoustic_stats()
        finally:
            sampler.stop()

    def _serve_phase(self, serve: ServeRunner, sampler: RssSampler, fn, profile: Optional[str] = None,
                     profile_s: float = 0.0) -> dict:
        before = serve.acoustic_stats()
        sampler.window()
        pids = {g: p for g, p in serve.replica_pids().items() if g in ("Acoustic", "Vocoder", "Ingress", "TextNormalizer")}
        cpu0 = {g: [thread_cpu(pid) for pid in p] for g, p in pids.items()}
        rec = None
        if profile:
            from .profile import Recorder

            rec = Recorder(self.out / "profile")
            for g in ("Acoustic", "Vocoder", "Ingress"):
                for i, pid in enumerate(pids.get(g, [])):
                    if not rec.start(f"{g.lower()}{i or ''}_{profile}", pid, profile_s):
                        self.report["warnings"].append("py-spy not found: no profile")
        t0 = time.perf_counter()
        s = fn()
        wall = time.perf_counter() - t0
        if rec is not None:
            self.report["serve"].setdefault("profile", {})[profile] = rec.finish()
        s["replica_threads"] = {g: [busy_threads(b, thread_cpu(pid), wall) for b, pid in zip(cpu0[g], p)]
                                for g, p in pids.items()}
        if s.get("cache_hits"):
            self.report["warnings"].append(f"{s['cache_hits']} responses came from the response cache")
        s["rss"] = sampler.window()
        if not serve.wait_idle(self.plan.timeout_s):
            self.report["warnings"].append("Acoustic engine still busy after a phase")
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
        cap = {"audio_s_per_s": best, "mean_audio_s_per_request": round(mean_audio, 3),
               "requests_per_s": round(best / mean_audio, 4), "source": source}
        res["capacity"] = cap
        for mode, loads in (("continuous", p.loads_continuous), ("window", p.loads_window)):
            if not loads:
                continue
            serve.reconfigure_acoustic(continuous=(mode == "continuous"))
            res["open"][mode] = {}
            for load in loads:
                rate = load * cap["requests_per_s"]
                s = self._serve_phase(serve, sampler, lambda: self._open(target, rate, load, mode))
                res["open"][mode][load_key(load)] = s
                self.progress.write(f"open {mode} {int(load * 100)}% ({rate:.3f} req/s): latency mean {s['latency_s']['mean']} s "
                                    f"p95 {s['latency_s']['p95']} s, TTFB mean {s['ttfb_s']['mean']} s, done {s['completed']}/{s['sent']}, "
                                    f"err {s['errors']} cut {s['cut']}, mean batch {(s.get('engine') or {}).get('mean_rows_per_step')}")
        serve.reconfigure_acoustic(continuous=True)
