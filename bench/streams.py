"""``python -m bench streams``: what listeners hear past the service's real-time capacity
(bench/README.md, "streams").

Each client is a voice agent's listener: it asks for an answer streamed as pcm, plays it at 1x
from ``--prebuffer`` seconds after its first bytes (the silence it hears when the audio runs out
is a stall: engine/playback.py's ``PlaybackClock`` over the bytes as they arrive), and once it
has heard it to the end asks for the next one (a conversation: no listener wants more than 1x).
A stream is smooth when its listener heard at most 0.25 s of silence. A 503 ``capacity_exhausted``
is the service telling the client it would stall: it waits the Retry-After and asks again.

First the capacity: the audio seconds per second the service makes for ``--probe-clients``
clients that take it as fast as it comes (C; floor(C) streams is what an ideal service keeps at 1x).
Then, for each scheduling (``fair``: the earlier one, ``deadline``: the shipped one, applied live
through the Acoustic user_config), loads of ``--loads`` x C clients for ``--duration`` seconds
each. Per load: streams smooth, stall seconds (all, worst), smooth streams playing at once (on
average over the load's time), refusals and how fast they came, other errors, first audio p50/p99,
goodput (smooth audio seconds per wall second), and a lone stream's first audio and rate.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from serve_app.engine.playback import PlaybackClock

from .lib.corpus import BYTES_PER_AUDIO_SECOND, text_stream
from .lib.harness import Harness, floats
from .lib.report import TARGETS, Col, Doc, Figure, Kind, Panel, failed, line, target
from .lib.serve import add_app_arguments
from .lib.stats import median, nearest_rank

SMOOTH_S = 0.25  # a listener who heard at most this much silence heard a smooth stream
SCHEDULINGS = ("fair", "deadline")
LOADS = (0.5, 1.0, 1.5, 2.0)


def client_key(i: int) -> str:
    """Client ``i``'s API key: every client a caller of its own (as the agents of many users)."""
    return f"bench-streams-client-{i:04d}"


async def listen(client: httpx.AsyncClient, text: str, seed: int, prebuffer: float) -> dict[str, Any]:
    """One answer as its listener hears it."""
    t0 = time.monotonic()
    clock = PlaybackClock(prebuffer)
    body = {"input": text, "response_format": "pcm", "seed": seed}
    try:
        async with client.stream("POST", "/v1/audio/speech", json=body) as r:
            answered = time.monotonic() - t0
            if r.status_code != 200:
                raw = await r.aread()
                code = None
                try:
                    code = r.json()["error"]["code"] if raw else None
                except Exception:  # noqa: BLE001 - not an OpenAI body
                    pass
                retry = r.headers.get("retry-after")
                return {"status": r.status_code, "code": code, "answered_s": answered, "retry_after": retry}
            first = None
            async for data in r.aiter_bytes():
                now = time.monotonic()
                if first is None and data:
                    first = now - t0
                clock.deliver(len(data) / BYTES_PER_AUDIO_SECOND, now)
    except httpx.HTTPError as exc:
        return {"status": "error", "code": exc.__class__.__name__, "answered_s": time.monotonic() - t0}
    end = time.monotonic()
    audio = clock.delivered_s
    # The listener plays to the end: the stream occupies it until its last sample is heard.
    heard_until = (clock.first_at or end) + clock.prebuffer_s + audio + clock.stall_s
    return {
        "status": 200,
        "first_audio_s": first,
        "audio_s": audio,
        "stall_s": clock.stall_s,
        "started": t0,
        "playing": (t0 + (first or 0.0) + clock.prebuffer_s, max(end, heard_until)),
        "download_s": end - t0,
    }


def http_client(url: str, i: int) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {client_key(i)}", "Cache-Control": "no-store"}
    return httpx.AsyncClient(base_url=url, timeout=600, trust_env=False, headers=headers)


async def client_loop(
    url: str, until: float, i: int, seed: int, prebuffer: float, out: list, plays: bool = True
) -> None:
    """Client ``i``: an answer, heard to its end at 1x (``plays``; else taken as fast as it comes),
    then the next, until ``until`` (the answer in flight then is finished). A listener asks again
    once it has heard the answer, as in a conversation: it never wants more than 1x."""
    texts = text_stream(seed)
    rng = random.Random(seed)
    await asyncio.sleep(rng.uniform(0.0, 1.0))  # clients do not all ask in the same millisecond
    async with http_client(url, i) as client:
        n = 0
        while time.monotonic() < until:
            got = await listen(client, next(texts), seed * 1000 + n, prebuffer)
            n += 1
            out.append(got)
            if got["status"] != 200:
                wait = float(got.get("retry_after") or 1.0)
            elif plays:
                wait = got["playing"][1] - time.monotonic()
            else:
                continue
            await asyncio.sleep(max(0.0, min(wait, until - time.monotonic())))


async def run_load(url: str, clients: int, duration_s: float, prebuffer: float, seed: int) -> dict[str, Any]:
    t0 = time.monotonic()
    results: list[dict] = []
    await asyncio.gather(*(client_loop(url, t0 + duration_s, i, seed + i, prebuffer, results) for i in range(clients)))
    return summarise(results, clients, t0, time.monotonic())


def summarise(results: list[dict], clients: int, t0: float, t1: float) -> dict[str, Any]:
    served = [r for r in results if r["status"] == 200]
    smooth = [r for r in served if r["stall_s"] <= SMOOTH_S]
    refused = [r for r in results if r["status"] == 503 and r.get("code") == "capacity_exhausted"]
    other = [r for r in results if r not in served and r not in refused]
    wall = max(1e-9, t1 - t0)
    # Smooth streams playing at once, on average over the load's time (each from when its
    # listener started playing to when it heard its last sample).
    playing = sum(min(t1, b) - max(t0, a) for a, b in (r["playing"] for r in smooth) if b > a)
    firsts = [r["first_audio_s"] for r in served if r["first_audio_s"] is not None]
    stalls = [r["stall_s"] for r in served]
    told = [r["answered_s"] for r in refused]
    return {
        "clients": clients,
        "wall_s": round(wall, 2),
        "streams": len(served),
        "smooth": len(smooth),
        "smooth_at_once": round(playing / wall, 2),
        "stall_s": {"total": round(sum(stalls), 2), "worst": round(max(stalls, default=0.0), 2)},
        "refused": len(refused),
        "refused_after_s": {
            "p50": _r(median(told)),
            "p99": _r(nearest_rank(told, 0.99)),
            "max": _r(max(told, default=None)),
        },
        "other_errors": len(other),
        "server_errors": sum(1 for r in other if isinstance(r["status"], int) and r["status"] >= 500),
        "first_audio_s": {"p50": _r(median(firsts)), "p99": _r(nearest_rank(firsts, 0.99))},
        "goodput": round(sum(r["audio_s"] for r in smooth) / wall, 3),
        "audio_s_per_s": round(sum(r["audio_s"] for r in served) / wall, 3),
    }


def _r(x: Optional[float], nd: int = 3) -> Optional[float]:
    return None if x is None else round(x, nd)


async def probe(url: str, clients: int, duration_s: float, seed: int) -> float:
    """Audio seconds per second for ``clients`` that take every answer as fast as it comes."""
    t0 = time.monotonic()
    results: list[dict] = []
    await asyncio.gather(
        *(client_loop(url, t0 + duration_s, i, seed + i, 0.5, results, plays=False) for i in range(clients))
    )
    served = [r for r in results if r["status"] == 200]
    refused = len(results) - len(served)
    if refused:  # told to wait (the queue's busy check): the figure is below the service's rate
        print(f"capacity probe: {refused} of {len(results)} answers refused", file=sys.stderr)
    return sum(r["audio_s"] for r in served) / (time.monotonic() - t0)


async def lone(url: str, seed: int, prebuffer: float, n: int = 3) -> dict[str, Any]:
    """A lone stream's first audio and rate (the best of ``n``)."""
    async with http_client(url, 0) as client:
        got = [await listen(client, t, seed + i, prebuffer) for i, t in zip(range(n), text_stream(seed))]
    ok = [r for r in got if r["status"] == 200]
    return {
        "first_audio_s": _r(min((r["first_audio_s"] for r in ok), default=None)),
        "audio_s_per_s": _r(max((r["audio_s"] / r["download_s"] for r in ok), default=None)),
    }


# ---------------------------------------------------------------------------------------- report


def targets(report: dict) -> dict[str, dict]:
    cap = report.get("capacity_audio_s_per_s")
    by = report.get("schedulings", {})
    dl = by.get("deadline", {}).get("loads", {})
    out: dict[str, dict] = {}
    if not cap or not dl:
        return out
    ideal = math.floor(cap)
    for k, lv in dl.items():
        load = float(k)
        if load <= 0.8:
            out[f"deadline {k}x: streams smooth (of {lv['streams']})"] = target(lv["smooth"], ">=", lv["streams"])
        if load >= 1.5:
            out[f"deadline {k}x: smooth at once / floor(capacity)"] = target(
                lv["smooth_at_once"] / ideal if ideal else None, ">=", 0.9
            )
            out[f"deadline {k}x: refusals told within (s, p99)"] = target(
                lv["refused_after_s"]["p99"] or 0.0, "<=", 1.0
            )
            out[f"deadline {k}x: streams not smooth"] = target(lv["streams"] - lv["smooth"], "<=", 0)
            out[f"deadline {k}x: 5xx other than capacity_exhausted"] = target(lv["server_errors"], "<=", 0)
            out[f"deadline {k}x: goodput / capacity"] = target(lv["goodput"] / cap, ">=", 0.85)
    fair = by.get("fair", {}).get("loads", {}).get("1.5")
    if fair and dl.get("1.5"):
        out["1.5x: smooth streams deadline / fair"] = target(dl["1.5"]["smooth"] / max(1, fair["smooth"]), ">=", 2.0)
    lone_dl, lone_fair = by.get("deadline", {}).get("lone"), by.get("fair", {}).get("lone")
    if lone_dl and lone_fair and lone_dl["first_audio_s"] and lone_fair["first_audio_s"]:
        out["lone stream first audio deadline / fair"] = target(
            lone_dl["first_audio_s"] / lone_fair["first_audio_s"], "<=", 1.1
        )
        out["lone stream rate deadline / fair"] = target(
            lone_dl["audio_s_per_s"] / lone_fair["audio_s_per_s"], ">=", 0.9
        )
    return out


def _rows(report: dict) -> list[tuple[str, dict]]:
    return [
        (f"{s} {k}x", lv)
        for s, sched in report.get("schedulings", {}).items()
        for k, lv in sched.get("loads", {}).items()
    ]


COLUMNS = [
    Col("scheduling, load", 0),
    Col("clients", lambda x: str(x[1]["clients"])),
    Col("streams smooth / served", lambda x: f"{x[1]['smooth']} / {x[1]['streams']}"),
    Col("smooth at once", lambda x: f"{x[1]['smooth_at_once']:.1f}"),
    Col("stall s total / worst", lambda x: f"{x[1]['stall_s']['total']:.1f} / {x[1]['stall_s']['worst']:.1f}"),
    Col(
        "refused (told after p50 / p99 s)",
        lambda x: f"{x[1]['refused']} ({x[1]['refused_after_s']['p50']} / {x[1]['refused_after_s']['p99']})",
    ),
    Col("other errors (5xx)", lambda x: f"{x[1]['other_errors']} ({x[1]['server_errors']})"),
    Col("first audio p50 / p99 (s)", lambda x: f"{x[1]['first_audio_s']['p50']} / {x[1]['first_audio_s']['p99']}"),
    Col("goodput / served (audio s/s)", lambda x: f"{x[1]['goodput']:.2f} / {x[1]['audio_s_per_s']:.2f}"),
]


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Streams benchmark: listeners at 1x past capacity, {m['started']}", m["command"])
    cap = report.get("capacity_audio_s_per_s")
    doc.add(
        f"weights: {m['weights']}, prebuffer {m['prebuffer_s']} s, {m['duration_s']} s per load, "
        f"capacity {cap and round(cap, 2)} audio s/s ({m['probe_clients']} clients as fast as they take it), "
        f"load average at start {m['loadavg_start']}",
        "",
    )
    for s, sched in report.get("schedulings", {}).items():
        if sched.get("lone"):
            doc.add(
                f"{s}: a lone stream's first audio {sched['lone']['first_audio_s']} s, {sched['lone']['audio_s_per_s']} audio s/s"
            )
    doc.add("")
    if report.get("error"):
        doc.add(failed(report, " (the tables hold what was measured before)."), "")
    doc.table(COLUMNS, _rows(report), before=())
    doc.table(TARGETS, report.get("targets", {}).items())
    return doc


def figure(report: dict) -> Optional[Figure]:
    sched = report.get("schedulings", {})
    if not sched:
        return None
    smooth = Panel("Streams smooth / served", "load (x capacity)", "share")
    stall = Panel("Silence heard, all streams (s)", "load (x capacity)", "s")
    for s, d in sched.items():
        loads = sorted(d.get("loads", {}).items(), key=lambda kv: float(kv[0]))
        xs = [float(k) for k, _ in loads]
        smooth.add(line(xs, [lv["smooth"] / max(1, lv["streams"]) for _, lv in loads], s))
        stall.add(line(xs, [lv["stall_s"]["total"] for _, lv in loads], s))
    return Figure([smooth, stall], shape=(1, 2), size=(10, 4))


KIND = Kind("streams.json", to_doc, figure, indent=1)


# ---------------------------------------------------------------------------------------- command


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_app_arguments(p, url="a running app (default: start config/serve.yaml locally with --weights)")
    p.add_argument("--loads", type=floats, default=list(LOADS), help="clients as multiples of the capacity")
    p.add_argument("--schedulings", default=",".join(SCHEDULINGS), help="acoustic.scheduling values to compare")
    p.add_argument("--duration", type=float, default=60.0, help="seconds per load")
    p.add_argument("--prebuffer", type=float, default=0.5, help="seconds a listener holds before it plays")
    p.add_argument("--probe-clients", type=int, default=8, help="clients of the capacity probe")
    p.add_argument("--probe-s", type=float, default=30.0, help="seconds of the capacity probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write streams.json, report.md and report.png here")


# Each scheduling as its own app: ``fair`` as the service was before real-time admission (no
# refusals anywhere: capacity_wait_s off, which the Vocoder's gate reads too), ``deadline`` as shipped.
SCHEDULING_OVERRIDES = {
    "fair": {"scheduling": "fair", "capacity_wait_s": None},
    "deadline": {},
}


def _start(a: argparse.Namespace, scheduling: str, harness: Harness) -> Any:
    from .lib.serve import ServeRunner

    args = "applications.chattts.args.acoustic"
    overrides = {f"{args}.{k}": v for k, v in SCHEDULING_OVERRIDES[scheduling].items()}
    runner = ServeRunner.from_args(a, overrides)
    harness.meta.setdefault("serve_start_s", {})[scheduling] = round(runner.start(), 1)
    return runner


def main(a: argparse.Namespace) -> int:
    schedulings = [s for s in a.schedulings.split(",") if s]
    if a.url and len(schedulings) > 1:
        raise SystemExit("--schedulings: comparing needs the apps this runner starts (no --url)")
    if a.url is None:
        # Every client a key of its own (the replicas inherit the variable), as a service of many
        # users' agents: the engine's per-key shares then see as many clients.
        clients = max(a.probe_clients, math.ceil(max(a.loads) * 64))
        os.environ["CHATTTS_API_KEYS"] = ",".join(client_key(i) for i in range(clients))
    weights = a.weights if not a.url else "as served"
    meta = dict(weights=weights, prebuffer_s=a.prebuffer, duration_s=a.duration, probe_clients=a.probe_clients)
    harness = Harness(Path(a.out) if a.out else None, KIND.write, a.argv, **meta)
    report = harness.report
    # The capacity is measured without admission (it would refuse the probe's clients): first.
    order = sorted(schedulings, key=lambda s: s != "fair")
    with harness:
        report["schedulings"] = {}
        for s in order:
            runner = None if a.url else _start(a, s, harness)
            url = a.url or runner.base_url
            try:
                asyncio.run(lone(url, a.seed + 10**6, a.prebuffer, 1))  # one-off costs after start-up
                if "capacity_audio_s_per_s" not in report:
                    cap = asyncio.run(probe(url, a.probe_clients, a.probe_s, a.seed + 10**5))
                    report["capacity_audio_s_per_s"] = round(cap, 3)
                    report["capacity_measured_with"] = s
                    print(f"capacity: {cap:.2f} audio s/s for {a.probe_clients} clients ({s})", file=sys.stderr)
                    harness.write()
                cap = report["capacity_audio_s_per_s"]
                sched = report["schedulings"][s] = {"lone": asyncio.run(lone(url, a.seed, a.prebuffer)), "loads": {}}
                for k in a.loads:
                    n = max(1, round(k * cap))
                    lv = asyncio.run(run_load(url, n, a.duration, a.prebuffer, a.seed))
                    sched["loads"][f"{k:g}"] = lv
                    harness.write()
                    print(
                        f"{s} {k:g}x ({n} clients): {lv['smooth']} of {lv['streams']} smooth, {lv['smooth_at_once']} "
                        f"at once, stall {lv['stall_s']['total']} s, {lv['refused']} refused, goodput {lv['goodput']}",
                        file=sys.stderr,
                    )
            finally:
                if runner:
                    runner.stop()
        report["targets"] = targets(report)
    print(KIND.markdown(report))
    return 0
