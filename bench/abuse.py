"""A polite client's first audio alone and under a mix of attackers, in one run.

The polite client (its own key) sends one short sentence at a time and times the first audio
byte. In the attacked phases, at the same time:

- ``costly``: another key keeps more streams open than it may (``--costly-streams``), each the
  longest legitimate input (``max_input_chars`` of Chinese at speed 1) or one that is too
  costly (the same at speed 0.25);
- ``idle``: WebSockets that never speak (``--idle-sockets``), reopened as the server closes them;
- ``slow``: request bodies sent a byte a second (``--slow-bodies``), with and without a key;
- ``flood``: WebSocket sessions of the attacking key sending hundreds of one-character flushes.

Alone and attacked phases alternate (``--rounds``), so both see the same machine. The report
gives the polite client's first-audio p50 in each condition, their ratio (target <= 1.5), what
each attacker got (statuses, close codes), and the replicas' peak RSS when the app is ours.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import httpx

from .lib.harness import Harness
from .lib.render import fmt, render_files, write_files
from .lib.stats import percentiles, ratio

POLITE_KEY = "polite-key-of-the-abuse-bench"
ATTACKER_KEY = "attacker-key-of-the-abuse-bench"
POLITE_TEXT = "你好，欢迎使用语音合成服务。"
TARGET_RATIO = 1.5


def _ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/v1/audio/speech/stream"


class Tally:
    """What one attacker got back: outcomes by name, counted."""

    def __init__(self) -> None:
        self.outcomes: Counter = Counter()

    def add(self, outcome: Any) -> None:
        self.outcomes[str(outcome)] += 1


# ---------------------------------------------------------------------------------------- the polite client


async def polite_requests(url: str, n: int, seed0: int) -> list[Optional[float]]:
    """``n`` requests one after another; each one's seconds to its first audio byte (None: failed)."""
    out: list[Optional[float]] = []
    headers = {"Authorization": f"Bearer {POLITE_KEY}", "Cache-Control": "no-store"}
    async with httpx.AsyncClient(base_url=url, timeout=120, trust_env=False) as client:
        for i in range(n):
            body = {"model": "chattts", "input": POLITE_TEXT, "voice": "nova", "seed": seed0 + i, "response_format": "pcm"}
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


# ---------------------------------------------------------------------------------------- attackers


async def costly(url: str, streams: int, chars: int, stop: asyncio.Event, tally: Tally) -> None:
    long_text = ("语音合成服务需要在异常输入面前保持稳定。" * (chars // 19 + 1))[:chars]
    headers = {"Authorization": f"Bearer {ATTACKER_KEY}", "Cache-Control": "no-store"}

    async def one(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300, trust_env=False) as client:
            k = 0
            while not stop.is_set():
                k += 1
                speed = 0.25 if k % 2 else 1.0  # too costly, then the longest legitimate input
                body = {"input": long_text, "speed": speed, "seed": i * 100000 + k, "response_format": "pcm"}
                try:
                    async with client.stream("POST", "/v1/audio/speech", json=body, headers=headers) as r:
                        tally.add(f"{r.status_code} speed {speed:g}")
                        async for _ in r.aiter_raw():
                            if stop.is_set():
                                break
                except httpx.HTTPError as exc:
                    tally.add(exc.__class__.__name__)
                if not stop.is_set():
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(one(i) for i in range(streams)))


async def idle_sockets(url: str, n: int, stop: asyncio.Event, tally: Tally) -> None:
    import websockets

    async def one() -> None:
        while not stop.is_set():
            try:
                async with websockets.connect(_ws_url(url), open_timeout=30) as ws:
                    tally.add("opened")
                    try:
                        await ws.recv()
                    except websockets.ConnectionClosed as exc:
                        tally.add(f"closed {exc.rcvd.code if exc.rcvd else 'no code'}")
            except websockets.InvalidStatus as exc:
                tally.add(f"refused {exc.response.status_code}")
            except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
                tally.add(exc.__class__.__name__)
            await asyncio.sleep(0.1)

    await asyncio.gather(*(one() for _ in range(n)))


async def slow_bodies(url: str, n: int, stop: asyncio.Event, tally: Tally) -> None:
    host, port = url.split("://", 1)[1].split(":")
    body = json.dumps({"input": "慢慢地发送请求体。" * 20}).encode()

    async def one(i: int) -> None:
        keyed = i % 2 == 0  # half with the attacker's key (read slowly), half without (refused at once)
        while not stop.is_set():
            auth = f"Authorization: Bearer {ATTACKER_KEY}\r\n" if keyed else ""
            head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{auth}"
                    f"Content-Length: {len(body)}\r\n\r\n").encode()
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
                writer.write(head)
                await writer.drain()
                status = None
                for b in body:
                    try:
                        line = await asyncio.wait_for(reader.readline(), 1.0)
                    except asyncio.TimeoutError:
                        writer.write(bytes([b]))
                        await writer.drain()
                        if stop.is_set():
                            break
                        continue
                    status = line.split()[1].decode() if line.startswith(b"HTTP/") else "closed"
                    break
                tally.add(f"{'key' if keyed else 'no key'} {status or 'sent whole'}")
                writer.close()
            except OSError as exc:
                tally.add(exc.__class__.__name__)
            await asyncio.sleep(0.1)

    await asyncio.gather(*(one(i) for i in range(n)))


async def flush_flood(url: str, sessions: int, flushes: int, stop: asyncio.Event, tally: Tally) -> None:
    import websockets

    async def one() -> None:
        while not stop.is_set():
            try:
                async with websockets.connect(_ws_url(url), open_timeout=30,
                                              additional_headers={"Authorization": f"Bearer {ATTACKER_KEY}"}) as ws:
                    await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
                    for _ in range(flushes):
                        await ws.send(json.dumps({"type": "text.append", "text": "啊"}))
                        await ws.send(json.dumps({"type": "text.flush"}))
                    await ws.send(json.dumps({"type": "close"}))
                    async for message in ws:
                        if isinstance(message, str) and json.loads(message).get("type") in ("done", "error"):
                            tally.add(json.loads(message)["type"] if "error" not in message else json.loads(message)["error"]["code"])
                            break
            except websockets.ConnectionClosed as exc:
                tally.add(f"closed {exc.rcvd.code if exc.rcvd else 'no code'}")
            except (OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
                tally.add(exc.__class__.__name__)
            await asyncio.sleep(0.2)

    await asyncio.gather(*(one() for _ in range(sessions)))


# ---------------------------------------------------------------------------------------- one run


async def attacked(url: str, a: argparse.Namespace, seed0: int, tallies: dict[str, Tally]) -> list[Optional[float]]:
    """The polite client's requests while every attacker runs (after ``--ramp-s`` to get going)."""
    stop = asyncio.Event()
    attackers = [
        asyncio.ensure_future(costly(url, a.costly_streams, a.costly_chars, stop, tallies["costly"])),
        asyncio.ensure_future(idle_sockets(url, a.idle_sockets, stop, tallies["idle"])),
        asyncio.ensure_future(slow_bodies(url, a.slow_bodies, stop, tallies["slow"])),
        asyncio.ensure_future(flush_flood(url, a.flood_sessions, a.flood_flushes, stop, tallies["flood"])),
    ]
    try:
        await asyncio.sleep(a.ramp_s)
        return await polite_requests(url, a.requests, seed0)
    finally:
        stop.set()
        for task in attackers:
            task.cancel()
        await asyncio.gather(*attackers, return_exceptions=True)


def summarize(values: list[Optional[float]]) -> dict:
    ok = [v for v in values if v is not None]
    return {**percentiles(ok, (50, 90), extras=("max",)), "n": len(values), "failed": len(values) - len(ok)}


def to_markdown(report: dict) -> str:
    m = report["meta"]
    lines = [f"# Abuse benchmark, {m['started']}", "", f"`{m['command']}`", "",
             f"weights: {m['weights']}; front guard: {m.get('front_guard', 'off')}; load average at start {m.get('loadavg_start')}", ""]
    if "error" in report:
        lines += [f"**The run failed:** `{report['error']}`", ""]
    alone, under = report.get("alone", {}), report.get("attacked", {})
    lines += ["| polite client, first audio | n | failed | p50 ms | p90 ms |", "|---|---|---|---|---|"]
    for name, s in (("alone", alone), ("under attack", under)):
        if s:
            lines.append(f"| {name} | {s['n']} | {s['failed']} | {fmt(s['p50'] and 1000 * s['p50'], 0)} "
                         f"| {fmt(s['p90'] and 1000 * s['p90'], 0)} |")
    if "ratio_p50" in report:
        met = report["ratio_p50"] is not None and report["ratio_p50"] <= TARGET_RATIO
        lines += ["", f"**p50 under attack / alone: {report['ratio_p50']}** (target <= {TARGET_RATIO}: "
                  f"{'met' if met else 'missed'})"]
    lines += ["", "| attacker | what it got (count) |", "|---|---|"]
    for name, outcomes in report.get("attackers", {}).items():
        lines.append(f"| {name} | " + ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items())) + " |")
    if report.get("rss_peak_mib"):
        lines += ["", "| replica | peak RSS MiB, alone | under attack |", "|---|---|---|"]
        for group, alone_mib in report["rss_peak_mib"].get("alone", {}).items():
            lines.append(f"| {group} | {alone_mib} | {report['rss_peak_mib'].get('attacked', {}).get(group, '–')} |")
    return "\n".join(lines) + "\n"


def write_report(report: dict, out: Path) -> None:
    write_files(report, out, "abuse.json", to_markdown, indent=1)


def render(report: dict, out: Path) -> None:
    render_files(report, out, to_markdown)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="a running app whose keys include the bench's two (default: start config/serve.yaml)")
    p.add_argument("--weights", default="random-tiny", choices=["random", "random-tiny"])
    p.add_argument("--config", help="Serve config file (default config/serve.yaml)")
    p.add_argument("--ray-cpus", type=float)
    p.add_argument("--rounds", type=int, default=2, help="alone/attacked pairs")
    p.add_argument("--requests", type=int, default=12, help="polite requests per phase")
    p.add_argument("--ramp-s", type=float, default=8.0, help="attackers run this long before the polite client starts")
    p.add_argument("--costly-streams", type=int, default=24)
    p.add_argument("--costly-chars", type=int, default=4096)
    p.add_argument("--idle-sockets", type=int, default=200)
    p.add_argument("--slow-bodies", type=int, default=40)
    p.add_argument("--flood-sessions", type=int, default=4)
    p.add_argument("--flood-flushes", type=int, default=300)
    p.add_argument("--set", action="append", default=[], metavar="PATH=VALUE",
                   help="any config value by dotted path (as in `bench run`)")
    p.add_argument("--front-guard", default="on", choices=["on", "off"],
                   help="the front guard in Serve's proxy (serve_app/http/front_guard.py), with its default settings")
    p.add_argument("--out", help="write abuse.json and report.md here")


def main(a: argparse.Namespace) -> int:
    from .lib.procs import classify_serve, free_port
    from .lib.sampler import RssSampler
    from .lib.serve import ServeRunner, apply_overrides, load_config, parse_sets

    runner = None
    url = a.url
    harness = Harness(Path(a.out) if a.out else None, write_report, a.argv, weights=a.weights if not a.url else "as served")
    report = harness.report
    tallies = {name: Tally() for name in ("costly", "idle", "slow", "flood")}
    with harness:
        try:
            if url is None:
                os.environ["CHATTTS_API_KEYS"] = f"{POLITE_KEY},{ATTACKER_KEY}"  # the replicas inherit it
                cfg = apply_overrides(load_config(a.config), weights=a.weights, port=free_port(),
                                      overrides={"applications.chattts.args.ingress.security.auth": "required", **parse_sets(a.set)})
                runner = ServeRunner(cfg, a.ray_cpus, front_guard=a.front_guard == "on")
                harness.meta["front_guard"] = a.front_guard
                harness.meta["overrides"] = a.set
                harness.meta["serve_start_s"] = round(runner.start(), 1)
                url = runner.base_url
            sampler = RssSampler(lambda: [os.getpid()], classify_serve).start() if runner else None
            asyncio.run(polite_requests(url, 3, 10**6))  # one-off costs of the first requests
            alone: list[Optional[float]] = []
            under: list[Optional[float]] = []
            peaks: dict[str, dict[str, float]] = {"alone": {}, "attacked": {}}
            for r in range(a.rounds):
                for phase in ("alone", "attacked"):
                    if sampler:
                        sampler.window()
                    seed0 = random.Random(r).randrange(10**6) + (0 if phase == "alone" else 10**5)
                    if phase == "alone":
                        alone += asyncio.run(polite_requests(url, a.requests, seed0))
                    else:
                        under += asyncio.run(attacked(url, a, seed0, tallies))
                        if runner:
                            runner.wait_idle(120)
                    if sampler:
                        for group, mib in sampler.window()["peak_by_process_mib"].items():
                            peaks[phase][group] = max(peaks[phase].get(group, 0.0), mib)
                    print(f"round {r + 1} {phase}: {summarize(alone if phase == 'alone' else under)}", file=sys.stderr)
            report["alone"], report["attacked"] = summarize(alone), summarize(under)
            report["ratio_p50"] = ratio(report["attacked"].get("p50"), report["alone"].get("p50"), 3)
            report["target_ratio"] = TARGET_RATIO
            if sampler:
                sampler.stop()
                report["rss_peak_mib"] = peaks
        finally:
            report["attackers"] = {name: dict(t.outcomes) for name, t in tallies.items()}
            if runner:
                runner.stop()
    print(to_markdown(report))
    return 0
