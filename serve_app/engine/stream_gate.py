"""Real-time streams a stage takes at once, by its measured rate: the Vocoder's admission.

A stage that serves many streams on one resource (the Vocoder's torch thread: every stream's
windows, one at a time) keeps a stream at 1x only while it makes at least a second of audio per
second for each. Its rate is measured, not configured: the audio it made over the time its
resource spent making it (``measure``, fed every second with the running totals; wall time, so a
machine shared with other processes shows as a slower rate), over the last ``WINDOW_S`` of busy
time. ``capacity_streams`` is that rate less ``headroom``: the streams it keeps at 1x. A new
real-time stream enters while fewer are in, else waits (first come, first in) up to ``wait_s`` for
one to leave, else is refused (``CapacityExhausted``: 503 capacity_exhausted). A stream that
continues one already in (a WebSocket session's next segment) always enters. Until the rate is
measured (the first streams' audio), every stream enters.

Plain Python on the stage's event loop (no locking: one loop calls it).
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from typing import Callable, Optional

from .errors import CapacityExhausted

WINDOW_S = 5.0  # busy seconds the rate is measured over (a few seconds of work)
MIN_BUSY_S = 0.5  # busy time needed before a rate is trusted


class StreamGate:
    def __init__(self, headroom: float, wait_s: Optional[float], clock: Callable[[], float] = time.monotonic):
        self.headroom = headroom
        self.wait_s = wait_s
        self.clock = clock
        self.inside = 0
        self.refused = 0
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._samples: collections.deque[tuple[float, float]] = collections.deque()  # (busy_s, audio_s) totals
        self.rate: Optional[float] = None  # audio seconds per busy second, measured

    # ------------------------------------------------------------------ capacity

    def measure(self, busy_s: float, audio_s: float) -> None:
        """The stage's running totals: seconds its resource was busy, audio seconds it made."""
        samples = self._samples
        if samples and busy_s <= samples[-1][0]:
            return
        samples.append((busy_s, audio_s))
        while len(samples) > 2 and busy_s - samples[1][0] >= WINDOW_S:
            samples.popleft()
        busy = busy_s - samples[0][0]
        if busy >= MIN_BUSY_S:
            self.rate = (audio_s - samples[0][1]) / busy
            self._admit_waiters()

    @property
    def capacity_streams(self) -> Optional[int]:
        """Streams kept at 1x with ``headroom`` to spare (at least one); None until measured."""
        if self.rate is None:
            return None
        return max(1, math.floor(self.rate * (1.0 - self.headroom)))

    def _room(self) -> bool:
        cap = self.capacity_streams
        return cap is None or self.inside < cap

    # ------------------------------------------------------------------ streams

    async def enter(self, continuing: bool = False) -> None:
        """Take a place (``continuing``: a stream already in goes on, whatever the count)."""
        if continuing or (not self._waiters and self._room()):
            self.inside += 1
            return
        if self.wait_s is not None and self.wait_s <= 0:
            self._refuse()
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.wait_s)
        except asyncio.TimeoutError:
            pass
        finally:
            if not waiter.done():
                waiter.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)
        if waiter.cancelled() or not waiter.done():
            self._refuse()
        # The place was taken for this waiter (inside counted) when it was woken.

    def leave(self) -> None:
        self.inside = max(0, self.inside - 1)
        self._admit_waiters()

    def _admit_waiters(self) -> None:
        while self._waiters and self._room():
            waiter = self._waiters.popleft()
            if not waiter.done():
                self.inside += 1
                waiter.set_result(None)

    def _refuse(self) -> None:
        self.refused += 1
        raise CapacityExhausted(
            f"every real-time stream this replica's vocoder keeps at 1x is taken ({self.capacity_streams}); none "
            f"ended within {self.wait_s:g} s (acoustic.capacity_wait_s): retry shortly"
        )
