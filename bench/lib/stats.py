"""The statistics every report uses, each defined once. Two percentiles, each figure keeping the one
it was always measured with: ``percentiles`` (numpy's, linear between ranks: the load generator's
TTFB and latency) and ``nearest_rank`` (the sorted value at rank ``round(q * (n - 1))``: realtime's
p90s, the cache hit's p95)."""

from __future__ import annotations

import statistics
from typing import Iterable, Optional, Sequence


def percentiles(
    values: Sequence[float], qs: Sequence[int] = (50, 95, 99), digits: int = 4, extras: Sequence[str] = ("mean", "max")
) -> dict:
    """``{"p50": ..., "p95": ..., ["mean": ..., "max": ...,] "n": ...}`` (linear interpolation),
    rounded to ``digits``; every value None (and ``n`` 0) when there are no values."""
    if not values:
        return {f"p{q}": None for q in qs} | {k: None for k in extras} | {"n": 0}
    import numpy as np

    a = np.asarray(values, dtype=float)
    out = {f"p{q}": round(float(np.percentile(a, q)), digits) for q in qs}
    out.update({k: round(float(getattr(a, k)()), digits) for k in extras})
    out["n"] = len(values)
    return out


def nearest_rank(values: Iterable[float], q: float) -> Optional[float]:
    """The ``q`` quantile (0-1) as the sorted value at rank ``round(q * (n - 1))``; None if empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def median(values: Iterable[float]) -> Optional[float]:
    """The median (the mean of the two middle values for an even count); None if empty."""
    values = list(values)
    return statistics.median(values) if values else None


def mean(values: Iterable[float]) -> Optional[float]:
    values = list(values)
    return statistics.mean(values) if values else None


def ratio(a: Optional[float], b: Optional[float], digits: int = 4) -> Optional[float]:
    """``a / b`` rounded, or None when either is missing or ``b`` is 0."""
    if a is None or b is None or b == 0:
        return None
    return round(a / b, digits)
