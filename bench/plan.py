"""``python -m bench plan``: the cluster planned at scale by simulation (bench/README.md, "plan").

A simulated day of streamed requests (Poisson, following a diurnal curve, the corpus's lengths)
against ``--gpus`` GPUs of config/serve.gpu.yaml's shape, run by the project's own policy and
admission code (bench/lib/plansim.py): replicas over time, first audio p50/p99, stalled
stream-seconds, refusals, GPU-hours and cost per audio-hour, and where the policy over- or
under-provisions. The step-time curves come from committed reports: the CPU's measured on this
machine (``CPU_CEILING``), the GPU's an estimate (``GPU_ESTIMATE``) until a GPU report exists.
``--validate``: the local cluster test's shape (head + 2 declared-GPU nodes, tiny weights,
max_rows 4, target_fill 0.5, bounds 1..3) under its step load, against a measured run of it.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import yaml

from .lib.harness import Harness
from .lib.plansim import Curve, Load, Shape, percentile, simulate, step_table, vocoder_capacity
from .lib.procs import REPO_ROOT
from .lib.report import Col, Doc, Figure, Kind, Panel, line

RESULTS = REPO_ROOT / "bench" / "results"
CPU_CEILING = "quick-2026-12-07/ceiling.json"  # full size, int8, 2 threads, this machine
VOCODER = "vocoder-2026-12-01/vocoder.json"  # the Vocoder stage per core, the shipped path
FIRST_AUDIO = "first-audio-2026-12-04/report.json"  # the service's own share of first audio
TINY_STEP = "step-2026-12-02-tiny/report.json"  # the tiny model's step by batch (the validation's shape)
MEASURED = "autoscale-2026-11-30/report.json"  # the local cluster under the step load, measured
# No GPU has run the project yet: an H100-class step at full size in bfloat16, eager, per replica
# of two sharing the GPU. Anchors (issue text): a step reads ~210-300 MB (weights, heads, KV),
# ~0.1 ms of an H100's bandwidth, so launch overhead dominates (~1,700 eager ops a step, ~5 us
# each: ~9 ms); vLLM-Omni and CosyVoice2 put 40-90 audio-s/s on one GPU at 16-64 streams.
GPU_ESTIMATE = Curve(
    "GPU (estimate)",
    [(1, 9.0), (8, 10.5), (16, 12.5), (32, 16.5)],
    "estimate: eager launch-bound step ~9 ms + ~0.23 ms a row, two replicas per GPU (no GPU report yet)",
    estimate=True,
)
DAY_S = 86400.0
VALIDATE_STEPS = [(0.0, 1), (25.0, 6), (100.0, 1), (150.0, 0)]  # the measured run's (clients from t)


def _read(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def cpu_curve() -> Curve:
    """The full-size int8 step on this machine, from the committed ceiling's engine batches."""
    from serve_app.engine.pacing import TOKEN_SECONDS

    batches = _read(CPU_CEILING)["methods"]["engine"]
    pts = [(int(b), round(1000 * int(b) * TOKEN_SECONDS / x["audio_s_per_s"], 2)) for b, x in batches.items()]
    return Curve("CPU full size int8 (measured)", pts, f"bench/results/{CPU_CEILING} (engine, audio s/s by batch)")


def fixed_first_audio_s() -> float:
    """Service share of first audio at 1 client + the first vocoder window (committed hop-by-hop run)."""
    r = _read(FIRST_AUDIO)
    return (
        r["ratios"]["first_audio_service_ms_c1"]
        + r["serve"]["closed"]["1"]["first_audio"]["hops_ms"]["vocoder_feed"]["p50"]
    ) / 1000


def vocoder_rate(fmt: str) -> float:
    """Audio s/s of one Vocoder replica (one torch thread) in the shipped path for ``fmt``."""
    return float(_read(VOCODER)["encoders"][fmt]["stage_default"])


def corpus_tokens() -> list[int]:
    from .lib.corpus import plan_corpus

    return [sum(toks) for _, toks, _ in plan_corpus()]


def gpu_config() -> tuple[dict, dict]:
    """config/serve.gpu.yaml's Acoustic and Vocoder deployments."""
    cfg = yaml.safe_load((REPO_ROOT / "config" / "serve.gpu.yaml").read_text())
    app = cfg["applications"][0]
    deps = {d["name"]: d for d in app["deployments"]}
    return app["args"], deps


# ------------------------------------------------------------------------------------ scenarios


def fill(auto: dict) -> float:
    return float(auto["policy"]["policy_kwargs"]["target_fill"])


def day_scenario(gpus: int, a: argparse.Namespace) -> dict:
    args, deps = gpu_config()
    ac = deps["Acoustic"]
    per_gpu = float(ac["ray_actor_options"]["num_gpus"])
    auto = dict(ac["autoscaling_config"], max_replicas=int(gpus / per_gpu))
    if a.target_fill:
        auto["policy"] = {**auto["policy"], "policy_kwargs": {"target_fill": a.target_fill}}
    if a.min_replicas is not None:
        auto["min_replicas"] = a.min_replicas
    max_rows = args["acoustic"]["max_rows"]
    curve = GPU_ESTIMATE
    step_s, cap = step_table(curve, max_rows)
    tokens = corpus_tokens()
    # The peak is --peak of the streams the fleet carries at the config's target fill (the same load
    # whatever --target-fill tries); a stream holds its row for its decode.
    mean_hold_s = statistics.mean(tokens) * step_s[cap]
    peak_rate = a.peak * auto["max_replicas"] * fill(ac["autoscaling_config"]) * cap / mean_hold_s
    trough = a.trough

    def rate(t: float) -> float:  # lowest at 04:00, highest at 16:00
        return peak_rate * (trough + (1 - trough) * 0.5 * (1 - math.cos(2 * math.pi * (t - 4 * 3600) / DAY_S)))

    # The day starts with the replicas the policy wants for the night's load (no cold start).
    auto["initial_replicas"] = max(auto["min_replicas"], math.ceil(rate(0.0) * mean_hold_s / (fill(auto) * cap)))
    shape = Shape(
        curve,
        max_rows,
        auto,
        replica_start_s=a.start_s,
        gpus_per_replica=per_gpu,
        vocoder_rate=vocoder_rate(a.format),
        vocoders_per_gpu=a.vocoders_per_gpu or deps["Vocoder"]["max_replicas_per_node"],
        first_audio_fixed_s=fixed_first_audio_s(),
        graceful_shutdown_s=ac["graceful_shutdown_timeout_s"],
    )
    sim = simulate(shape, Load(a.hours * 3600, tokens, rate=rate), dt=a.dt, seed=a.seed, sample_s=60)
    return summarize(f"{gpus} GPUs, a day", shape, sim, {"gpus": gpus, "peak_rate_per_s": round(peak_rate, 1)}, a)


def validate_scenario(a: argparse.Namespace) -> dict:
    """The cluster test's shape (tests/support/configs.py cluster_config) under the measured run's
    step load. The tiny step curve's shape is the committed step report's; its scale is the measured
    run's own 1-client steps (the only measurement of tiny steps inside that cluster), so the
    prediction under test is the 6-client phase: replicas over time and first audio."""
    from serve_app.engine.pacing import SAMPLES_PER_TOKEN

    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from support.configs import cluster_config

    measured = load_measured(a.measured)
    cfg = cluster_config(port=0)
    app = cfg["applications"][0]
    ac = next(d for d in app["deployments"] if d["name"] == "Acoustic")
    tiny = _read(TINY_STEP)["current"][0]["batches"]
    ms = {int(b): v["fp32"]["step_ms"] for b, v in tiny.items()}
    ones = [r for r in measured["records"] if r["clients"] == 1 and r["t_first"] is not None]
    step1 = statistics.median((r["t_end"] - r["t_first"]) / (r["samples"] / SAMPLES_PER_TOKEN) for r in ones)
    curve = Curve(
        "tiny, in the local cluster",
        [(b, round(1000 * step1 * v / ms[1], 2)) for b, v in sorted(ms.items())],
        f"shape: bench/results/{TINY_STEP}; scale: the measured run's 1-client steps ({1000 * step1:.1f} ms)",
    )
    from .lib.corpus import ONE_ROW_TEXTS, plan_corpus

    shape = Shape(
        curve,
        app["args"]["acoustic"]["max_rows"],
        ac["autoscaling_config"],
        replica_start_s=measured["replica_start_s"],
        gpus_per_replica=float(ac["ray_actor_options"]["num_gpus"]),
        vocoder_rate=vocoder_rate("pcm"),
        vocoders_fixed=1,
        first_audio_fixed_s=fixed_first_audio_s(),
        graceful_shutdown_s=ac["graceful_shutdown_timeout_s"],
    )
    steps = measured["steps"]
    clients = lambda t: next(n for t0, n in reversed(steps) if t >= t0)  # noqa: E731
    tokens = [sum(toks) for _, toks, _ in plan_corpus(ONE_ROW_TEXTS)]
    sim = simulate(shape, Load(measured["duration_s"], tokens, clients=clients), dt=0.1, seed=a.seed, sample_s=1.0)
    out = summarize("local cluster (validation)", shape, sim, {"steps": steps}, a)
    out["validation"] = compare(out, measured)
    return out


def load_measured(name: str) -> dict:
    """A measured step-load run of the local cluster: its steps, Acoustic replicas running over
    time, each request's times and audio, the replica start-up (deploy to ready)."""
    r = _read(name)
    steps = [tuple(s) for s in r["config"]["steps"]]
    level = lambda t: next(n for t0, n in reversed(steps) if t >= t0)  # noqa: E731
    records = [
        {**x, "clients": level(x["t_send"]), "samples": x["audio_bytes"] / 2 + 256}
        for x in r["records"]
        if x.get("complete")
    ]
    timeline = [(e["t"], e["replicas"]["Acoustic"]) for e in r["timeline"] if (e.get("replicas") or {}).get("Acoustic")]
    return {
        "source": f"bench/results/{name}",
        "git": r["meta"].get("git"),
        "steps": steps,
        "records": records,
        "replicas": timeline,
        "replica_start_s": r["meta"]["deploy_to_ready_s"],
        "duration_s": steps[-1][0] + 30.0,
    }


def compare(sim: dict, measured: dict) -> list[dict]:
    """Predicted against measured: mean Acoustic replicas per phase, time to the peak, TTFB p50 per level."""
    t = np.array(sim["timeline"]["t"])
    running = np.array(sim["timeline"]["running"], dtype=float)
    mt = np.array([x[0] for x in measured["replicas"]])
    mr = np.array([x[1] for x in measured["replicas"]], dtype=float)
    rows = []
    steps = measured["steps"]
    for (t0, n), (t1, _) in zip(steps, steps[1:]):
        sel, msel = (t >= t0) & (t < t1), (mt >= t0) & (mt < t1)
        rows.append(
            _row(f"mean Acoustic replicas, {n} client(s), {t0:g}-{t1:g} s", running[sel].mean(), mr[msel].mean())
        )
    up = steps[1][0]
    peak = mr.max()
    reach = lambda tt, rr: next((x - up for x, r in zip(tt, rr) if x >= up and r >= peak), None)  # noqa: E731
    rows.append(_row(f"time from the step up to {peak:g} replicas (s)", reach(t, running), reach(mt, mr)))
    for n in sorted({s[1] for s in steps if s[1]}):
        m = [r["t_first"] - r["t_send"] for r in measured["records"] if r["clients"] == n]
        rows.append(_row(f"TTFB p50 at {n} client(s) (s)", sim["ttfb_by_level"].get(str(n)), statistics.median(m)))
    return rows


def _row(what: str, predicted: Optional[float], measured: Optional[float]) -> dict:
    err = None if predicted is None or not measured else (predicted - measured) / measured
    return {
        "quantity": what,
        "predicted": None if predicted is None else round(float(predicted), 3),
        "measured": None if measured is None else round(float(measured), 3),
        "error": None if err is None else round(err, 3),
        "within_25pct": None if err is None else abs(err) <= 0.25,
    }


def summarize(name: str, shape: Shape, sim, extra: dict, a: argparse.Namespace) -> dict:
    tot = sim.totals
    audio_h = tot["audio_s"] / 3600
    gpu_h = tot["gpu_s"] / 3600
    s = sim.series
    out = {
        "scenario": name,
        **extra,
        "curve": {"name": shape.curve.name, "points": shape.curve.points, "source": shape.curve.source},
        "estimate": shape.curve.estimate,
        "autoscaling": shape.autoscaling,
        "replica_start_s": shape.replica_start_s,
        "capacity_streams_per_replica": tot["capacity_streams"],
        "vocoder_streams_per_replica": tot["vocoder_capacity_streams"],
        "totals": {k: round(v, 2) if isinstance(v, float) else v for k, v in tot.items()},
        "ttfb_p50_s": percentile(sim.ttfb_hist, 50),
        "ttfb_p99_s": percentile(sim.ttfb_hist, 99),
        "stalled_share": tot["stalled_stream_s"] / tot["stream_s"] if tot["stream_s"] else None,
        "refused_share": tot["refused_final"] / tot["arrivals"] if tot["arrivals"] else None,
        "idle_share": 1 - tot["stream_s"] / tot["capacity_stream_s"] if tot["capacity_stream_s"] else None,
        "gpu_hours": round(gpu_h, 2),
        "audio_hours": round(audio_h, 2),
        "cost_per_audio_hour": round(a.gpu_hour_cost * gpu_h / audio_h, 4) if audio_h else None,
        "timeline": {"t": sim.t, **s},
    }
    out["ttfb_by_level"] = {str(n): percentile(h, 50) for n, h in sorted(sim.ttfb_levels.items())}
    out["provisioning"] = provisioning(out, tot["admit_rows"])
    return out


def provisioning(r: dict, admit_rows: int) -> list[dict]:
    """Per hour (per 10 s in a short run): streams carried against the capacity of the replicas
    running, refusals (503s, each asked again) and stalls; under-provisioned where more than 0.1 % of
    the streams were told 503 or 1 % of stream-seconds stalled, over-provisioned where more than 20 %
    of the capacity idled."""
    tl = r["timeline"]
    t = np.array(tl["t"])
    span = 3600.0 if t[-1] > 7200 else 10.0
    out = []
    for h0 in np.arange(0, t[-1] + 1e-9, span):
        sel = (t >= h0) & (t < h0 + span)
        if not sel.any():
            continue
        streams = float(np.mean(np.array(tl["streams"])[sel]))
        cap = float(np.mean(np.array(tl["running"])[sel])) * admit_rows
        refused = float(np.sum(np.array(tl["refused"])[sel]))
        stalled = float(np.sum(np.array(tl["stalled"])[sel]))
        idle = 1 - streams / cap if cap else None
        arrivals = float(np.sum(np.array(tl["arrivals"])[sel]))
        under = refused > 0.001 * arrivals or stalled > 0.01 * streams * span
        verdict = "under" if under else ("over" if idle and idle > 0.2 else "ok")
        out.append(
            {
                "from_s": float(h0),
                "streams": round(streams, 1),
                "replicas": round(cap / admit_rows, 1),
                "idle": None if idle is None else round(idle, 3),
                "arrivals": arrivals,
                "refused": refused,
                "stalled_s": round(stalled, 1),
                "verdict": verdict,
            }
        )
    return out


def measure(out: Path) -> dict:
    """The measured side of ``--validate``: the local cluster (head + 2 declared-GPU nodes, the cluster
    test's config) under the step load ``VALIDATE_STEPS``; Acoustic replicas running each second, every
    request's times. Starts Ray: run it under the bench's lock (bench/README.md). ~5 minutes."""
    import asyncio
    import shutil
    import time

    from deployments.kuberay import GPU_POD

    from .lib.cluster import HTTP_ERRORS, LocalCluster
    from .lib.procs import free_port
    from .lib.serve import wait_ready
    from .lib.waiting import wait_until

    sys.path.insert(0, str(REPO_ROOT / "tests"))
    from support.configs import cluster_config
    from support.step_load import StepLoad

    cluster = LocalCluster(workers=2, head_cpus=2, worker_cpus=GPU_POD["cpu"], worker_gpus=GPU_POD["gpu"])
    from .lib.harness import git_revision, now

    report: dict = {"meta": {"started": now(), "command": "python -m bench plan --measure", "git": git_revision()}}
    try:
        report["meta"]["cluster_start_s"] = round(cluster.start(), 1)
        port = free_port()
        t0 = time.monotonic()
        assert cluster.deploy(cluster_config(port=port), "plan").returncode == 0

        def settled() -> bool:
            app = (cluster.serve_details().get("applications") or {}).get("chattts") or {}
            return app.get("status") == "RUNNING"

        wait_until(settled, 300, 0.5, what="chattts RUNNING", retry_on=HTTP_ERRORS)
        wait_ready(f"http://127.0.0.1:{port}", 300)
        report["meta"]["deploy_to_ready_s"] = round(time.monotonic() - t0, 1)
        report["config"] = {"steps": VALIDATE_STEPS}
        timeline: list = []

        async def run() -> list:
            async with StepLoad(f"http://127.0.0.1:{port}") as load:
                for (_, n), nxt in zip(VALIDATE_STEPS, [*VALIDATE_STEPS[1:], (VALIDATE_STEPS[-1][0] + 30, 0)]):
                    load.set_clients(n)
                    while load.clock() < nxt[0]:
                        reps = await asyncio.to_thread(cluster.replicas, "Acoustic")
                        timeline.append({"t": round(load.clock(), 2), "replicas": {"Acoustic": len(reps)}})
                        await asyncio.sleep(max(0.0, 1.0 - (load.clock() % 1.0)))
                await load.stop()
            return [
                {
                    "t_send": r.t_send,
                    "t_first": r.t_first,
                    "t_end": r.t_end,
                    "status": r.status,
                    "audio_bytes": r.audio_bytes,
                    "complete": r.ok,
                }
                for r in load.records
            ] + [{"t_send": r.t_send, "status": r.status, "complete": False, "refused": True} for r in load.refused]

        report["records"] = asyncio.run(run())
        report["timeline"] = timeline
    finally:
        cluster.stop(grace_s=2)
        shutil.rmtree(cluster.root, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / "measured.json").write_text(json.dumps(report, indent=1))
    return report


# ------------------------------------------------------------------------------------ report

SUMMARY = [
    Col("scenario", "scenario"),
    Col(
        "streams at 1x per replica (Acoustic / Vocoder)",
        lambda r: f"{r['capacity_streams_per_replica']} / {r['vocoder_streams_per_replica']}",
    ),
    Col("replicas peak", lambda r: max(r["timeline"]["running"])),
    Col("TTFB p50 / p99 (s)", lambda r: f"{_f(r['ttfb_p50_s'])} / {_f(r['ttfb_p99_s'])}"),
    Col("stalled stream-s share", lambda r: _pct(r["stalled_share"])),
    Col("503 answers / refused for good", lambda r: f"{r['totals']['refusals']:.0f} / {_pct(r['refused_share'])}"),
    Col("idle capacity", lambda r: _pct(r["idle_share"])),
    Col("GPU-hours", "gpu_hours"),
    Col("audio-hours", "audio_hours"),
    Col("cost per audio-hour", "cost_per_audio_hour", nd=3),
]
HOURS = [
    Col("from (h)", lambda x: f"{x['from_s'] / 3600:g}"),
    Col("streams", "streams", nd=1),
    Col("replicas", "replicas", nd=1),
    Col("idle", lambda x: _pct(x["idle"])),
    Col("streams started", "arrivals", nd=0),
    Col("503s", "refused", nd=0),
    Col("stalled s", "stalled_s", nd=1),
    Col("verdict", "verdict"),
]
VALIDATION = [
    Col("quantity", "quantity"),
    Col("predicted", "predicted", nd=3),
    Col("measured", "measured", nd=3),
    Col("error", lambda x: _pct(x["error"])),
    Col("within 25 %", "within_25pct"),
]


def _f(x: Optional[float]) -> str:
    return "–" if x is None else f"{x:.2f}"


def _pct(x: Optional[float]) -> str:
    return "–" if x is None else f"{100 * x:.1f} %"


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Cluster plan by simulation, {m['started']}", m["command"])
    if report.get("error"):
        doc.add(f"**The run failed:** `{report['error']}`", "")
    doc.add(*[f"- {x}" for x in report.get("inputs", [])])
    scen = report.get("scenarios", {})
    doc.table(SUMMARY, scen.values())
    for key, r in scen.items():
        if key != "validate":
            doc.table(HOURS, r["provisioning"], before=("", f"### {r['scenario']}: per hour", ""))
    if "validate" in scen:
        v = scen["validate"]
        doc.table(VALIDATION, v["validation"], before=("", f"### Validation against {v['measured_source']}", ""))
    doc.add("", "## Notes", "", *[f"- {x}" for x in notes(report)])
    return doc


def to_figure(report: dict) -> Optional[Figure]:
    panels = []
    for key, r in report.get("scenarios", {}).items():
        tl = r["timeline"]
        hours = key != "validate"
        t = [x / 3600 if hours else x for x in tl["t"]]
        p = Panel(r["scenario"], "hour" if hours else "s", "Acoustic replicas")
        p.add(
            line(t, tl["running"], "running", "-"),
            line(t, [math.nan if d is None else d for d in tl["desired"]], "policy wants", "-", lw=0.6),
        )
        if key == "validate":
            mt = [x[0] for x in r["measured_replicas"]]
            p.add(line(mt, [x[1] for x in r["measured_replicas"]], "measured running", "o", ms=3))
        p.twin = Panel(ylabel="streams" if hours else "clients", legend=None).add(
            line(
                t, tl["streams"] if hours else tl["load"], "streams" if hours else "clients", "-", color="gray", lw=0.6
            )
        )
        panels.append(p)
    return Figure(panels, (1, len(panels)), (5 * len(panels), 4)) if panels else None


KIND = Kind("plan.json", to_doc, to_figure, indent=None)  # timelines: one line, not one per number


def notes(report: dict) -> list[str]:
    out = []
    for key, r in report.get("scenarios", {}).items():
        if key == "validate":
            v = r["validation"]
            bad = [x["quantity"] for x in v if x["within_25pct"] is False]
            out.append(
                f"Validation: {len(v) - len(bad)} of {len(v)} within 25 %"
                + (f"; off: {'; '.join(bad)}." if bad else ".")
            )
            continue
        hours, t = r["provisioning"], r["totals"]
        voc = t.get("vocoder_refusals")
        verdicts = []
        for kind, what in (
            ("under", "under-provisioned (> 0.1 % told 503 or > 1 % stalled)"),
            ("over", "over-provisioned (> 20 % idle)"),
        ):
            hs = [h for h in hours if h["verdict"] == kind]
            idle = sorted(h["idle"] for h in hs if h["idle"] is not None)
            span = f", {_pct(idle[0])}-{_pct(idle[-1])} idle" if idle else ""
            verdicts.append(
                f"{what} in {len(hs)} of {len(hours)} hours"
                + (f" (from {hs[0]['from_s'] / 3600:g}h{span})" if hs else "")
            )
        out.append(
            f"{r['scenario']}: stalled {_pct(r['stalled_share'])} of stream-seconds, idle {_pct(r['idle_share'])} of "
            f"the running replicas' stream capacity, {_pct(r['refused_share'])} of streams refused for good"
            + (
                f" (the Vocoder's {_pct(voc / t['refusals'])} of the 503s: unseen by the Acoustic policy)"
                if voc
                else ""
            )
            + "; "
            + "; ".join(verdicts)
            + "."
        )
    return out


# ------------------------------------------------------------------------------------ command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", default="100,1000", help="comma list: a simulated day per fleet size ('' for none)")
    p.add_argument("--validate", action="store_true", help="also the local cluster's shape against a measured run")
    p.add_argument("--measured", default=MEASURED, help="the measured run under bench/results/ (--validate)")
    p.add_argument("--hours", type=float, default=24.0, help="simulated hours of the day scenarios")
    p.add_argument(
        "--peak", type=float, default=0.8, help="peak load: this share of the streams the fleet carries at target_fill"
    )
    p.add_argument("--trough", type=float, default=0.15, help="the night's load as a share of the peak")
    p.add_argument("--start-s", type=float, default=60.0, help="a GPU replica's start-up (estimate: loads the GPT)")
    p.add_argument("--target-fill", type=float, help="the policy's target_fill (default: the config's)")
    p.add_argument("--min-replicas", type=int, help="Acoustic min_replicas (default: the config's)")
    p.add_argument("--gpu-hour-cost", type=float, default=2.5, help="cost of a GPU-hour (any currency)")
    p.add_argument("--vocoders-per-gpu", type=float, help="Vocoder replicas per GPU (default: the config's per node)")
    p.add_argument("--format", default="pcm", help="the streamed format (the Vocoder's rate for it)")
    p.add_argument("--dt", type=float, default=2.0, help="the simulation's time slice (s) for the day scenarios")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write plan.json, report.md and report.png here")
    p.add_argument("--measure", help="instead: run the local cluster's step load, write its measured.json here")


def main(a: argparse.Namespace) -> int:
    if a.measure:
        measure(Path(a.measure))
        return 0
    harness = Harness(Path(a.out) if a.out else None, KIND.write, a.argv)
    report = harness.report
    with harness:
        cpu = cpu_curve()
        _, cpu_cap = step_table(cpu, gpu_config()[0]["acoustic"]["max_rows"])
        report["inputs"] = [
            f"GPU step curve: {GPU_ESTIMATE.points} (rows, ms), **an estimate**: {GPU_ESTIMATE.source}",
            f"CPU step curve: {cpu.points} (rows, ms), measured: {cpu.source}; a CPU replica keeps {cpu_cap} "
            "streams at 1x (its step at one row is slower than a token's audio): not a real-time device at full size",
            f"Vocoder: {vocoder_rate(a.format)} audio s/s per replica ({a.format}, bench/results/{VOCODER}), "
            f"{vocoder_capacity(vocoder_rate(a.format))} streams at 1x (its StreamGate)",
            f"first audio, fixed part: {fixed_first_audio_s():.3f} s (service share + first vocoder window, "
            f"bench/results/{FIRST_AUDIO}); GPU replica start-up {a.start_s:g} s (estimate)",
            f"cost per GPU-hour: {a.gpu_hour_cost:g}; load: a day, lowest at 04:00 ({a.trough:g} of the peak), peak "
            f"at 16:00 = {a.peak:g} of the streams the fleet carries at the config's target_fill; Poisson arrivals",
        ]
        report["scenarios"] = {}
        for g in [int(x) for x in a.gpus.split(",") if x.strip()]:
            report["scenarios"][str(g)] = day_scenario(g, a)
            harness.write()
        if a.validate:
            v = validate_scenario(a)
            measured = load_measured(a.measured)
            v["measured_source"] = measured["source"] + f" (git {measured['git']})"
            v["measured_replicas"] = measured["replicas"]
            report["scenarios"]["validate"] = v
    print(KIND.markdown(report))
    return 1 if report.get("error") else 0
