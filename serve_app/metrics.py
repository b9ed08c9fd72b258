"""Prometheus metrics of the app: their table, and recording them through a backend the Ray layer
installs (``deployments/backends.py``: ``ray.serve.metrics``, tagged with deployment and replica,
exported by every Ray node's metrics endpoint, each name prefixed with ``ray_``). Without one
(tests, tools) a metric records nothing.

Metrics are created lazily in the process that records them.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

LATENCY_BUCKETS = [0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0, 40.0, 80.0]
STAGE_BUCKETS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
ROW_BUCKETS = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
RTF_BUCKETS = [0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0]
# Ray's histograms take positive boundaries only: no stall and a slack run to zero fall in the first.
STALL_BUCKETS = [0.001, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0]
SLACK_BUCKETS = [0.001, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0]

log = logging.getLogger(__name__)

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
    "tts_realtime_capacity_streams": (
        "gauge",
        "Real-time streams a replica can keep at 1x (measured: the Acoustic's decode steps, the Vocoder's rate), "
        "with headroom.",
        ("stage",),
        None,
    ),
    "tts_realtime_demand_streams": ("gauge", "Real-time streams a replica carries or is starting.", ("stage",), None),
    "tts_realtime_waiting_streams": ("gauge", "Real-time streams waiting for room to start (no audio yet).", (), None),
    "tts_realtime_stalled_streams": ("gauge", "Real-time streams whose listener hears silence now.", (), None),
    "tts_capacity_refusals_total": (
        "counter",
        "New real-time streams refused (503 capacity_exhausted): no room within acoustic.capacity_wait_s.",
        ("stage",),
        None,
    ),
    "tts_stream_stall_seconds": (
        "histogram",
        "Per streamed answer: the silence a listener playing it at 1x after the prebuffer heard, as the server infers it.",
        ("door",),
        STALL_BUCKETS,
    ),
    "tts_stream_slack_seconds": (
        "histogram",
        "Per streamed answer: the least audio its listener had buffered ahead of the playhead (0: it ran dry).",
        ("door",),
        SLACK_BUCKETS,
    ),
}


class _Null:
    """What a metric is where no backend is installed (tests, tools): it records nothing."""

    def inc(self, *args: Any, **kwargs: Any) -> None:
        pass

    observe = set = inc


NULL = _Null()
# (kind, name, description, tag keys, buckets) -> a metric object; installed by the Ray layer
# (deployments/backends.py) in every process it runs in, so nothing here imports Ray.
_make: Optional[Callable[[str, str, str, tuple, Optional[list]], Any]] = None


def use(make: Callable[[str, str, str, tuple, Optional[list]], Any]) -> None:
    """Record metrics through ``make`` from now on."""
    global _make
    _make = make
    metric.cache_clear()


def custom(kind: str, name: str, description: str, tags: tuple = (), buckets: Optional[list] = None) -> Any:
    """A metric outside the table (a process's own, e.g. the loop watch's), or ``NULL``."""
    return NULL if _make is None else _make(kind, name, description, tags, buckets)


@functools.lru_cache(maxsize=None)
def metric(name: str) -> Any:
    """The process-wide metric object for ``name`` (created on first use). One that cannot be
    made records nothing (logged once): a metric never fails the request that records it."""
    kind, desc, tags, buckets = METRICS[name]
    try:
        return custom(kind, name, desc, tags, buckets)
    except Exception:  # noqa: BLE001 - e.g. a backend's check of the table's values
        log.exception("metric %s cannot be made; it records nothing", name)
        return NULL


def inc(name: str, value: float = 1.0, **tags: str) -> None:
    metric(name).inc(value, tags=tags or None)


def observe(name: str, value: float, **tags: str) -> None:
    metric(name).observe(value, tags=tags or None)


def set_gauge(name: str, value: float, **tags: str) -> None:
    metric(name).set(value, tags=tags or None)
