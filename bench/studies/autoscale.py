"""``python -m bench autoscale --out DIR``: a load that steps up and down against the app on a
local multi-node cluster (bench/lib/cluster.py: a head and GPU-declaring worker nodes on this host),
recording every second the offered load, each stage's replicas, the Acoustic engine's queue per
replica, the policy's decision and TTFB/latency percentiles; ``report.json`` and
``timeline.png``.

It answers two questions: how long from a load step to a new Acoustic replica serving, and
whether any request fails while replicas come and go (the target is none).

Load: closed-loop clients streaming ``pcm`` (exact byte counts: with random weights every
request's audio length is known from its plan, so a cut stream is seen even when the server
ends it cleanly). When the load steps down, clients finish the request they are in and stop:
nothing is cut by the load generator. The per-replica rows come from the replicas'
``tts_queue_rows`` / ``tts_running_rows`` gauges on every node's metrics port (the cluster's
nodes report metrics every second instead of Ray's 10 s), replicas from Serve's REST API. The
load (``StepLoad``), the texts (``ONE_ROW_TEXTS``) and what each must bring
(``expected_pcm_bytes``, ``complete``) are in bench/lib/; the cluster tests use them too.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Optional

import httpx

from ..lib.corpus import ONE_ROW_TEXTS, expected_pcm_bytes
from ..lib.harness import Harness
from ..lib.loadgen import RequestRecord, StepLoad, complete
from ..lib.report import Figure, Kind, Panel, Series, line
from ..lib.sampler import Periodic
from ..lib.stats import percentiles

STAGES = ("Ingress", "TextNormalizer", "Acoustic", "Vocoder")


# ---------------------------------------------------------------------- what the cluster does


def parse_metrics(text: str, names: tuple[str, ...]) -> list[tuple[str, dict, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name in names:
                out.append((s.name, dict(s.labels), float(s.value)))
    return out


class ClusterSampler(Periodic):
    """Every ``interval_s``: replicas per stage (Serve REST), rows per Acoustic replica (its
    gauges on the nodes' metrics ports) and the policy's desired replicas (head); a second that
    failed is kept as its error."""

    ROW_METRICS = ("ray_tts_queue_rows", "ray_tts_running_rows")
    POLICY_METRIC = "ray_tts_autoscale_desired_replicas"

    def __init__(self, cluster, clock, interval_s: float = 1.0):
        super().__init__(interval_s, "cluster-sampler")
        self.cluster = cluster
        self.clock = clock
        self.samples: list[dict] = []

    def tick(self) -> None:
        t = self.clock()
        try:
            self.samples.append(self.sample(t))
        except Exception as exc:  # noqa: BLE001 - a missed second is recorded, not fatal
            self.samples.append({"t": round(t, 2), "error": f"{exc.__class__.__name__}: {exc}"})

    def sample(self, t: float) -> dict:
        apps = (self.cluster.serve_details().get("applications") or {}).get("chattts") or {}
        deps = apps.get("deployments") or {}
        replicas: dict[str, int] = {}
        acoustic: dict[str, dict] = {}
        for stage in STAGES:
            reps = (deps.get(stage) or {}).get("replicas", [])
            replicas[stage] = sum(1 for r in reps if r["state"] == "RUNNING")
            if stage == "Acoustic":
                acoustic = {r["replica_id"]: {"state": r["state"], "node_id": r["node_id"][:8]} for r in reps}
        desired = None
        for node in self.cluster.nodes:
            if not node.alive():
                continue
            try:
                text = httpx.get(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=5, trust_env=False).text
            except httpx.HTTPError:
                continue
            for name, labels, value in parse_metrics(text, self.ROW_METRICS + (self.POLICY_METRIC,)):
                if name == self.POLICY_METRIC and labels.get("deployment") == "Acoustic":
                    desired = value
                elif name in self.ROW_METRICS and labels.get("deployment") == "Acoustic":
                    rep = acoustic.setdefault(labels.get("replica", "?"), {"state": "gone"})
                    rep["waiting" if name == "ray_tts_queue_rows" else "running"] = value
        return {"t": round(t, 2), "replicas": replicas, "acoustic": acoustic, "desired": desired}


# ---------------------------------------------------------------------- the report


def per_second(
    records: list[RequestRecord],
    samples: list[dict],
    steps: list[tuple[float, int]],
    expected: dict[str, int],
    window_s: float = 5.0,
) -> list[dict]:
    """One row per sample: clients offered, requests started/finished in the last second, and
    TTFB/latency percentiles of the complete requests that finished in the trailing ``window_s``."""
    rows = []
    for s in samples:
        t = s["t"]
        clients = next((n for at, n in reversed(steps) if at <= t), 0)
        done = [r for r in records if r.t_end is not None and t - window_s < r.t_end <= t and complete(r, expected)]
        rows.append(
            {
                **s,
                "clients": clients,
                "started_1s": sum(1 for r in records if t - 1 < r.t_send <= t),
                "finished_1s": sum(1 for r in records if r.t_end is not None and t - 1 < r.t_end <= t),
                "failed_so_far": sum(
                    1
                    for r in records
                    if r.t_send <= t and (r.error or (r.t_end is not None and not complete(r, expected)))
                ),
                "ttfb_s": percentiles([r.ttfb for r in done if r.ttfb is not None], (50, 95), 3, ()),
                "latency_s": percentiles([r.latency for r in done if r.latency is not None], (50, 95), 3, ()),
            }
        )
    return rows


def scale_events(samples: list[dict], steps: list[tuple[float, int]]) -> dict:
    """From the step up: the first second with more Acoustic replicas running, and the first with
    rows on a replica that was not there before (the new replica serving). From the step down:
    the first second with fewer replicas, and when the count is back at its floor."""
    ok = [s for s in samples if "replicas" in s]
    out: dict[str, Any] = {}
    if len(steps) < 2 or not ok:
        return out
    peak_clients = max(n for _, n in steps)
    t_up = next(at for at, n in steps if n == peak_clients)
    t_down = next((at for at, n in steps if at > t_up and n < peak_clients), None)
    before = [s for s in ok if s["t"] <= t_up]
    base = before[-1]["replicas"]["Acoustic"] if before else ok[0]["replicas"]["Acoustic"]
    old = set(before[-1]["acoustic"]) if before else set()
    after = [s for s in ok if s["t"] > t_up and (t_down is None or s["t"] <= t_down)]
    up = next((s for s in after if s["replicas"]["Acoustic"] > base), None)
    serving = next(
        (s for s in after if any(r.get("running", 0) > 0 for k, r in s["acoustic"].items() if k not in old)), None
    )
    out["step_up_s"] = round(t_up, 2)
    out["acoustic_before"] = base
    out["acoustic_peak"] = max((s["replicas"]["Acoustic"] for s in ok), default=base)
    out["new_replica_running_after_s"] = round(up["t"] - t_up, 1) if up else None
    out["new_replica_serving_after_s"] = round(serving["t"] - t_up, 1) if serving else None
    if t_down is not None:
        peak = max((s["replicas"]["Acoustic"] for s in ok if s["t"] <= t_down), default=base)
        later = [s for s in ok if s["t"] > t_down]
        fewer = next((s for s in later if s["replicas"]["Acoustic"] < peak), None)
        floor = next((s for s in later if s["replicas"]["Acoustic"] <= base), None)
        out["step_down_s"] = round(t_down, 2)
        out["first_removal_after_s"] = round(fewer["t"] - t_down, 1) if fewer else None
        out["back_to_floor_after_s"] = round(floor["t"] - t_down, 1) if floor else None
    return out


def failures(records: list[RequestRecord], expected: dict[str, int]) -> dict:
    bad = [r for r in records if not complete(r, expected)]
    return {
        "requests": len(records),
        "complete": len(records) - len(bad),
        "failed": len(bad),
        "kinds": sorted({r.error or (f"http_{r.status}" if r.status != 200 else "incomplete") for r in bad}),
        "failed_at_s": [round(r.t_send, 1) for r in bad][:50],
    }


def to_figure(report: dict) -> Optional[Figure]:
    if not report.get("timeline"):  # a run that failed before its load ran has none to draw
        return None
    rows = [r for r in report["timeline"] if "replicas" in r]
    t = [r["t"] for r in rows]

    def panel(ylabel: str, *series: Series, **legend: Any) -> Panel:
        return Panel(ylabel=ylabel, grid=None, legend={"loc": "upper right", **legend}, not_measured=False).add(*series)

    load = panel(
        "load",
        Series("step", t, [r["clients"] for r in rows], "clients (offered load)", kw={"color": "black"}),
        line(t, [r["finished_1s"] for r in rows], "requests finished / s", "", alpha=0.7),
    )
    replicas = panel(
        "replicas",
        *[Series("step", t, [r["replicas"][stage] for r in rows], f"{stage} replicas") for stage in STAGES],
        line(t, [r["desired"] for r in rows], "policy desired (Acoustic)", "k:"),
        fontsize=8,
    )

    def rows_of(k: str) -> list[float]:
        per = [r["acoustic"].get(k) for r in rows]
        return [math.nan if x is None else (x.get("waiting", 0) or 0) + (x.get("running", 0) or 0) for x in per]

    engine = panel(
        "engine rows per replica",
        *[line(t, rows_of(k), f"{k} waiting+running", "") for k in sorted({k for r in rows for k in r["acoustic"]})],
        fontsize=8,
    )
    latency = panel(
        "seconds (trailing 5 s)",
        *[
            line(t, [r[key][q] if r[key][q] is not None else math.nan for r in rows], f"{key[:-2]} {q}", style)
            for key, style in (("ttfb_s", "--"), ("latency_s", "-"))
            for q in ("p50", "p95")
        ],
        fontsize=8,
    )
    latency.xlabel = "seconds since the load started"
    ev = report["events"]
    for p in (load, replicas, engine, latency):
        p.add(
            *[
                Series("vline", x=ev[k], kw={"color": "grey", "lw": 0.8})
                for k in ("step_up_s", "step_down_s")
                if ev.get(k) is not None
            ]
        )
    title = f"autoscale: {report['meta']['command']}"
    return Figure(
        [load, replicas, engine, latency], shape=(4, 1), size=(11, 12), title=title, title_size=9, sharex=True
    )


KIND = Kind("report.json", None, to_figure, png="timeline.png", indent=1)


# ---------------------------------------------------------------------- the command


DRAIN_S = 40.0  # after the last step: requests in flight finish, replicas settle


def parse_steps(s: str) -> list[tuple[float, int]]:
    """``0:1,25:6,100:1,150:0`` -> [(0, 1), (25, 6), ...]: at second t, n clients."""
    out = []
    for part in s.split(","):
        at, _, n = part.partition(":")
        out.append((float(at), int(n)))
    return out


def add_arguments(a: argparse.ArgumentParser) -> None:
    a.add_argument("--out", required=True, help="output directory (report.json, timeline.png, serve.cluster.yaml)")
    a.add_argument(
        "--steps",
        type=parse_steps,
        default="0:1,25:6,100:1,150:0",
        help="AT:CLIENTS,... (seconds since the load started)",
    )
    a.add_argument("--workers", type=int, default=2, help="worker nodes, one declared GPU each")
    a.add_argument("--max-replicas", type=int, default=3, help="Acoustic max_replicas (two per GPU node fit)")
    a.add_argument("--max-rows", type=int, default=4, help="args.acoustic.max_rows")
    a.add_argument("--target-fill", type=float, default=0.5, help="the policy's target_fill")
    a.add_argument("--upscale-delay-s", type=float, default=2.0)
    a.add_argument("--downscale-delay-s", type=float, default=6.0)


async def _drive(load: StepLoad, steps: list[tuple[float, int]]) -> None:
    for at, n in steps:
        await asyncio.sleep(max(0.0, at - load.clock()))
        load.set_clients(n)


def main(a: argparse.Namespace) -> int:
    import json

    from ..lib.cluster import LocalCluster, cluster_config, write_config
    from ..lib.procs import free_port, wait_for
    from ..lib.serve import get_path

    out = Path(a.out)
    steps = a.steps
    port = free_port()
    # The weights from the default cache directory, which the nodes find as this process does.
    cfg = cluster_config(
        port=port,
        max_rows=a.max_rows,
        target_fill=a.target_fill,
        acoustic_bounds=(1, a.max_replicas),
        upscale_delay_s=a.upscale_delay_s,
        downscale_delay_s=a.downscale_delay_s,
    )
    segments = get_path(cfg, "applications.chattts.args.segments")
    expected = expected_pcm_bytes(ONE_ROW_TEXTS, segments)
    cluster = LocalCluster(workers=a.workers)
    harness = Harness(out, KIND.write, a.argv)
    report, meta = harness.report, harness.meta
    report["config"] = {
        "steps": steps,
        "max_rows": a.max_rows,
        "target_fill": a.target_fill,
        "acoustic_bounds": [1, a.max_replicas],
        "upscale_delay_s": a.upscale_delay_s,
        "downscale_delay_s": a.downscale_delay_s,
        "workers": a.workers,
    }
    with harness:
        try:
            meta["cluster_start_s"] = round(cluster.start(), 1)
            t0 = time.monotonic()
            deployed = cluster.serve("deploy", str(write_config(cfg, out / "serve.cluster.yaml")))
            if deployed.returncode != 0:
                raise RuntimeError(f"serve deploy failed: {deployed.stderr[-2000:]}")
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: httpx.get(url + "/readyz", timeout=5).status_code == 200, 600, what="/readyz 200")
            meta["deploy_to_ready_s"] = round(time.monotonic() - t0, 1)
            print(f"cluster up in {meta['cluster_start_s']} s, app ready in {meta['deploy_to_ready_s']} s", flush=True)

            async def drive() -> tuple[list, list, list]:
                async with StepLoad(url) as load:
                    sampler = ClusterSampler(cluster, load.clock).start()
                    try:
                        await _drive(load, steps)
                        await load.stop()
                        await asyncio.sleep(DRAIN_S)
                    finally:
                        sampler.stop(timeout_s=30)
                    return load.records, sampler.samples, load.steps

            records, samples, done_steps = asyncio.run(drive())
        finally:
            cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)  # Ray's logs of the run (kept when it failed)
        report.update(
            events=scale_events(samples, done_steps),
            requests=failures(records, expected),
            timeline=per_second(records, samples, done_steps, expected),
            records=[_record(r, expected) for r in records],
        )
    print(json.dumps({"events": report["events"], "requests": report["requests"]}, indent=1))
    return 0 if report["requests"]["failed"] == 0 else 1


def _record(r: RequestRecord, expected: dict[str, int]) -> dict:
    d = {k: v for k, v in asdict(r).items() if k not in ("chunks", "text", "cache", "expected_audio_s")}
    d["complete"] = complete(r, expected)
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in d.items()}
