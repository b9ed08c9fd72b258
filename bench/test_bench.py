"""Unit tests of the benchmark's own arithmetic (no model, no Ray): ``pytest bench/test_bench.py``."""

from __future__ import annotations

import struct

import pytest

from bench import loadgen
from bench.baseline import wav_bytes
from bench.profile import summarize_raw
from bench.report import check_targets, compute_ratios, load_key, to_markdown
from bench.serve_runner import apply_overrides, get_path, set_path, set_replicas, set_threads


def test_wav_header_len_finds_data_after_other_chunks():
    import numpy as np

    wav = wav_bytes(np.zeros(100, np.float32))
    assert loadgen.wav_header_len(wav) == 44
    assert len(wav) - 44 == 200
    fmt = struct.pack("<HHIIHH", 1, 1, 24000, 48000, 2, 16)
    riff = b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE" + b"fmt " + struct.pack("<I", 16) + fmt
    extra = b"LIST" + struct.pack("<I", 3) + b"abc\x00"  # odd size: padded
    data = b"data" + struct.pack("<I", 0xFFFFFFFF)
    assert loadgen.wav_header_len(riff + extra + data) == len(riff + extra + data)
    assert loadgen.wav_header_len(riff) is None  # more bytes needed
    with pytest.raises(ValueError):
        loadgen.wav_header_len(b"ID3\x00" + b"\x00" * 20)


def _rec(i, t_send, chunks, t_end, status=200, cut=False):
    r = loadgen.RequestRecord(i, f"t{i}", expected_audio_s=sum(n for _, n in chunks) / 48000)
    r.t_send, r.status, r.chunks, r.cut = t_send, status, list(chunks), cut
    r.audio_bytes = sum(n for _, n in chunks)
    r.t_first = chunks[0][0] if chunks else None
    r.t_end = None if cut else t_end
    return r


def test_summarize_streaming_counts_bytes_between_first_byte_and_stop():
    recs = [
        _rec(0, 0.0, [(1.0, 48000), (2.0, 48000)], 2.0),
        _rec(1, 2.0, [(3.0, 48000), (11.0, 48000)], 11.0, cut=True),  # the byte after stop is not counted
    ]
    run = loadgen.PhaseRun("closed", "serve", True, 0.0, 10.0, recs, {"concurrency": 1})
    s = loadgen.summarize(run)
    assert s["span_s"] == 2.0  # first byte at 1.0, last byte before the stop at 3.0
    assert s["audio_s_per_s"] == pytest.approx(3 / 2.0)
    assert s["completed"] == 1 and s["cut"] == 1 and s["errors"] == 0
    assert s["ttfb_s"]["p50"] == 1.0 and s["latency_s"]["p50"] == 2.0


def test_summarize_non_streaming_uses_completions():
    recs = [
        _rec(0, 0.0, [(4.0, 96000)], 4.0),
        _rec(1, 0.0, [(8.0, 96000)], 8.0),
        _rec(2, 0.0, [], None, status=503),
    ]
    recs[2].error = "http_503"
    run = loadgen.PhaseRun("closed", "baseline", False, 0.0, 9.0, recs, {"concurrency": 2})
    s = loadgen.summarize(run)
    assert s["span_s"] == 8.0
    assert s["audio_s_per_s"] == pytest.approx(4 / 8.0)
    assert s["requests_per_s"] == pytest.approx(2 / 8.0)
    assert s["errors"] == 1 and s["error_kinds"] == {"http_503": 1}


def test_poisson_schedule_is_reproducible_and_bounded():
    a = loadgen.poisson_schedule(2.0, 100.0, seed=3)
    assert a == loadgen.poisson_schedule(2.0, 100.0, seed=3)
    assert 120 < len(a) < 280 and all(0 < x <= 100 for x in a)
    assert len(loadgen.poisson_schedule(1000.0, 100.0, seed=1, max_requests=50)) == 50


def test_config_paths_by_name():
    cfg = {"applications": [{"name": "chattts", "args": {}, "deployments": [{"name": "Acoustic", "autoscaling_config": {"min_replicas": 1}}]}],
           "http_options": {"port": 8000}}
    out = apply_overrides(cfg, weights="random", port=1234, overrides={"applications.chattts.deployments.Acoustic.user_config.max_batch_size": 4})
    assert out["http_options"] == {"port": 1234, "host": "127.0.0.1", "request_timeout_s": 600}
    assert get_path(out, "applications.chattts.args.model.weights.source") == "random"
    assert get_path(out, "applications.chattts.deployments.Acoustic.user_config.max_batch_size") == 4
    set_replicas(out, "Acoustic", 2)
    d = get_path(out, "applications.chattts.deployments.Acoustic")
    assert "num_replicas" not in d
    assert d["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 2, "initial_replicas": 2}
    set_threads(out, "Vocoder", 2)  # a deployment not in the file is added by name
    assert get_path(out, "applications.chattts.deployments.Vocoder.ray_actor_options.runtime_env.env_vars.OMP_NUM_THREADS") == "2"
    assert cfg["http_options"] == {"port": 8000}  # the input is not modified
    set_path(out, "applications.0.route_prefix", "/")
    assert out["applications"][0]["route_prefix"] == "/"


def test_ratios_and_targets():
    report = {
        "ceiling": {"ceiling": {"1": 0.5, "8": 1.4}, "first_chunk": {"raw_s": 0.5}},
        "baseline": {"closed": {"8": {"audio_s_per_s": 0.4, "latency_s": {"p99": 80.0}}}},
        "serve": {
            "closed": {"1": {"ttfb_s": {"p50": 0.6}}, "8": {"audio_s_per_s": 1.3, "latency_s": {"p99": 30.0}}},
            "open": {"continuous": {load_key(0.7): {"latency_s": {"mean": 10.0}}},
                     "window": {load_key(0.7): {"latency_s": {"mean": 20.0}}}},
        },
    }
    r = compute_ratios(report)
    assert r["serve_vs_baseline_c8"] == pytest.approx(3.25)
    assert r["serve_vs_ceiling_c8"] == pytest.approx(1.3 / 1.4, abs=1e-4)
    assert r["ttfb_vs_first_chunk"] == pytest.approx(1.2)
    assert r["p99_vs_baseline_c8"] == pytest.approx(0.375)
    assert r["continuous_vs_window_mean_latency_70"] == pytest.approx(2.0)
    t = check_targets(r)
    assert t["serve_vs_baseline_c8"]["met"] is False and t["p99_vs_baseline_c8"]["met"] is True
    report["ratios"], report["targets"] = r, t
    assert "serve_vs_ceiling_c8" in to_markdown(report)


def test_profile_summary():
    raw = ("run (t.py:1);_decode_step (a.py:2);forward (llama.py:3) 6\n"
           "run (t.py:1);_sample_and_advance (a.py:4);softmax (f.py:5) 3\n"
           "run (t.py:1);wait (q.py:9) 1\n")
    s = summarize_raw(raw)
    assert s["samples"] == 10
    assert s["stages_pct"]["GPT forward (decode)"] == 60.0
    assert s["stages_pct"]["sampling per row"] == 30.0
    assert s["top_self_pct"][0] == ["forward (llama.py:3)", 60.0]


def test_thread_sampling_splits_on_cpu_and_runqueue_time():
    import os

    from bench.procs import busy_threads, thread_cpu

    me = thread_cpu(os.getpid())
    assert me and all(run >= 0 and (wait is None or wait >= 0) for run, wait in me.values())
    before = {1: (10.0, 1.0), 2: (5.0, 0.5)}
    after = {1: (10.8, 1.1), 2: (5.1, 0.5), 3: (0.3, 0.2)}  # thread 3 started during the phase
    out = busy_threads(before, after, wall_s=1.0)
    assert out["top_thread_shares"] == [0.8, 0.3, 0.1]
    assert out["top_thread_runqueue"] == [0.1, 0.2, 0.0]
    assert out["threads_over_25pct"] == 2 and out["cpu_cores_used"] == 1.2
    # psutil fallback (no schedstat): the wait is unknown, not zero
    assert busy_threads({1: (1.0, None)}, {1: (1.5, None)}, 1.0)["top_thread_runqueue"] == [None]
