"""Metrics: the app's Prometheus metrics as Ray's node endpoint exports them, and the dashboard."""

from __future__ import annotations

import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from bench.lib.procs import REPO_ROOT as REPO
from serve_app.metrics import METRICS

DASHBOARD = REPO / "deploy" / "grafana" / "chattts-serve.json"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def _parse(text: str) -> dict[str, list[tuple[str, float]]]:
    out: dict[str, list[tuple[str, float]]] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out.setdefault(m.group(1), []).append((m.group(2) or "", float(m.group(3))))
    return out


def _scrape(url: str) -> dict[str, list[tuple[str, float]]]:
    return _parse(httpx.get(url, timeout=10).text)


# Absent here, allowed: rare counters until their event happens (aborted streams; capacity
# refusals, which the session app never makes: tests/serve/test_realtime_capacity.py checks those);
# the autoscaling policy's gauges exist only where Acoustic autoscales (tests/system/test_cluster.py).
ABSENT_HERE = ("ray_tts_stream_aborted", "ray_tts_capacity_refusals", "ray_tts_autoscale_")
# The stages each in a process of its own (TextNormalizer, Acoustic, Vocoder), exporting on its own timer.
STAGES = ("normalise", "queue", "decode", "vocode", "encode")


def _base_names(samples) -> set[str]:
    return {re.sub(r"_(bucket|sum|count)$", "", n) for n in samples}


def _defined_names() -> set[str]:
    """Every metric the app defines, as Ray exports it."""
    return {f"ray_{n}" for n in METRICS if not f"ray_{n}".startswith(ABSENT_HERE)}


def _dashboard_exprs() -> list[str]:
    return [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p["targets"]]


def _dashboard_names() -> set[str]:
    """Every metric the dashboard queries that this app exports."""
    return {m for e in _dashboard_exprs() for m in re.findall(r"\b(ray_[a-z_]+)", e) if not m.startswith(ABSENT_HERE)}


def _total(samples, name: str, **labels: str) -> float:
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(v for lbl, v in samples.get(name, []) if all(w in lbl for w in want))


@pytest.fixture(scope="module")
def scraped(app_url, ray_session):
    """Metrics after a miss, a hit, an error and a concurrent burst (the session's replicas export
    every second: ``support.app.ray_session``)."""
    text = f"指标测试{uuid.uuid4().hex[:6]}。"
    body = {"input": text, "response_format": "wav", "seed": 7}
    with httpx.Client(base_url=app_url, timeout=120) as c:
        assert c.post("/v1/audio/speech", json=body).headers["x-cache"] == "miss"
        assert c.post("/v1/audio/speech", json=body).headers["x-cache"] == "hit"
        assert c.post("/v1/audio/speech", json={"input": "hi", "voice": "nope"}).status_code == 400
        # At once: a request that finds the engine idle skips @serve.batch's window (admit_idle_at_once),
        # and Serve's batch-size metric counts only batches that went through it.
        with ThreadPoolExecutor(3) as pool:
            codes = pool.map(
                lambda i: c.post("/v1/audio/speech", json={"input": f"第{i}句。{text}", "response_format": "mp3"}),
                range(3),
            )
            assert [r.status_code for r in codes] == [200] * 3
    deadline = time.monotonic() + 60
    samples: dict = {}
    needed = [
        "ray_tts_requests_total",
        "ray_tts_cache_total",
        "ray_tts_batch_rows_bucket",
        "ray_tts_rtf_bucket",
        "ray_tts_stage_seconds_bucket",
        "ray_tts_queue_rows",
        "ray_tts_audio_seconds_total",
    ]
    while time.monotonic() < deadline:
        samples = _scrape(ray_session["metrics_url"])
        # Each replica exports on its own timer, and Serve's replica gauges come with its first
        # health checks: wait for every sample the tests below count on.
        if (
            all(n in samples for n in needed)
            and _defined_names() <= _base_names(samples)
            and _dashboard_names() <= set(samples)
            and _total(samples, "ray_tts_cache_total", result="hit") >= 1
            and _total(samples, "ray_tts_requests_total", status="400") >= 1
            and _total(samples, "ray_tts_requests_total", status="200", format="mp3") >= 3
            and _total(samples, "ray_tts_ttfb_seconds_count") >= 2
            and _total(samples, "ray_tts_rtf_count") >= 1
            and all(_total(samples, "ray_tts_stage_seconds_count", stage=st) >= 1 for st in STAGES)
        ):
            break
        time.sleep(0.5)
    return samples


def test_app_metrics_are_exported_with_sensible_values(scraped):
    s = scraped
    assert _total(s, "ray_tts_requests_total", status="200", format="wav") >= 2
    assert _total(s, "ray_tts_requests_total", status="400") >= 1
    assert _total(s, "ray_tts_cache_total", result="hit") >= 1
    assert _total(s, "ray_tts_cache_total", result="miss") >= 1
    assert _total(s, "ray_tts_audio_seconds_total") > 1.0
    # Histograms: counts and sums where they belong.
    assert _total(s, "ray_tts_ttfb_seconds_count") >= 2
    assert 0 < _total(s, "ray_tts_request_duration_seconds_sum") < 600
    # (Ray's exported histogram _sum is approximate: check counts and buckets, not the sum.)
    assert _total(s, "ray_tts_batch_rows_count") > 0 and _total(s, "ray_tts_batch_rows_sum") > 0
    assert max(v for _, v in s["ray_tts_batch_rows_bucket"]) > 0
    for stage in STAGES:
        assert _total(s, "ray_tts_stage_seconds_count", stage=stage) >= 1, stage
    assert _total(s, "ray_tts_rtf_count") >= 1
    # Ray tags every sample with the deployment that recorded it.
    assert any('deployment="Acoustic"' in lbl for lbl, _ in s["ray_tts_batch_rows_bucket"])
    assert "ray_tts_queue_rows" in s and "ray_tts_running_rows" in s


def test_every_defined_metric_is_exported(scraped):
    missing = _defined_names() - _base_names(scraped)
    assert not missing, missing


def test_dashboard_queries_name_exported_metrics(scraped):
    assert len(_dashboard_exprs()) >= 10
    # The app's own metrics and Serve's must all be real names (but those ABSENT_HERE).
    unknown = _dashboard_names() - set(scraped)
    assert not unknown, unknown
    dash = json.loads(DASHBOARD.read_text())
    panels = {p["title"] for p in dash["panels"]}
    for words in ("Request rate", "Latency", "first audio", "batch rows", "queue", "Replicas", "Real-time factor"):
        assert any(words.lower() in t.lower() for t in panels), words
