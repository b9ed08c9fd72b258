"""``python -m bench cache-hit --url URL``: the response cache's hit latency and throughput against a
running app (``run`` measures it at the end of its Serve phases: ``serve.cache_hit``).

One ~10 s wav is synthesised once (miss), then asked again and again: every answer must be ``X-Cache:
hit`` and byte-identical. p50 (median) and p95 (nearest rank) of sequential hits (after the first,
the edge cache in the proxy answers), the same from the Ingress (a new credential each time), and
the hit throughput at ``--concurrency``.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import httpx

from serve_app.engine.wav import with_true_length

from .lib.corpus import BYTES_PER_AUDIO_SECOND
from .lib.report import json_text
from .lib.stats import median, nearest_rank

# ~10 s of audio at the project's pacing (Chinese ~0.21 s per character + pauses).
TEN_SECOND_TEXT = "今天的天气非常好，阳光明媚，微风轻轻吹过，我们决定一起去公园散步，顺便看看湖边盛开的花。"


async def measure(url: str, n: int = 200, concurrency: int = 8, seed: int = 4242) -> dict:
    body = {"model": "chattts", "input": TEN_SECOND_TEXT, "voice": "alloy", "response_format": "wav", "seed": seed}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        t0 = time.perf_counter()
        first = await client.post("/v1/audio/speech", json=body)
        miss_s = time.perf_counter() - t0
        first.raise_for_status()
        audio_s = (len(first.content) - 44) / BYTES_PER_AUDIO_SECOND

        misses = 0

        edge_hits = 0

        async def hit(credential: str = "") -> float:
            nonlocal misses, edge_hits
            t = time.perf_counter()
            headers = {"Authorization": f"Bearer {credential}"} if credential else {}
            r = await client.post("/v1/audio/speech", json=body, headers=headers)
            dt = time.perf_counter() - t
            # A hit is the stored whole file: a WAV's header carries its true length, where the
            # streamed miss said "unknown" (0xFFFFFFFF); the audio is the same byte for byte.
            if r.status_code != 200 or r.content != with_true_length(first.content):
                raise AssertionError(f"bad answer to a repeated request: {r.status_code}")
            if r.headers.get("x-cache") != "hit":  # another Ingress replica (memory cache is per replica)
                misses += 1
                return float("nan")
            edge_hits += r.headers.get("x-edge-cache") == "hit"
            return dt

        # Prime: with several Ingress replicas each caches after its own first miss.
        for _ in range(10):
            if await hit() == await hit():  # two hits (nan never equals): every replica primed
                break
        misses = edge_hits = 0
        sequential = [dt for dt in [await hit() for _ in range(n)] if dt == dt]
        from_edge = edge_hits
        # The same hits from the Ingress: a new credential each time is a new request to the edge
        # cache in the proxy (it keys by Authorization), the same entry to the Ingress's cache
        # (a loopback config without keys ignores the header).
        ingress = [dt for dt in [await hit(f"bench-{i}") for i in range(min(n, 100))] if dt == dt]
        sem = asyncio.Semaphore(concurrency)

        async def bounded() -> float:
            async with sem:
                return await hit()

        t1 = time.perf_counter()
        await asyncio.gather(*[bounded() for _ in range(n)])
        wall = time.perf_counter() - t1
    return {
        "audio_seconds": round(audio_s, 3),
        "miss_latency_s": round(miss_s, 3),
        "hit_p50_ms": round(1000 * median(sequential), 2),
        "hit_p95_ms": round(1000 * nearest_rank(sequential, 0.95), 2),
        "hits": len(sequential),
        "edge_hits": from_edge,  # of the sequential ones, answered by the edge cache in the proxy
        "ingress_hit_p50_ms": round(1000 * median(ingress), 2) if ingress else None,
        "ingress_hit_p95_ms": round(1000 * nearest_rank(ingress, 0.95), 2) if ingress else None,
        "misses": misses,
        "concurrency": concurrency,
        "hit_req_per_s": round(n / wall, 1),
        "hit_audio_s_per_s": round(n * audio_s / wall, 1),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--n", type=int, default=200)
    p.add_argument("--concurrency", type=int, default=8)


def main(args: argparse.Namespace) -> int:
    print(json_text(asyncio.run(measure(args.url, args.n, args.concurrency)), indent=1))
    return 0
