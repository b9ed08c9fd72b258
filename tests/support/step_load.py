"""A load whose number of clients changes while it runs (the cluster tests' autoscaling and failover
steps), on the bench's load generator (bench/lib/loadgen.py): one-row pcm streams of known length.

A client told 503 with a Retry-After (no room for another real-time stream, while the cluster
scales up) asks again after it, as the openai SDK's retries do; those answers are kept apart
(``refused``) from the requests' final outcomes (``records``)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterator, Optional

import httpx

from bench.lib.corpus import BYTES_PER_AUDIO_SECOND, ONE_ROW_TEXTS
from bench.lib.loadgen import RequestRecord, Target, one_request
from serve_app.engine.playback import PREBUFFER_S, PlaybackClock


def complete(rec: RequestRecord, expected: dict[str, int]) -> bool:
    """Answered 200 and every byte of the planned audio arrived (``expected``: text -> pcm bytes,
    ``corpus.expected_pcm_bytes``)."""
    return rec.ok and rec.audio_bytes == expected.get(rec.text, -1)


def stall_s(rec: RequestRecord, prebuffer_s: float = PREBUFFER_S) -> float:
    """The silence a listener playing the answer at 1x from ``prebuffer_s`` after its first bytes
    heard (its chunks as they arrived; they end with the stream, so no silence after the end)."""
    clock = PlaybackClock(prebuffer_s)
    for t, n in rec.chunks:
        clock.deliver(n / BYTES_PER_AUDIO_SECOND, t)
    return clock.stall_s


class StepLoad:
    """Closed-loop clients whose number can change while it runs (``set_clients``).

    Client ``i`` sends requests back to back while ``i < clients``; above the level it finishes
    the request it is in and waits, so stepping down never cuts a request.
    """

    def __init__(self, base_url: str, texts: tuple[str, ...] = ONE_ROW_TEXTS, timeout_s: float = 120.0):
        self.target = Target(base_url, "project", streaming=True, response_format="pcm", timeout_s=timeout_s)
        self.texts = texts
        self.clients = 0
        self.records: list[RequestRecord] = []
        self.error_bodies: list[tuple[int, bytes]] = []  # (status, body) of every error answer
        self.refused: list[RequestRecord] = []  # answers 503 with a Retry-After, each asked again
        self.t0 = time.perf_counter()
        self._tasks: list[asyncio.Task] = []
        self._changed: Optional[asyncio.Event] = None
        self._stopping = False
        self._client: Optional[httpx.AsyncClient] = None
        self.steps: list[tuple[float, int]] = []

    def clock(self) -> float:
        return time.perf_counter() - self.t0

    async def __aenter__(self) -> "StepLoad":
        self._client = self.target.client(256)
        self._client.event_hooks = {"response": [self._keep_error_body]}
        self._changed = asyncio.Event()
        return self

    async def _keep_error_body(self, response: httpx.Response) -> None:
        if response.status_code >= 400:
            self.error_bodies.append((response.status_code, (await response.aread())[:2000]))

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()
        await self._client.aclose()

    def set_clients(self, n: int) -> None:
        self.clients = n
        self.steps.append((self.clock(), n))
        while len(self._tasks) < n:
            self._tasks.append(asyncio.create_task(self._client_loop(len(self._tasks))))
        self._changed.set()
        self._changed = asyncio.Event()

    async def _client_loop(self, i: int) -> None:
        texts = self._texts(i)
        while not self._stopping:
            if i >= self.clients:
                await self._changed.wait()
                continue
            text = next(texts)
            while True:
                rec = RequestRecord(len(self.records), text, seed=len(self.records) + 1)
                self.records.append(rec)
                await one_request(self._client, self.target, rec, self.clock)
                if rec.status != 503 or rec.retry_after is None or self._stopping:
                    break
                self.records.remove(rec)
                self.refused.append(rec)
                await asyncio.sleep(float(rec.retry_after))

    def _texts(self, i: int) -> Iterator[str]:
        k = i
        while True:
            yield self.texts[k % len(self.texts)]
            k += 1

    async def stop(self) -> None:
        """Let every request in flight finish, then end the clients."""
        self._stopping = True
        self.set_clients(0)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def refusals(self) -> list[str]:
        """The error codes of the answers asked again (``capacity_exhausted`` is the only one meant)."""
        return [json.loads(body)["error"]["code"] for status, body in self.error_bodies if status == 503]

    def in_flight(self) -> int:
        return sum(1 for r in self.records if r.t_end is None and r.error is None and not r.cut)
