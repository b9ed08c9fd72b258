"""Unit tests of the autoscale benchmark's bookkeeping (no cluster): events from samples, request
completeness, the metrics parser, the step syntax."""

from __future__ import annotations

from bench.lib.corpus import expected_pcm_bytes
from bench.lib.loadgen import RequestRecord, complete
from bench.studies.autoscale import failures, parse_metrics, parse_steps, per_second, scale_events


def _sample(t, acoustic, rows=None):
    reps = {f"r{i}": {"state": "RUNNING", "running": (rows or {}).get(f"r{i}", 0)} for i in range(acoustic)}
    return {
        "t": t,
        "replicas": {"Ingress": 1, "TextNormalizer": 1, "Acoustic": acoustic, "Vocoder": 1},
        "acoustic": reps,
        "desired": None,
    }


def test_steps_syntax():
    assert parse_steps("0:1,25:6,100:1,150:0") == [(0.0, 1), (25.0, 6), (100.0, 1), (150.0, 0)]


def test_scale_events_time_the_new_replica_from_the_step():
    steps = [(0.0, 1), (10.0, 6), (40.0, 1)]
    samples = [_sample(t, 1, {"r0": 1}) for t in range(0, 11)]
    samples += [_sample(t, 1, {"r0": 4}) for t in range(11, 20)]
    samples += [_sample(20, 2), _sample(21, 2, {"r1": 2}), _sample(30, 3, {"r1": 2})]
    samples += [_sample(45, 3), _sample(48, 1)]
    ev = scale_events(samples, steps)
    assert ev["acoustic_before"] == 1 and ev["acoustic_peak"] == 3
    assert ev["new_replica_running_after_s"] == 10.0  # running at 20, step at 10
    assert ev["new_replica_serving_after_s"] == 11.0  # rows on r1 at 21
    assert ev["first_removal_after_s"] == 8.0 and ev["back_to_floor_after_s"] == 8.0


def test_a_request_is_complete_only_with_all_its_audio():
    text = "今天天气很好。"
    expected = expected_pcm_bytes((text,))
    ok = RequestRecord(0, text, t_send=0.0, t_first=0.1, t_end=1.0, status=200, audio_bytes=expected[text])
    short = RequestRecord(1, text, t_send=0.0, t_first=0.1, t_end=1.0, status=200, audio_bytes=expected[text] - 2)
    cut = RequestRecord(2, text, t_send=0.0, t_first=0.1, status=200, audio_bytes=100, error="RemoteProtocolError")
    assert expected[text] > 0 and expected[text] % 2 == 0
    assert complete(ok, expected) and not complete(short, expected) and not complete(cut, expected)
    f = failures([ok, short, cut], expected)
    assert f["failed"] == 2 and f["kinds"] == ["RemoteProtocolError", "incomplete"]
    rows = per_second([ok, short, cut], [_sample(1.0, 1)], [(0.0, 3)], expected)
    assert rows[0]["clients"] == 3 and rows[0]["failed_so_far"] == 2 and rows[0]["latency_s"]["n"] == 1


def test_parse_metrics_reads_labels():
    text = (
        "# HELP ray_tts_queue_rows x\n# TYPE ray_tts_queue_rows gauge\n"
        'ray_tts_queue_rows{deployment="Acoustic",replica="abc"} 3.0\n'
        'ray_other{a="b"} 1.0\n'
    )
    assert parse_metrics(text, ("ray_tts_queue_rows",)) == [
        ("ray_tts_queue_rows", {"deployment": "Acoustic", "replica": "abc"}, 3.0)
    ]
