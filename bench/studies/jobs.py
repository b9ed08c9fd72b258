"""An interactive client's first audio alone and beside a background job, in one run.

The interactive client sends one short sentence at a time (a fresh seed each, no cache) and
times the first audio byte. In the "job" phases a long job (``POST /v1/audio/jobs``,
``--job-chars`` of Chinese prose) runs meanwhile: the runner keeps ``jobs.chunks_per_acoustic_replica``
chunks decoding (one Acoustic replica here), their segments at ``jobs.priority`` (-10), so the interactive rows are admitted
first. Alone and job phases alternate (``--rounds``), so both see the same machine; each job
phase's job is cancelled (DELETE) at its end. The report gives the interactive first-audio p50
and p90 in each condition, their ratio (target <= 1.3) and what the job made meanwhile
(characters and audio seconds per second of wall time).

    python -m bench jobs --out bench/results/jobs-<date>      # starts config/serve.yaml, tiny weights
    python -m bench jobs --url http://127.0.0.1:8000          # a running app (no keys)
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from ..lib.harness import Harness
from ..lib.report import Col, Doc, Kind, failed, ms
from ..lib.stats import percentiles, ratio

TARGET_RATIO = 1.3
INTERACTIVE_TEXT = "你好，欢迎使用语音合成服务。"
JOB_PARAGRAPH = "从前有一座山，山上有一座庙。庙里住着一个老和尚和一个小和尚，老和尚每天给小和尚讲故事。"


async def interactive(url: str, n: int, seed0: int) -> list[Optional[float]]:
    """``n`` requests one after another; each one's seconds to its first audio byte (None: failed)."""
    out: list[Optional[float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as client:
        for i in range(n):
            body = {
                "model": "chattts",
                "input": INTERACTIVE_TEXT,
                "voice": "nova",
                "seed": seed0 + i,
                "response_format": "pcm",
            }
            t0 = time.perf_counter()
            first = None
            try:
                async with client.stream(
                    "POST", "/v1/audio/speech", json=body, headers={"Cache-Control": "no-store"}
                ) as r:
                    async for chunk in r.aiter_raw():
                        if chunk and first is None and r.status_code == 200:
                            first = time.perf_counter() - t0
            except httpx.HTTPError:
                first = None
            out.append(first)
            await asyncio.sleep(0.05)
    return out


def job_text(chars: int) -> str:
    paragraphs = [JOB_PARAGRAPH] * max(1, chars // len(JOB_PARAGRAPH))
    return "\n\n".join(paragraphs)


async def beside_a_job(url: str, n: int, seed0: int, chars: int) -> tuple[list[Optional[float]], dict[str, Any]]:
    """The interactive requests while a job runs; what the job made meanwhile."""
    async with httpx.AsyncClient(base_url=url, timeout=60, trust_env=False) as client:
        r = await client.post(
            "/v1/audio/jobs", json={"input": job_text(chars), "voice": "alloy", "seed": seed0, "response_format": "pcm"}
        )
        r.raise_for_status()
        job_id = r.json()["id"]
        try:
            t0 = time.perf_counter()
            while True:  # its first chunks decoding before the interactive client starts
                job = (await client.get(f"/v1/audio/jobs/{job_id}")).json()
                if job["status"] == "running" and time.perf_counter() - t0 > 1.0:
                    break
                if job["status"] not in ("queued", "running") or time.perf_counter() - t0 > 60:
                    raise RuntimeError(f"the background job did not start: {job['status']}")
                await asyncio.sleep(0.2)
            before = job["progress"]
            t_start = time.perf_counter()
            firsts = await interactive(url, n, seed0 + 1)
            wall = time.perf_counter() - t_start
            job = (await client.get(f"/v1/audio/jobs/{job_id}")).json()
            after = job["progress"]
            if job["status"] not in ("queued", "running"):
                print(
                    f"warning: the job was {job['status']} before the phase ended: raise --job-chars", file=sys.stderr
                )
            made = {
                "wall_s": round(wall, 2),
                "status_at_end": job["status"],
                "chars_per_s": round((after["characters_done"] - before["characters_done"]) / wall, 2),
                "audio_s_per_s": round((after["audio_seconds"] - before["audio_seconds"]) / wall, 3),
                "chunks_done": after["chunks_done"],
                "chunks_total": after["chunks_total"],
            }
        finally:
            await client.delete(f"/v1/audio/jobs/{job_id}")
    return firsts, made


def summarize(values: list[Optional[float]]) -> dict[str, Any]:
    ok = [v for v in values if v is not None]
    return {**percentiles(ok, qs=(50, 90), extras=()), "failed": len(values) - len(ok)}


FIRST_AUDIO = [
    Col("interactive client, first audio", 0),
    Col("n", lambda x: x[1]["n"]),
    Col("failed", lambda x: x[1]["failed"]),
    Col("p50 ms", lambda x: ms(x[1]["p50"]), nd=0),
    Col("p90 ms", lambda x: ms(x[1]["p90"]), nd=0),
]
JOB_PHASES = [
    Col("job phase", lambda x: x[0] + 1),
    Col("wall s", lambda x: str(x[1]["wall_s"])),
    Col("characters/s", lambda x: str(x[1]["chars_per_s"])),
    Col("audio s/s", lambda x: str(x[1]["audio_s_per_s"])),
    Col("chunks done / total", lambda x: f"{x[1]['chunks_done']} / {x[1]['chunks_total']}"),
    Col("status at end", lambda x: str(x[1]["status_at_end"])),
]


def to_doc(report: dict) -> Doc:
    doc = Doc("Interactive first audio beside a background job", report["meta"].get("command", ""))
    if report.get("error"):
        doc.add(failed(report), "")
    phases = [
        (name, report[key]) for name, key in (("alone", "alone"), ("beside a job", "with_job")) if report.get(key)
    ]
    doc.table(FIRST_AUDIO, phases, before=())
    if "ratio_p50" in report:
        met = report["ratio_p50"] is not None and report["ratio_p50"] <= TARGET_RATIO
        doc.add(
            "",
            f"**p50 beside a job / alone: {report['ratio_p50']}** (target <= {TARGET_RATIO}: "
            f"{'met' if met else 'missed'})",
        )
    if report.get("job_phases"):
        doc.table(JOB_PHASES, enumerate(report["job_phases"]))
    return doc


KIND = Kind("jobs.json", to_doc, indent=1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="a running app without keys (default: start config/serve.yaml)")
    p.add_argument("--weights", default="random-tiny", choices=["random", "random-tiny"])
    p.add_argument("--config", help="Serve config file (default config/serve.yaml)")
    p.add_argument("--ray-cpus", type=float)
    p.add_argument("--rounds", type=int, default=2, help="alone/job pairs")
    p.add_argument("--requests", type=int, default=10, help="interactive requests per phase")
    p.add_argument(
        "--job-chars", type=int, default=3000, help="the background job's text (long enough to outlast a phase)"
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="any config value by dotted path (as in `bench run`), e.g. "
        "applications.chattts.args.jobs.chunks_per_acoustic_replica=4",
    )
    p.add_argument("--out", help="write jobs.json and report.md here")


def main(a: argparse.Namespace) -> int:
    from ..lib.procs import free_port
    from ..lib.serve import ServeRunner, apply_overrides, load_config, parse_sets

    runner = None
    url = a.url
    harness = Harness(
        Path(a.out) if a.out else None, KIND.write, a.argv, weights=a.weights if not a.url else "as served"
    )
    report = harness.report
    store = tempfile.TemporaryDirectory(prefix="bench-jobs-") if url is None else None
    with harness:
        try:
            if url is None:
                # No keys here: jobs are open to anonymous callers only when the config says so.
                overrides = {
                    "applications.chattts.args.jobs.path": store.name,
                    "applications.chattts.args.jobs.allow_anonymous": True,
                    **parse_sets(a.set),
                }
                cfg = apply_overrides(load_config(a.config), weights=a.weights, port=free_port(), overrides=overrides)
                runner = ServeRunner(cfg, a.ray_cpus)
                harness.meta["serve_start_s"] = round(runner.start(), 1)
                harness.meta["overrides"] = a.set
                url = runner.base_url
            asyncio.run(interactive(url, 3, 10**6))  # one-off costs of the first requests
            alone: list[Optional[float]] = []
            beside: list[Optional[float]] = []
            phases: list[dict] = []
            for r in range(a.rounds):
                for phase in ("alone", "job"):
                    seed0 = random.Random(r).randrange(10**6) + (0 if phase == "alone" else 10**5)
                    if phase == "alone":
                        alone += asyncio.run(interactive(url, a.requests, seed0))
                    else:
                        firsts, made = asyncio.run(beside_a_job(url, a.requests, seed0, a.job_chars))
                        beside += firsts
                        phases.append(made)
                        if runner:
                            runner.wait_idle(120)
                    print(f"round {r + 1} {phase}: {summarize(alone if phase == 'alone' else beside)}", file=sys.stderr)
            report["alone"], report["with_job"] = summarize(alone), summarize(beside)
            report["job_phases"] = phases
            report["ratio_p50"] = ratio(report["with_job"].get("p50"), report["alone"].get("p50"), 3)
            report["target_ratio"] = TARGET_RATIO
        finally:
            if runner:
                runner.stop()
            if store is not None:
                store.cleanup()
    print(KIND.markdown(report))
    return 0


if __name__ == "__main__":
    ap = argparse.ArgumentParser(prog="python -m bench jobs", description=__doc__.strip().split("\n\n")[0])
    add_arguments(ap)
    ns = ap.parse_args()
    ns.argv = ["jobs", *sys.argv[1:]]  # recorded as the `python -m bench jobs` command it equals
    sys.exit(main(ns))
