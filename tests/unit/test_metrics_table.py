"""The metrics table holds what Ray's metrics accept, and a metric that cannot be made never
fails the request that records it."""

from __future__ import annotations

import pytest

from serve_app import metrics


@pytest.mark.parametrize("name", sorted(n for n, m in metrics.METRICS.items() if m[0] == "histogram"))
def test_histogram_boundaries_are_positive_and_rising(name):
    buckets = metrics.METRICS[name][3]
    assert buckets and all(b > 0 for b in buckets), name  # Ray refuses 0 and negative boundaries
    assert buckets == sorted(set(buckets)), name


def test_a_metric_that_cannot_be_made_records_nothing(monkeypatch):
    def refuse(*args):
        raise ValueError("Invalid `boundaries` argument")

    monkeypatch.setattr(metrics, "_make", refuse)
    metrics.metric.cache_clear()
    try:
        metrics.observe("tts_stream_stall_seconds", 1.0, door="http")  # no exception
        assert metrics.metric("tts_stream_stall_seconds") is metrics.NULL
    finally:
        metrics.metric.cache_clear()
