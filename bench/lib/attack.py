"""The abuse bench's shared pieces (``bench/abuse_attackers.py``, ``bench/abuse_surfaces.py``,
``bench/abuse_wyoming.py``): its two keys, the ``Tally`` each attacker counts its answers in, and
``crowd``, the loop every attacker's clients run."""

from __future__ import annotations

import asyncio
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
    """What one attacker got back: outcomes by name, counted, and each one's slowest answer;
    ``prepared``: what its set-up made (ids), kept across phases."""

    def __init__(self) -> None:
        self.outcomes: Counter = Counter()
        self.slowest_s: dict[str, float] = {}
        self.prepared: dict[str, Any] = {}

    def add(self, outcome: Any, seconds: Optional[float] = None) -> None:
        self.outcomes[str(outcome)] += 1
        if seconds is not None:
            self.slowest_s[str(outcome)] = round(max(seconds, self.slowest_s.get(str(outcome), 0.0)), 2)


def code_of(r: httpx.Response) -> str:
    """``status code`` of an answer (the error's code when it has one: the guard's 429 is
    ``too_many_refusals``, the service's are its own)."""
    try:
        err = r.json().get("error") if r.status_code >= 400 else None
    except ValueError:
        err = None
    return f"{r.status_code} {err.get('code')}" if isinstance(err, dict) and err.get("code") else str(r.status_code)


def closed_code(exc: Any) -> str:
    """A WebSocket's close, by the code the server sent."""
    return f"closed {exc.rcvd.code if exc.rcvd else 'no code'}"


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
