"""The first-audio breakdown: a request's hops from its client TTFB and the Ingress's log line."""

import json
from types import SimpleNamespace

from bench.lib import first_audio

LINE = {
    "event": "speech",
    "request_id": "r1",
    "ttfb_s": 0.5,
    "first_audio": {
        "ingress_checks": 4.0,
        "plan_call": 7.0,
        "normalizer": 1.0,
        "vocoder_call": 480.0,
        "ingress_opened": 492.0,
        "vocoder_total": 470.0,
        "acoustic_call": 440.0,
        "acoustic_total": 425.0,
        "admit_window": 0.5,
        "queue_prefill": 100.0,
        "first_chunk": 320.0,
        "acoustic_handover": 0.4,
        "vocoder_feed": 28.0,
        "ingress_http": 3.0,
    },
}


def test_hops_add_up_to_the_client_ttfb_and_split_the_proxy():
    h = first_audio.hops_of(0.52, LINE, proxy=510.0)
    assert h["proxy"] == 20.0 and h["client_http"] == 10.0 and h["proxy_ingress"] == 7.0 and h["ingress_http"] == 3.0
    assert h["plan_handle"] == 6.0 and h["vocoder_handle"] == 10.0 and h["acoustic_handle"] == 15.0
    assert h["model"] == 448.0 and round(h["service"], 6) == 72.0
    parts = [n for n, _ in first_audio.HOPS if n not in ("client_http", "proxy_ingress", "ingress_http")] + [
        "ingress_other"
    ]
    assert abs(sum(h[n] for n in parts) - h["ttfb"]) < 1e-6


def test_a_line_without_the_stages_part_is_left_out(tmp_path):
    logs = tmp_path / "logs" / "serve"
    logs.mkdir(parents=True)
    hit = {**LINE, "request_id": "r2", "first_audio": {"ingress_checks": 1.0}}
    text = "".join(f"INFO x chattts_Ingress abc -- {json.dumps(x)}\n" for x in (LINE, hit)) + "INFO not json\n"
    (logs / "replica_chattts_Ingress_abc.log").write_text(text)
    lines = first_audio.read_ingress_log(str(tmp_path))
    assert set(lines) == {"r1", "r2"}
    recs = [
        SimpleNamespace(request_id="r1", ttfb=0.52, server_timing="proxy;dur=510.0"),
        SimpleNamespace(request_id="r2", ttfb=0.1, server_timing=None),
        SimpleNamespace(request_id="r3", ttfb=0.1, server_timing=None),
    ]
    b = first_audio.breakdown(recs, lines)
    assert b["joined"] == 1 and b["hops_ms"]["service"]["p50"] == 72.0
    assert first_audio.proxy_ms("cache;dur=1, proxy;dur=2.5") == 2.5 and first_audio.proxy_ms(None) is None
    report = {"serve": {"closed": {"1": {"first_audio": b}}}}
    assert any(line.startswith("| service | 72.0 |") for line in first_audio.markdown(report))
