"""The abuse bench's attackers (``python -m bench abuse``, bench/abuse.py runs them).

Each is a coroutine ``(url, args, stop, tally)`` that attacks until ``stop`` is set and counts
what it got back in its ``Tally`` (statuses, error codes, close codes; the slowest answer of
each). ``ATTACKERS`` names them in the order of their flags; a count of 0 turns one off.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Optional

import httpx

POLITE_KEY = "polite-key-of-the-abuse-bench"
ATTACKER_KEY = "attacker-key-of-the-abuse-bench"
ATTACKER_HEADERS = {"Authorization": f"Bearer {ATTACKER_KEY}", "Cache-Control": "no-store"}
Attempt = Callable[[httpx.AsyncClient, int, int], Awaitable[Any]]  # (client, which client, which attempt)


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://", 1).replace("https://", "wss://", 1) + "/v1/audio/speech/stream"


class Tally:
    """What one attacker got back: outcomes by name, counted, and each one's slowest answer."""

    def __init__(self) -> None:
        self.outcomes: Counter = Counter()
        self.slowest_s: dict[str, float] = {}

    def add(self, outcome: Any, seconds: Optional[float] = None) -> None:
        self.outcomes[str(outcome)] += 1
        if seconds is not None:
            self.slowest_s[str(outcome)] = round(max(seconds, self.slowest_s.get(str(outcome), 0.0)), 2)


def _code(r: httpx.Response) -> str:
    """``status code`` of an answer (the error's code when it has one: the guard's 429 is
    ``too_many_refusals``, the service's are its own)."""
    try:
        err = r.json().get("error") if r.status_code >= 400 else None
    except ValueError:
        err = None
    return f"{r.status_code} {err.get('code')}" if isinstance(err, dict) and err.get("code") else str(r.status_code)


async def crowd(url: str, n: int, stop: asyncio.Event, tally: Tally, attempt: Attempt, pause_s: float) -> None:
    """``n`` clients, each with an httpx client of its own on ``url``, making ``attempt(client, i, k)``
    again and again, ``pause_s`` apart, until ``stop``; a transport error is counted by its name."""
    import websockets

    async def one(i: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=300, trust_env=False) as client:
            k = 0
            while not stop.is_set():
                k += 1
                try:
                    await attempt(client, i, k)
                except (httpx.HTTPError, OSError, asyncio.TimeoutError, websockets.WebSocketException) as exc:
                    tally.add(exc.__class__.__name__)
                if not stop.is_set():
                    await asyncio.sleep(pause_s)

    await asyncio.gather(*(one(i) for i in range(n)))


def _closed(exc: Any) -> str:
    return f"closed {exc.rcvd.code if exc.rcvd else 'no code'}"


# ---------------------------------------------------------------------------------------- the first four


async def costly(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """More streams than the key may hold, each the longest legitimate input or a too costly one."""
    long_text = ("语音合成服务需要在异常输入面前保持稳定。" * (a.costly_chars // 19 + 1))[: a.costly_chars]

    async def stream(client: httpx.AsyncClient, i: int, k: int) -> None:
        speed = 0.25 if k % 2 else 1.0  # too costly, then the longest legitimate input
        body = {"input": long_text, "speed": speed, "seed": i * 100000 + k, "response_format": "pcm"}
        async with client.stream("POST", "/v1/audio/speech", json=body, headers=ATTACKER_HEADERS) as r:
            tally.add(f"{r.status_code} speed {speed:g}")
            async for _ in r.aiter_raw():
                if stop.is_set():
                    break

    await crowd(url, a.costly_streams, stop, tally, stream, 0.05)


async def idle_sockets(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """WebSockets that never speak, reopened as the server closes them."""
    import websockets

    async def idle(client: httpx.AsyncClient, i: int, k: int) -> None:
        try:
            async with websockets.connect(ws_url(url), open_timeout=30) as ws:
                tally.add("opened")
                try:
                    await ws.recv()
                except websockets.ConnectionClosed as exc:
                    tally.add(_closed(exc))
        except websockets.InvalidStatus as exc:
            tally.add(f"refused {exc.response.status_code}")

    await crowd(url, a.idle_sockets, stop, tally, idle, 0.1)


async def _trickle(url: str, body: bytes, auth: Optional[str], stop: asyncio.Event) -> tuple[str, float]:
    """One POST /v1/audio/speech whose body goes a byte a second until an answer comes: its
    status (``sent whole``: none came before the last byte) and the seconds to it."""
    host, port = url.split("://", 1)[1].split(":")
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        + (f"Authorization: Bearer {auth}\r\n" if auth else "")
        + f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    t0 = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(head)
        await writer.drain()
        for b in body:
            try:
                line = await asyncio.wait_for(reader.readline(), 1.0)
            except asyncio.TimeoutError:
                writer.write(bytes([b]))
                await writer.drain()
                if stop.is_set():
                    return "stopped", time.perf_counter() - t0
                continue
            return (line.split()[1].decode() if line.startswith(b"HTTP/") else "closed"), time.perf_counter() - t0
        return "sent whole", time.perf_counter() - t0
    finally:
        writer.close()


async def slow_bodies(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Bodies sent a byte a second, half with the attacker's key (read slowly), half without."""
    body = json.dumps({"input": "慢慢地发送请求体。" * 20}).encode()

    async def slow(client: httpx.AsyncClient, i: int, k: int) -> None:
        status, _ = await _trickle(url, body, ATTACKER_KEY if i % 2 == 0 else None, stop)
        tally.add(f"{'key' if i % 2 == 0 else 'no key'} {status}")

    await crowd(url, a.slow_bodies, stop, tally, slow, 0.1)


async def flush_flood(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """WebSocket sessions of the attacking key sending hundreds of one-character flushes."""
    import websockets

    async def flood(client: httpx.AsyncClient, i: int, k: int) -> None:
        key = {"Authorization": f"Bearer {ATTACKER_KEY}"}
        try:
            async with websockets.connect(ws_url(url), open_timeout=30, additional_headers=key) as ws:
                await ws.send(json.dumps({"type": "session.start", "response_format": "pcm"}))
                for _ in range(a.flood_flushes):
                    await ws.send(json.dumps({"type": "text.append", "text": "啊"}))
                    await ws.send(json.dumps({"type": "text.flush"}))
                await ws.send(json.dumps({"type": "close"}))
                async for message in ws:
                    event = json.loads(message) if isinstance(message, str) else {}
                    if event.get("type") in ("done", "error"):
                        tally.add(event["error"]["code"] if event["type"] == "error" else "done")
                        break
        except websockets.ConnectionClosed as exc:
            tally.add(_closed(exc))

    await crowd(url, a.flood_sessions, stop, tally, flood, 0.2)


# ---------------------------------------------------------------------------------------- costly to read


def dot_job_texts(chars: int) -> dict[str, str]:
    """Job texts that were costly to plan: full stops without a space (one sentence end after
    another), 12-digit numbers (read out, ~10x the characters), and the two in one text."""
    dots = "." * chars
    numbers = " ".join(str(10**11 + 7919 * i) for i in range(chars // 13 + 1))[:chars]
    return {"dots": dots, "numbers": numbers, "dots+numbers": dots[: chars // 2] + numbers[: chars - chars // 2]}


async def dot_jobs(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Job submissions of those texts by the attacking key, again and again; each answer
    counted by shape and status (413/409/429 refused, 202 within the key's reservation), with
    its slowest answer. ``delete_jobs`` removes the accepted ones when the phase ends."""
    texts = dot_job_texts(a.dot_job_chars)

    async def submit(client: httpx.AsyncClient, i: int, k: int) -> None:
        shape = list(texts)[(i + k - 1) % len(texts)]
        t0 = time.perf_counter()
        try:
            body = {"input": texts[shape], "voice": "alloy", "seed": i + k, "response_format": "pcm"}
            r = await client.post("/v1/audio/jobs", headers=ATTACKER_HEADERS, json=body)
            tally.add(f"{shape} {_code(r)}", time.perf_counter() - t0)
        except httpx.HTTPError as exc:
            tally.add(f"{shape} {exc.__class__.__name__}", time.perf_counter() - t0)

    await crowd(url, a.dot_jobs, stop, tally, submit, 0.5)


async def delete_jobs(url: str, tally: Tally, deadline_s: float = 60.0) -> None:
    """Every job of the attacking key deleted (a submission cut off by the phase's end may still
    have been stored). The key may be held by the front guard meanwhile: tried again until a list
    is answered and empty."""
    t_end = time.monotonic() + deadline_s
    async with httpx.AsyncClient(base_url=url, timeout=30, trust_env=False) as client:
        while time.monotonic() < t_end:
            try:
                r = await client.get("/v1/audio/jobs", headers=ATTACKER_HEADERS)
                if r.status_code == 200:
                    ids = [j["id"] for j in r.json()["data"]]
                    if not ids:
                        return
                    for job_id in ids:
                        d = await client.delete(f"/v1/audio/jobs/{job_id}", headers=ATTACKER_HEADERS)
                        tally.add(f"deleted at the end {d.status_code}")
                    continue
            except httpx.HTTPError:
                pass
            await asyncio.sleep(1.0)
    tally.add("jobs left undeleted")


def silence_turns(turns: int = 12) -> list[dict[str, str]]:
    """Turns each at one SSML document's cap of breaks (12 x 10 s): 120 s each, 1440 s in all
    against the script's 480 s, within ``max_input_chars`` as the dialogue counts them."""
    ssml = "<speak>" + '<break time="10s"/>' * 12 + "嗯</speak>"
    return [{"voice": ("alloy", "echo")[i % 2], "input": ssml} for i in range(turns)]


async def silence_dialogues(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Dialogues of turns full of breaks (413 request_too_large expected: the script's silence
    is capped as a whole)."""
    body = {"turns": silence_turns(), "response_format": "pcm"}

    async def dialogue(client: httpx.AsyncClient, i: int, k: int) -> None:
        t0 = time.perf_counter()
        try:
            async with client.stream("POST", "/v1/audio/dialogue", json=body, headers=ATTACKER_HEADERS) as r:
                await r.aread()  # a 200 would be audio: read whole, it is what is being tested
                tally.add(_code(r), time.perf_counter() - t0)
        except httpx.HTTPError as exc:
            tally.add(exc.__class__.__name__, time.perf_counter() - t0)

    await crowd(url, a.silence_dialogues, stop, tally, dialogue, 0.1)


# ---------------------------------------------------------------------------------------- credentials


async def public_page_keys(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Made-up keys, each shown first to a public page (GET /healthz answers any header 200) and
    then used on speech: all 401 (or the guard's 429 once the address's budget is spent: a public
    page never makes a made-up key one the service served)."""
    body = {"input": "你好。", "response_format": "pcm"}

    async def show_then_use(client: httpx.AsyncClient, i: int, k: int) -> None:
        headers = {"Authorization": f"Bearer made-up-{secrets.token_hex(12)}", "Cache-Control": "no-store"}
        t0 = time.perf_counter()
        r = await client.get("/healthz", headers=headers)
        tally.add(f"healthz {_code(r)}", time.perf_counter() - t0)
        t0 = time.perf_counter()
        r = await client.post("/v1/audio/speech", json=body, headers=headers)
        tally.add(f"speech {_code(r)}", time.perf_counter() - t0)

    await crowd(url, a.public_page_keys, stop, tally, show_then_use, 0.05)


async def unkeyed_slow_bodies(url: str, a: argparse.Namespace, stop: asyncio.Event, tally: Tally) -> None:
    """Speech bodies of a few KB without a key, a byte a second: answered from the headers
    (401, or the guard's 429 after its tarpit), never held while the body trickles."""
    body = json.dumps({"input": "慢" * (a.unkeyed_body_bytes // 3)}).encode()[: a.unkeyed_body_bytes]

    async def slow(client: httpx.AsyncClient, i: int, k: int) -> None:
        tally.add(*await _trickle(url, body, None, stop))

    await crowd(url, a.unkeyed_slow_bodies, stop, tally, slow, 0.1)


Attacker = Callable[[str, argparse.Namespace, asyncio.Event, Tally], Awaitable[None]]
# name: (coroutine, the flag that sizes it: 0 turns it off, its default, what it is)
ATTACKERS: dict[str, tuple[Attacker, str, int, str]] = {
    "costly": (costly, "costly_streams", 24, "streams of the attacking key, the longest input at speed 1 and 0.25"),
    "idle": (idle_sockets, "idle_sockets", 200, "WebSockets that never speak"),
    "slow": (slow_bodies, "slow_bodies", 40, "bodies a byte a second, half with the attacking key"),
    "flood": (flush_flood, "flood_sessions", 4, "WebSocket sessions of one-character flushes"),
    "dot-jobs": (dot_jobs, "dot_jobs", 2, "job submitters of full stops and 12-digit numbers (attacking key)"),
    "silence-dialogues": (silence_dialogues, "silence_dialogues", 2, "dialogues of turns full of 10 s breaks"),
    "public-page-keys": (public_page_keys, "public_page_keys", 20, "made-up keys shown to /healthz, then used"),
    "unkeyed-slow-bodies": (
        unkeyed_slow_bodies,
        "unkeyed_slow_bodies",
        20,
        "unkeyed bodies of a few KB, a byte a second",
    ),
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    for _, dest, default, text in ATTACKERS.values():
        p.add_argument("--" + dest.replace("_", "-"), type=int, default=default, help=f"{text} (0: off)")
    p.add_argument("--costly-chars", type=int, default=4096)
    p.add_argument("--flood-flushes", type=int, default=300)
    p.add_argument("--dot-job-chars", type=int, default=200_000, help="each dot job's text")
    p.add_argument("--unkeyed-body-bytes", type=int, default=4096, help="each unkeyed slow body's Content-Length")
    p.add_argument("--only", help="comma-separated attackers to run, the others off (" + ", ".join(ATTACKERS) + ")")


def apply_only(a: argparse.Namespace) -> None:
    """``--only``: every attacker not named sized 0."""
    if not a.only:
        return
    names = {x.strip() for x in a.only.split(",") if x.strip()}
    unknown = names - set(ATTACKERS)
    if unknown:
        raise SystemExit(f"--only: no attacker {sorted(unknown)}; there are {list(ATTACKERS)}")
    for name, (_, dest, _, _) in ATTACKERS.items():
        if name not in names:
            setattr(a, dest, 0)
