"""``python -m bench abuse``: a polite client's first audio alone and under every attacker of
bench/abuse_attackers.py at once (``--only`` names a few), in alternating phases (bench/README.md,
"abuse"): the ratio of the p50s (target <= 1.5), what each attacker got, the Ingress's longest
event-loop stall, the cores each part of the machine used, the replicas' peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import httpx

from .abuse_attackers import ATTACKER_KEY, ATTACKERS, POLITE_KEY, Tally, apply_only, delete_jobs
from .abuse_attackers import add_arguments as add_attacker_arguments
from .lib.harness import Harness
from .lib.report import Col, Doc, Kind, failed, ms
from .lib.serve import add_app_arguments
from .lib.stats import percentiles, ratio

POLITE_TEXT = "你好，欢迎使用语音合成服务。"
TARGET_RATIO = 1.5


# ---------------------------------------------------------------------------------------- the polite client


async def polite_requests(url: str, n: int, seed0: int) -> list[Optional[float]]:
    """``n`` requests one after another; each one's seconds to its first audio byte (None: failed)."""
    out: list[Optional[float]] = []
    headers = {"Authorization": f"Bearer {POLITE_KEY}", "Cache-Control": "no-store"}
    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as client:
        for i in range(n):
            body = {
                "model": "chattts",
                "input": POLITE_TEXT,
                "voice": "nova",
                "seed": seed0 + i,
                "response_format": "pcm",
            }
            t0 = time.perf_counter()
            first = None
            try:
                async with client.stream("POST", "/v1/audio/speech", json=body, headers=headers) as r:
                    async for chunk in r.aiter_raw():
                        if chunk and first is None and r.status_code == 200:
                            first = time.perf_counter() - t0
            except httpx.HTTPError:
                first = None
            out.append(first)
    return out


# ---------------------------------------------------------------------------------------- one run


async def attacked(url: str, a: argparse.Namespace, seed0: int, tallies: dict[str, Tally]) -> list[Optional[float]]:
    """The polite client's requests while every attacker runs (after ``--ramp-s`` to get going);
    then the attacking key's jobs deleted."""
    stop = asyncio.Event()
    attackers = [
        asyncio.ensure_future(fn(url, a, stop, tallies[name]))
        for name, (fn, dest, _, _) in ATTACKERS.items()
        if getattr(a, dest)
    ]
    try:
        await asyncio.sleep(a.ramp_s)
        return await polite_requests(url, a.requests, seed0)
    finally:
        stop.set()
        for task in attackers:
            task.cancel()
        await asyncio.gather(*attackers, return_exceptions=True)
        if a.dot_jobs:
            await delete_jobs(url, tallies["dot-jobs"])


def summarize(values: list[Optional[float]]) -> dict:
    ok = [v for v in values if v is not None]
    return {**percentiles(ok, (50, 90), extras=("max",)), "n": len(values), "failed": len(values) - len(ok)}


FIRST_AUDIO = [
    Col("polite client, first audio", 0),
    Col("n", lambda x: x[1]["n"]),
    Col("failed", lambda x: x[1]["failed"]),
    Col("p50 ms", lambda x: ms(x[1]["p50"]), nd=0),
    Col("p90 ms", lambda x: ms(x[1]["p90"]), nd=0),
]
PHASES = ("alone", "attacked")


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Abuse benchmark, {m['started']}", m["command"])
    doc.add(
        f"weights: {m['weights']}; front guard: {m.get('front_guard', 'off')}; "
        f"load average at start {m.get('loadavg_start')}",
        "",
    )
    if "error" in report:
        doc.add(failed(report), "")
    phases = [
        (name, s) for name, s in (("alone", report.get("alone", {})), ("under attack", report.get("attacked", {}))) if s
    ]
    doc.table(FIRST_AUDIO, phases, before=())
    if "ratio_p50" in report:
        met = report["ratio_p50"] is not None and report["ratio_p50"] <= TARGET_RATIO
        doc.add(
            "",
            f"**p50 under attack / alone: {report['ratio_p50']}** (target <= {TARGET_RATIO}: "
            f"{'met' if met else 'missed'})",
        )
    slowest = report.get("attackers_slowest_s", {})

    def got(item: tuple) -> str:
        name, outcomes = item
        s = slowest.get(name, {})
        return ", ".join(f"{k}: {v}" + (f" ({s[k]} s)" if k in s else "") for k, v in sorted(outcomes.items()))

    attackers = [Col("attacker", 0), Col("what it got: count (slowest answer)", got)]
    doc.table(attackers, report.get("attackers", {}).items())
    stall = report.get("ingress_loop_stall_ms")
    if stall:
        cols = [Col("Ingress event loop, longest stall ms", 1)] + [
            Col(h, lambda x, ph=ph: str(stall.get(ph, {}).get(x[0], "–")))
            for h, ph in zip(("alone", "under attack"), PHASES)
        ]
        doc.table(cols, [("longest_ms", "late wake"), ("longest_busy_ms", "while the process ran")])
    cores = report.get("cpu_cores")
    if cores:
        walls = report.get("phase_wall_s", {})
        head = f"cores used (CPU s per s; phases {walls.get('alone')} s / {walls.get('attacked')} s in all)"
        cols = [Col(head, lambda g: g)] + [
            Col(h, lambda g, ph=ph: str(cores.get(ph, {}).get(g, "–")))
            for h, ph in zip(("alone", "under attack"), PHASES)
        ]
        doc.table(cols, sorted(set().union(*cores.values())))
    rss = report.get("rss_peak_mib")
    if rss:
        cols = [
            Col("replica", 0),
            Col("peak RSS MiB, alone", lambda x: str(x[1])),
            Col("under attack", lambda x: str(rss.get("attacked", {}).get(x[0], "–"))),
        ]
        doc.table(cols, rss.get("alone", {}).items())
    return doc


KIND = Kind("abuse.json", to_doc, indent=1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_app_arguments(p, url="a running app whose keys include the bench's two (default: start config/serve.yaml)")
    p.add_argument("--rounds", type=int, default=2, help="alone/attacked pairs")
    p.add_argument("--requests", type=int, default=12, help="polite requests per phase")
    p.add_argument("--ramp-s", type=float, default=8.0, help="attackers run this long before the polite client starts")
    add_attacker_arguments(p)
    p.add_argument(
        "--front-guard",
        default="on",
        choices=["on", "off"],
        help="the front guard in Serve's proxy (deployments/proxy/front_guard.py), with its default settings",
    )
    p.add_argument("--out", help="write abuse.json and report.md here")


def ingress_stall(app: str, reset: bool = False) -> Optional[dict]:
    """The Ingress's longest event-loop stall (``Ingress.loop_stall``: one replica in the config)."""
    from ray import serve

    try:
        return serve.get_app_handle(app).loop_stall.remote(reset=reset).result(timeout_s=30)
    except Exception as exc:  # noqa: BLE001 - a bonus, not a failure
        print(f"Ingress.loop_stall failed: {exc}", file=sys.stderr)
        return None


def main(a: argparse.Namespace) -> int:
    from .lib.machine import classify_serve, machine_cores, machine_cpu
    from .lib.sampler import RssSampler
    from .lib.serve import ServeRunner

    runner, url = None, a.url
    harness = Harness(Path(a.out) if a.out else None, KIND.write, a.argv, weights=a.weights if not url else "as served")
    report = harness.report
    apply_only(a)
    tallies = {name: Tally() for name, (_, dest, _, _) in ATTACKERS.items() if getattr(a, dest)}
    stalls: dict[str, dict[str, float]] = {"alone": {}, "attacked": {}}
    cpu: dict[str, dict[str, float]] = {"alone": {}, "attacked": {}}  # CPU seconds by part, and "wall"
    peaks: dict[str, dict[str, float]] = {"alone": {}, "attacked": {}}
    first: dict[str, list[Optional[float]]] = {"alone": [], "attacked": []}
    store = tempfile.TemporaryDirectory(prefix="bench-abuse-jobs-") if url is None else None
    with harness:
        try:
            if url is None:
                os.environ["CHATTTS_API_KEYS"] = f"{POLITE_KEY},{ATTACKER_KEY}"  # the replicas inherit it
                app = "applications.chattts.args"
                overrides = {f"{app}.ingress.security.auth": "required", f"{app}.jobs.path": store.name}
                runner = ServeRunner.from_args(a, overrides, front_guard=a.front_guard == "on")
                harness.meta.update(front_guard=a.front_guard, overrides=a.set, serve_start_s=round(runner.start(), 1))
                url = runner.base_url
            sampler = RssSampler(lambda: [os.getpid()], classify_serve).start() if runner else None
            asyncio.run(polite_requests(url, 3, 10**6))  # one-off costs of the first requests
            for r in range(a.rounds):
                for phase in PHASES:
                    if sampler:
                        sampler.window()
                    if runner:
                        ingress_stall(runner.app, reset=True)
                    cpu0, t0 = machine_cpu(), time.perf_counter()
                    seed0 = random.Random(r).randrange(10**6) + (0 if phase == "alone" else 10**5)
                    polite = (
                        polite_requests(url, a.requests, seed0)
                        if phase == "alone"
                        else attacked(url, a, seed0, tallies)
                    )
                    first[phase] += asyncio.run(polite)
                    wall = time.perf_counter() - t0
                    cpu[phase]["wall"] = cpu[phase].get("wall", 0.0) + wall
                    for part, cores in machine_cores(cpu0, machine_cpu(), wall)["cores"].items():
                        cpu[phase][part] = cpu[phase].get(part, 0.0) + cores * wall
                    for key, ms_ in ((ingress_stall(runner.app) if runner else None) or {}).items():
                        stalls[phase][key] = max(stalls[phase].get(key, 0), ms_)
                    for group, mib in (sampler.window()["peak_by_process_mib"] if sampler else {}).items():
                        peaks[phase][group] = max(peaks[phase].get(group, 0.0), mib)
                    print(f"round {r + 1} {phase}: {summarize(first[phase])}", file=sys.stderr)
                    if runner and phase == "attacked":
                        runner.wait_idle(120)  # the attack's rows gone before the next phase
            report["alone"], report["attacked"] = summarize(first["alone"]), summarize(first["attacked"])
            report["ratio_p50"] = ratio(report["attacked"].get("p50"), report["alone"].get("p50"), 3)
            report["target_ratio"] = TARGET_RATIO
            if sampler:
                sampler.stop()
                report["rss_peak_mib"] = peaks
        finally:
            report["attackers"] = {name: dict(t.outcomes) for name, t in tallies.items()}
            report["attackers_slowest_s"] = {name: t.slowest_s for name, t in tallies.items() if t.slowest_s}
            walls = {ph: c["wall"] for ph, c in cpu.items() if c.get("wall")}
            if "attacked" in walls:  # cores used: CPU seconds per second of the phases
                report["cpu_cores"] = {
                    ph: {g: round(v / walls[ph], 2) for g, v in sorted(cpu[ph].items()) if g != "wall"} for ph in walls
                }
                report["phase_wall_s"] = {ph: round(w, 1) for ph, w in walls.items()}
            if any(stalls.values()):
                report["ingress_loop_stall_ms"] = stalls
            if runner:
                runner.stop()
            if store is not None:
                store.cleanup()
    print(KIND.markdown(report))
    return 0
