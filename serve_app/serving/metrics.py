"""Prometheus metrics of the app, via ``ray.serve.metrics`` (tagged with deployment and replica,
exported by every Ray node's metrics endpoint; Ray prefixes each name with ``ray_``).

Metrics are created lazily in the replica that records them (they need a running Ray worker).
"""

from __future__ import annotations

import functools
from typing import Any

LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 80.0]
STAGE_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
ROW_BUCKETS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
RTF_BUCKETS = [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0]

# name -> (kind, description, tag keys, buckets)
METRICS: dict[str, tuple[str, str, tuple[str, ...], list | None]] = {
    "tts_requests_total": ("counter", "Speech requests by final status and format.", ("status", "format"), None),
    "tts_request_duration_seconds": (
        "histogram",
        "Request latency, first byte of the body to the last audio byte.",
        ("format",),
        LATENCY_BUCKETS,
    ),
    "tts_ttfb_seconds": ("histogram", "Time to the first audio byte.", ("format",), LATENCY_BUCKETS),
    "tts_stage_seconds": (
        "histogram",
        "Time spent per stage (normalise, queue, decode, vocode, encode).",
        ("stage",),
        STAGE_BUCKETS,
    ),
    "tts_batch_rows": ("histogram", "Rows in the running batch at each decode step.", (), ROW_BUCKETS),
    "tts_queue_rows": ("gauge", "Segment rows waiting for a decode slot.", (), None),
    "tts_running_rows": ("gauge", "Segment rows in the running decode batch.", (), None),
    "tts_audio_seconds_total": ("counter", "Seconds of audio produced.", (), None),
    "tts_rtf": ("histogram", "Real-time factor per request: processing seconds / audio seconds.", (), RTF_BUCKETS),
    "tts_cache_total": ("counter", "Cache lookups by result (hit, miss, bypass, error).", ("result",), None),
    "tts_stream_aborted_total": ("counter", "Streams that ended before their audio was complete.", ("reason",), None),
}


@functools.lru_cache(maxsize=None)
def metric(name: str) -> Any:
    """The process-wide metric object for ``name`` (created on first use)."""
    from ray.serve import metrics as m

    kind, desc, tags, buckets = METRICS[name]
    if kind == "counter":
        return m.Counter(name, description=desc, tag_keys=tags)
    if kind == "gauge":
        return m.Gauge(name, description=desc, tag_keys=tags)
    return m.Histogram(name, description=desc, boundaries=buckets, tag_keys=tags)


def inc(name: str, value: float = 1.0, **tags: str) -> None:
    metric(name).inc(value, tags=tags or None)


def observe(name: str, value: float, **tags: str) -> None:
    metric(name).observe(value, tags=tags or None)


def set_gauge(name: str, value: float, **tags: str) -> None:
    metric(name).set(value, tags=tags or None)
