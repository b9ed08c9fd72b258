"""The replica's real-time capacity, measured online from the decode loop's own steps.

A step's time grows with its rows on a CPU (every row adds its matmul rows and its attention) and
barely on a GPU, and it drifts as KV lengths grow and neighbours share the machine, so it is
measured, not configured: ``StepModel`` keeps, per batch size, an EWMA of the decode step's time
(as its rows wait for it: admissions between two steps count, ``AcousticEngine.pace_s``), and
over all sizes a least-squares line ``a + b * rows`` whose weights decay with every step (the
recent steps count, the old ones fade). A size run lately is read from its own average; a size
between two of them, interpolated; past the smallest or the largest, that one's plus or minus the
line's slope per row (kept within [0, its time per row]: a noisy line over a narrow band of sizes
must promise, or forbid, no more than that). Before a second size is seen the slope is 0: more
rows are guessed no slower, but the rule grows the batch a row at a time (below), so a size is
measured before it is trusted; fewer rows, no faster, until the batch has varied.

From it: how many rows the replica can decode with each at least 1x real time (``rows_within``:
the largest n with ``step_s(n) <= budget``, every smaller size within it too), and the audio
seconds per second a batch of n rows makes (``audio_rate``). ``AcousticEngine.realtime`` reports
both; the deadline rule (decode/deadline.py) lets real-time work fill the first, but at most one
row past the largest batch measured lately (``largest_recent``): a burst of new streams grows the
batch a row a step, each size measured before the next is trusted, instead of filling every slot
on a guess.
"""

from __future__ import annotations

import bisect
from typing import Optional

from ..pacing import TOKEN_SECONDS

EWMA_ALPHA = 0.05  # per-size average: about the last 20 steps of that size
LINE_DECAY = 0.998  # the line's weights: about the last 500 steps (a few seconds of decoding)
STALE_STEPS = 2000  # a size not run for this many steps is read from the line again
OUTLIER = 3.0  # a step this many times its size's estimate counts as that (a GC pause, a preempted thread)


class StepModel:
    """Decode step time against rows in the batch, measured online. The decode thread writes, any
    thread reads: readers copy the dicts in one C-level call (no iteration the writer could
    invalidate) and may see a step's update half done, harmlessly."""

    def __init__(self) -> None:
        self._avg: dict[int, float] = {}
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
        avg, n = dict(self._avg), self._n
        sizes = sorted(m for m, seen in list(self._seen.items()) if n - seen <= STALE_STEPS) or sorted(avg)
        i = bisect.bisect_left(sizes, rows)
        if i < len(sizes) and sizes[i] == rows:
            return avg[rows]
        if i == 0:  # fewer rows than any measured: the smallest, less the line's slope per row
            lo = sizes[0]
            return avg[lo] - self.slope(lo, avg[lo]) * (lo - rows)
        lo = sizes[i - 1]
        if i == len(sizes):  # more rows than any measured: the largest, plus the line's slope per row
            return avg[lo] + self.slope(lo, avg[lo]) * (rows - lo)
        hi = sizes[i]
        return avg[lo] + (avg[hi] - avg[lo]) * (rows - lo) / (hi - lo)

    def slope(self, at: int, step_s: Optional[float] = None) -> float:
        """Seconds a row adds to a step around ``at`` rows: the line's, within [0, the time per row at
        ``at``] (a step's fixed part is never negative); 0 until two sizes have been seen."""
        line = self.line()
        return 0.0 if line is None else min(line[1], (self._avg[at] if step_s is None else step_s) / at)

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

    def largest_recent(self) -> Optional[int]:
        """The largest batch stepped within the last ``STALE_STEPS`` steps (None: none)."""
        n = self._n
        recent = [m for m, seen in list(self._seen.items()) if n - seen <= STALE_STEPS]
        return max(recent, default=None)

    def audio_rate(self, rows: int) -> Optional[float]:
        """Audio seconds per second a batch of ``rows`` rows makes (each step: one token per row)."""
        est = self.step_s(rows)
        return None if est is None else rows * TOKEN_SECONDS / est
