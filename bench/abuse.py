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

from . import abuse_wyoming
from .abuse_attackers import ATTACKERS, JOB_ATTACKERS, SETUPS, apply_only, delete_jobs
from .abuse_attackers import add_arguments as add_attacker_arguments
from .abuse_surfaces import delete_lexicons
from .lib.attack import ATTACKER_KEY, POLITE_KEY, Tally, code_of
from .lib.harness import Harness
from .lib.report import Col, Doc, Figure, Kind, Panel, Series, failed, ms, points
from .lib.serve import add_app_arguments
from .lib.stats import percentiles, ratio

POLITE_TEXT = "你好，欢迎使用语音合成服务。"
TARGET_RATIO = 1.5


# ---------------------------------------------------------------------------------------- the polite client


async def polite_requests(url: str, n: int, seed0: int, failures: Optional[Tally] = None) -> list[Optional[float]]:
    """``n`` requests one after another; each one's seconds to its first audio byte (None: failed,
    counted in ``failures`` by its status and code, or its exception, with the seconds to it)."""
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
                    if r.status_code != 200:
                        await r.aread()
                        if failures is not None:
                            failures.add(code_of(r), time.perf_counter() - t0)
                    else:
                        async for chunk in r.aiter_raw():
                            if chunk and first is None:
                                first = time.perf_counter() - t0
            except httpx.HTTPError as exc:
                first = None
                if failures is not None:
                    failures.add(exc.__class__.__name__, time.perf_counter() - t0)
            out.append(first)
    return out


# ---------------------------------------------------------------------------------------- one run


async def attacked(
    url: str, a: argparse.Namespace, seed0: int, tallies: dict[str, Tally], failures: Tally
) -> list[Optional[float]]:
    """The polite client's requests while every attacker runs (after ``--ramp-s`` to get going);
    then the attacking key's jobs deleted."""
    stop = asyncio.Event()
    on = [name for name, (_, dest, _, _) in ATTACKERS.items() if getattr(a, dest)]
    attackers = [asyncio.ensure_future(ATTACKERS[name][0](url, a, stop, tallies[name])) for name in on]
    try:
        await asyncio.sleep(a.ramp_s)
        return await polite_requests(url, a.requests, seed0, failures)
    finally:
        stop.set()
        for task in attackers:
            task.cancel()
        for name, outcome in zip(on, await asyncio.gather(*attackers, return_exceptions=True)):
            if isinstance(outcome, Exception) and not isinstance(outcome, asyncio.CancelledError):
                tallies[name].add(f"attacker failed: {outcome.__class__.__name__}: {outcome}"[:200])
        jobs = [name for name in JOB_ATTACKERS if name in tallies]
        if jobs:
            await delete_jobs(url, tallies[jobs[0]])


async def set_up(url: str, a: argparse.Namespace, tallies: dict[str, Tally]) -> None:
    """The attackers' set-ups (their lexicons), once, before the first phase."""
    for name, setup in SETUPS.items():
        if name in tallies:
            await setup(url, a, tallies[name])


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
    for phase, got_instead in report.get("polite_failures", {}).items():
        if got_instead:
            doc.add(f"The polite client's failures {phase}: " + ", ".join(f"{k}: {v}" for k, v in got_instead.items()))
    slowest = report.get("attackers_slowest_s", {})

    def got(item: tuple) -> str:
        name, outcomes = item
        s = slowest.get(name, {})
        return ", ".join(f"{k}: {v}" + (f" ({s[k]} s)" if k in s else "") for k, v in sorted(outcomes.items()))

    attackers = [Col("attacker", 0), Col("what it got: count (slowest answer)", got)]
    doc.table(attackers, report.get("attackers", {}).items())
    server = report.get("wyoming_server")
    if server:
        doc.add(f"The Wyoming server's log: {server['tracebacks']} tracebacks in {server['log_lines']} lines.", "")
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


def figure(report: dict) -> Optional[Figure]:
    """Each polite request's first audio in the order sent, alone and under attack (failed ones
    left out), with the target: 1.5x the p50 alone."""
    each = report.get("first_audio_s")
    if not each:
        return None
    panel = Panel("Polite client's first audio, request by request", "request (in order)", "ms")
    for phase, label, style in (("alone", "alone", "o"), ("attacked", "under attack", "x")):
        pts = [(i + 1, v * 1000) for i, v in enumerate(each.get(phase, [])) if v is not None]
        panel.add(points(pts, label, style))
    alone_p50 = report.get("alone", {}).get("p50")
    if alone_p50:
        panel.add(
            Series(
                "hline",
                y=alone_p50 * 1000 * TARGET_RATIO,
                label=f"target: {TARGET_RATIO}x p50 alone",
                kw={"color": "gray", "ls": "--"},
            )
        )
    panel.ylim = (0, None)
    return Figure([panel], size=(8, 4), title=report.get("meta", {}).get("command"))


KIND = Kind("abuse.json", to_doc, figure, indent=1)


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
    p.add_argument("--out", help="write abuse.json, report.md and report.png here")


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
    polite_failed = {"alone": Tally(), "attacked": Tally()}  # what the polite client got instead of audio
    store = tempfile.TemporaryDirectory(prefix="bench-abuse-jobs-") if url is None else None
    scratch = tempfile.TemporaryDirectory(prefix="bench-abuse-")  # the Wyoming server's log
    wyoming = None
    with harness:
        try:
            if url is None:
                os.environ["CHATTTS_API_KEYS"] = f"{POLITE_KEY},{ATTACKER_KEY}"  # the replicas inherit it
                app = "applications.chattts.args"
                overrides = {
                    f"{app}.ingress.security.auth": "required",
                    f"{app}.jobs.path": store.name,
                    f"{app}.lexicons.path": str(Path(store.name) / "lexicons"),
                }
                runner = ServeRunner.from_args(a, overrides, front_guard=a.front_guard == "on")
                harness.meta.update(front_guard=a.front_guard, overrides=a.set, serve_start_s=round(runner.start(), 1))
                url = runner.base_url
            sampler = RssSampler(lambda: [os.getpid()], classify_serve).start() if runner else None
            asyncio.run(polite_requests(url, 3, 10**6))  # one-off costs of the first requests
            asyncio.run(set_up(url, a, tallies))
            a.wyoming_port = 0
            if a.wyoming_floods:
                wyoming, a.wyoming_port = abuse_wyoming.start_server(url, a.wyoming_idle_s, Path(scratch.name))
                harness.meta.update(wyoming={"idle_timeout_s": a.wyoming_idle_s, "api_key": "the attacking key's"})
            for r in range(a.rounds):
                for phase in PHASES:
                    if sampler:
                        sampler.window()
                    if runner:
                        ingress_stall(runner.app, reset=True)
                    cpu0, t0 = machine_cpu(), time.perf_counter()
                    seed0 = random.Random(r).randrange(10**6) + (0 if phase == "alone" else 10**5)
                    polite = (
                        polite_requests(url, a.requests, seed0, polite_failed[phase])
                        if phase == "alone"
                        else attacked(url, a, seed0, tallies, polite_failed[phase])
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
            if sampler:
                sampler.stop()
                report["rss_peak_mib"] = peaks
        finally:
            if first["alone"] and first["attacked"]:  # the phases done, also of a run cut short
                report["alone"], report["attacked"] = summarize(first["alone"]), summarize(first["attacked"])
                report["first_audio_s"] = {
                    ph: [None if v is None else round(v, 4) for v in vs] for ph, vs in first.items()
                }
                report["ratio_p50"] = ratio(report["attacked"].get("p50"), report["alone"].get("p50"), 3)
                report["target_ratio"] = TARGET_RATIO
            if any(t.outcomes for t in polite_failed.values()):
                report["polite_failures"] = {ph: dict(t.outcomes) for ph, t in polite_failed.items()}
            if wyoming is not None:
                wyoming.stop()
                log = wyoming.log_path.read_text(errors="replace")
                report["wyoming_server"] = {"tracebacks": log.count("Traceback"), "log_lines": log.count("\n")}
            if url is not None and {"alias-expansion", "lexicon-listing"} & set(tallies):
                try:
                    asyncio.run(delete_lexicons(url, tallies.get("lexicon-listing") or tallies["alias-expansion"]))
                except Exception as exc:  # noqa: BLE001 - a run's store is temporary unless --url
                    print(f"deleting the attacking key's lexicons failed: {exc}", file=sys.stderr)
            scratch.cleanup()
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
