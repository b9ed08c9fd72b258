"""The replica's real-time capacity, measured online from the decode loop's own steps.

A step's time grows with its rows on a CPU (every row adds its matmul rows and its attention) and
barely on a GPU, and it drifts as KV lengths grow and neighbours share the machine, so it is
measured, not configured: ``StepModel`` keeps, per batch size, an EWMA of the decode step's time,
and over all sizes a least-squares line ``a + b * rows`` whose weights decay with every step (the
recent steps count, the old ones fade). A size run recently enough times is read from its own
average; the others from the line once two sizes have been seen, before that from the one size
seen (an optimistic guess for more rows: the loop admits them, and so measures them).

From it: how many rows the replica can decode with each at least 1x real time (``rows_within``:
the largest n with ``step_s(n) <= budget``, every smaller size within it too), and the audio
seconds per second a batch of n rows makes (``audio_rate``). The decode loop uses the first for
its deadline rule (decode/deadline.py); ``AcousticEngine.realtime`` reports both.
"""

from __future__ import annotations

from typing import Optional

from ..pacing import TOKEN_SECONDS

EWMA_ALPHA = 0.05  # per-size average: about the last 20 steps of that size
LINE_DECAY = 0.998  # the line's weights: about the last 500 steps (a few seconds of decoding)
MIN_SAMPLES = 3  # steps of one size before its own average is trusted
STALE_STEPS = 2000  # a size not run for this many steps is read from the line again
OUTLIER = 3.0  # a step this many times its size's estimate counts as that (a GC pause, a preempted thread)


class StepModel:
    """Decode step time against rows in the batch, measured online. Decode thread writes, any
    thread reads (floats and small dicts: a reader may see a step's update half done, harmlessly)."""

    def __init__(self) -> None:
        self._avg: dict[int, float] = {}
        self._count: dict[int, int] = {}
        self._seen: dict[int, int] = {}  # size -> observation number it was last seen at
        self._n = 0  # observations so far
        # Decayed sums for the weighted least-squares line: weight, rows, rows^2, time, rows*time.
        self._w = self._x = self._xx = self._y = self._xy = 0.0

    def __bool__(self) -> bool:
        return self._n > 0

    def observe(self, rows: int, seconds: float) -> None:
        """One decode step of ``rows`` rows took ``seconds``."""
        if rows <= 0 or seconds <= 0:
            return
        prior = self.step_s(rows)
        if prior is not None:
            seconds = min(seconds, OUTLIER * prior)
        self._n += 1
        avg = self._avg.get(rows)
        self._avg[rows] = seconds if avg is None else avg + EWMA_ALPHA * (seconds - avg)
        self._count[rows] = self._count.get(rows, 0) + 1
        self._seen[rows] = self._n
        d = LINE_DECAY
        self._w = self._w * d + 1.0
        self._x = self._x * d + rows
        self._xx = self._xx * d + rows * rows
        self._y = self._y * d + seconds
        self._xy = self._xy * d + rows * seconds

    def line(self) -> Optional[tuple[float, float]]:
        """(a, b) of ``a + b * rows`` over the recent steps; None until two sizes have been seen."""
        w = self._w
        if w <= 0:
            return None
        mx, my = self._x / w, self._y / w
        var = self._xx / w - mx * mx
        if var < 1e-3:  # (nearly) one size only: no slope to be had
            return None
        b = max(0.0, (self._xy / w - mx * my) / var)
        return my - b * mx, b

    def step_s(self, rows: int) -> Optional[float]:
        """The expected time of a decode step of ``rows`` rows; None before any step."""
        if not self._n or rows <= 0:
            return None
        if self._count.get(rows, 0) >= MIN_SAMPLES and self._n - self._seen[rows] <= STALE_STEPS:
            return self._avg[rows]
        line = self.line()
        if line is not None:
            a, b = line
            return max(a + b * rows, 1e-6)
        # One size seen: its time (fewer rows are no faster; more, the loop tries and learns).
        return self._avg[min(self._avg, key=lambda m: (abs(m - rows), -m))]

    def rows_within(self, budget_s: float, limit: int) -> Optional[int]:
        """The most rows (up to ``limit``) whose steps, and every smaller batch's, take at most
        ``budget_s``; 0 when even one row's does not; None before any step."""
        if not self._n:
            return None
        n = 0
        for rows in range(1, limit + 1):
            est = self.step_s(rows)
            if est is None or est > budget_s:
                break
            n = rows
        return n

    def audio_rate(self, rows: int) -> Optional[float]:
        """Audio seconds per second a batch of ``rows`` rows makes (each step: one token per row)."""
        est = self.step_s(rows)
        return None if est is None else rows * TOKEN_SECONDS / est
