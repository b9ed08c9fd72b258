"""Async httpx load generator: closed loop (N clients back to back) and open loop (Poisson), on
127.0.0.1 only. Every request records its send time, each piece of audio's arrival and size (the
WAV header skipped), its end, status and error; ``summarize`` gives a phase's throughput, TTFB,
latency, errors and cut requests as bench/README.md, "What each figure means", defines them.
"""

from __future__ import annotations

import asyncio
import math
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import httpx

from .corpus import BYTES_PER_AUDIO_SECOND
from .stats import percentiles

ERROR_BACKOFF_S = 0.5


def wav_header_len(buf: bytes) -> Optional[int]:
    """Offset of the first sample of a RIFF/WAVE stream, or None if more bytes are needed."""
    if len(buf) < 12:
        return None
    if buf[:4] != b"RIFF" or buf[8:12] != b"WAVE":
        raise ValueError("not a WAV stream")
    pos = 12
    while len(buf) >= pos + 8:
        cid = buf[pos : pos + 4]
        size = int.from_bytes(buf[pos + 4 : pos + 8], "little")
        if cid == b"data":
            return pos + 8
        pos += 8 + size + (size & 1)
    return None


@dataclass
class RequestRecord:
    idx: int
    text: str
    expected_audio_s: Optional[float] = None
    seed: Optional[int] = None  # distinct per request: no response cache can answer for the server
    cache: Optional[str] = None  # the server's X-Cache header, if any
    t_send: float = 0.0
    t_first: Optional[float] = None  # first audio byte
    t_end: Optional[float] = None
    status: Optional[int] = None
    audio_bytes: int = 0
    error: Optional[str] = None
    cut: bool = False
    chunks: list = field(default_factory=list)  # (t, audio bytes)
    # Sent as X-Request-Id (Serve keeps the caller's): joins the request with the server's log line.
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    server_timing: Optional[str] = None  # the answer's Server-Timing (the proxy's share)
    retry_after: Optional[str] = None  # an error answer's Retry-After: when the server asked to be asked again

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.t_end is not None and self.error is None and not self.cut

    @property
    def latency(self) -> Optional[float]:
        return self.t_end - self.t_send if self.ok else None

    @property
    def ttfb(self) -> Optional[float]:
        return self.t_first - self.t_send if self.ok and self.t_first is not None else None


class Target:
    """Where requests go and how their bodies look."""

    def __init__(
        self,
        base_url: str,
        name: str,
        streaming: bool,
        response_format: str = "wav",
        voice: str = "alloy",
        timeout_s: float = 300.0,
    ):
        assert base_url.startswith("http://127.0.0.1"), "benchmark traffic stays on loopback"
        self.base_url = base_url
        self.name = name
        self.streaming = streaming
        self.response_format = response_format
        self.voice = voice
        self.timeout_s = timeout_s

    def body(self, text: str, seed: Optional[int] = None) -> dict:
        b = {"model": "chattts", "input": text, "voice": self.voice, "response_format": self.response_format}
        if seed is not None:
            b["seed"] = seed
        return b

    def client(self, max_connections: int = 256) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(self.timeout_s, connect=15.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            trust_env=False,  # never a proxy
            # Measure synthesis, never the response cache (the project honours no-store).
            headers={"Cache-Control": "no-store"},
        )


async def _exchange(client: httpx.AsyncClient, target: Target, rec: RequestRecord, clock: Callable[[], float]) -> None:
    headers = {"X-Request-Id": rec.request_id}
    async with client.stream("POST", "/v1/audio/speech", json=target.body(rec.text, rec.seed), headers=headers) as r:
        rec.status = r.status_code
        rec.cache = r.headers.get("x-cache")
        rec.server_timing = r.headers.get("server-timing")
        if r.status_code != 200:
            await r.aread()
            rec.error = f"http_{r.status_code}"
            rec.retry_after = r.headers.get("retry-after")
            rec.t_end = clock()
            return
        header = b""
        header_len: Optional[int] = 0 if target.response_format == "pcm" else None
        async for data in r.aiter_raw():
            t = clock()
            if header_len is None:
                header += data
                header_len = wav_header_len(header)
                if header_len is None:
                    if len(header) > 4096:
                        raise ValueError("no WAV data chunk in the first 4 KiB")
                    continue
                n = len(header) - header_len
            else:
                n = len(data)
            if n > 0:
                if rec.t_first is None:
                    rec.t_first = t
                rec.chunks.append((t, n))
                rec.audio_bytes += n
        rec.t_end = clock()


async def one_request(
    client: httpx.AsyncClient, target: Target, rec: RequestRecord, clock: Callable[[], float]
) -> None:
    """One request, bounded by ``target.timeout_s``; never raises except when cancelled."""
    rec.t_send = clock()
    try:
        await asyncio.wait_for(_exchange(client, target, rec, clock), target.timeout_s)
    except asyncio.CancelledError:
        rec.cut = True
        rec.t_end = None
        raise
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec.error = "timeout"
        rec.t_end = None
    except (httpx.HTTPError, ValueError, OSError) as exc:
        rec.error = exc.__class__.__name__
        rec.t_end = None


@dataclass
class PhaseRun:
    kind: str  # "closed" | "open"
    target: str
    streaming: bool
    t0: float
    t_stop: float  # closed: when new requests stopped; open: when arrivals ended
    records: list
    params: dict


def request_seed(phase_seed: int, idx: int) -> int:
    return (phase_seed * 100003 + idx * 7919 + 17) % (2**31 - 1)


async def closed_loop(
    target: Target,
    concurrency: int,
    duration_s: float,
    texts: Iterator[str],
    expected: Optional[dict] = None,
    max_requests: int = 100000,
    seed: int = 0,
    on_done: Optional[Callable[[RequestRecord], None]] = None,
) -> PhaseRun:
    """``concurrency`` clients, each sending its next request as soon as the last one ends;
    at ``duration_s`` the phase stops and requests still running are cut."""
    clock = time.perf_counter
    records: list[RequestRecord] = []
    t0 = clock()
    stop_at = t0 + duration_s

    async def client_loop(client: httpx.AsyncClient) -> None:
        while clock() < stop_at and len(records) < max_requests:
            text = next(texts)
            rec = RequestRecord(len(records), text, (expected or {}).get(text), request_seed(seed, len(records)))
            records.append(rec)
            await one_request(client, target, rec, clock)
            if on_done:
                on_done(rec)
            if not rec.ok:
                await asyncio.sleep(ERROR_BACKOFF_S)  # a failing server is not hammered

    async with target.client(max(concurrency * 2, 16)) as client:
        tasks = [asyncio.create_task(client_loop(client)) for _ in range(concurrency)]
        done, pending = await asyncio.wait(tasks, timeout=max(0.0, stop_at - clock()))
        for t in pending:
            t.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for t in done:
            if t.exception() is not None:
                raise t.exception()
    params = {"concurrency": concurrency, "duration_s": duration_s}
    return PhaseRun("closed", target.name, target.streaming, t0, stop_at, records, params)


def poisson_schedule(rate_rps: float, duration_s: float, seed: int, max_requests: int = 100000) -> list[float]:
    rng = random.Random(seed)
    out: list[float] = []
    t = 0.0
    while len(out) < max_requests:
        t += rng.expovariate(rate_rps)
        if t > duration_s:
            break
        out.append(t)
    return out


async def open_loop(
    target: Target,
    rate_rps: float,
    duration_s: float,
    texts: Iterator[str],
    seed: int = 0,
    drain_s: float = 120.0,
    expected: Optional[dict] = None,
    max_requests: int = 10000,
    request_seed_base: Optional[int] = None,
    on_done: Optional[Callable[[RequestRecord], None]] = None,
) -> PhaseRun:
    """Poisson arrivals at ``rate_rps`` for ``duration_s`` (reproducible from ``seed``); then up to
    ``drain_s`` for the requests still running, which are cut after that."""
    clock = time.perf_counter
    schedule = poisson_schedule(rate_rps, duration_s, seed, max_requests)
    records: list[RequestRecord] = []
    tasks = []
    async with target.client(512) as client:

        async def fire(rec: RequestRecord) -> None:
            await one_request(client, target, rec, clock)
            if on_done:
                on_done(rec)

        t0 = clock()
        for at in schedule:
            delay = t0 + at - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            text = next(texts)
            base = seed if request_seed_base is None else request_seed_base
            rec = RequestRecord(len(records), text, (expected or {}).get(text), request_seed(base, len(records)))
            records.append(rec)
            tasks.append(asyncio.create_task(fire(rec)))
        t_stop = max(clock(), t0 + duration_s)
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=drain_s)
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
    params = {
        "rate_rps": rate_rps,
        "duration_s": duration_s,
        "arrivals": len(schedule),
        "seed": seed,
        "drain_s": drain_s,
    }
    return PhaseRun("open", target.name, target.streaming, t0, t_stop, records, params)


def summarize(run: PhaseRun) -> dict:
    recs = run.records
    ok = [r for r in recs if r.ok]
    errors = [r for r in recs if not r.ok and not r.cut]
    kinds: dict[str, int] = {}
    for r in errors:
        k = r.error or f"http_{r.status}"
        kinds[k] = kinds.get(k, 0) + 1
    stop = run.t_stop if run.kind == "closed" else math.inf
    chunks = [(t, n) for r in recs for (t, n) in r.chunks if t <= stop]
    if run.streaming:
        start = min((t for t, _ in chunks), default=run.t0)
        end = max((t for t, _ in chunks), default=start)
        audio_bytes = sum(n for t, n in chunks if start <= t <= end)
    else:
        ends = [r.t_end for r in ok if r.t_end <= stop]
        start, end = run.t0, max(ends, default=run.t0)
        audio_bytes = sum(r.audio_bytes for r in ok if r.t_end <= end)
    span = end - start
    completed_in_span = sum(1 for r in ok if start <= r.t_end <= end)
    if not run.streaming:
        completed_in_span = sum(1 for r in ok if r.t_end <= end)
    audio = [r.audio_bytes / BYTES_PER_AUDIO_SECOND for r in ok]
    expected = [r.expected_audio_s for r in ok if r.expected_audio_s is not None]
    return {
        "kind": run.kind,
        "target": run.target,
        **run.params,
        "sent": len(recs),
        "completed": len(ok),
        "errors": len(errors),
        "error_kinds": kinds,
        "cut": sum(1 for r in recs if r.cut),
        "cache_hits": sum(1 for r in recs if r.cache == "hit"),
        "span_s": round(span, 3),
        "audio_s_per_s": round(audio_bytes / BYTES_PER_AUDIO_SECOND / span, 4) if span > 0 else None,
        "requests_per_s": round(completed_in_span / span, 4) if span > 0 else None,
        "ttfb_s": percentiles([r.ttfb for r in ok if r.ttfb is not None]),
        "latency_s": percentiles([r.latency for r in ok]),
        "audio_s_total": round(sum(audio), 3),
        "audio_s_expected_total": round(sum(expected), 3) if len(expected) == len(ok) else None,
        "mean_audio_s_per_request": round(sum(audio) / len(audio), 3) if audio else None,
    }
