"""The bench's shared library, bench/lib/ (no model, no Ray): load generation and its summary,
config editing, processes, waits, the harness's partial reports and paths, pinning, statistics."""

from __future__ import annotations

import os
import struct
import sys
import time

import psutil
import pytest

from bench.baseline import wav_bytes
from bench.lib import loadgen
from bench.lib.config import apply_overrides, get_path, set_path, set_replicas, set_threads
from bench.lib.corpus import expected_audio_s, planned_samples
from bench.lib.harness import Harness, command_line, relative_path
from bench.lib.machine import busy_threads, machine_cores, machine_cpu, thread_cpu
from bench.lib.procs import REPO_ROOT, ManagedProcess, child_env, free_port
from bench.lib.pyspy import summarize_raw
from bench.lib.sampler import Periodic
from bench.lib.stats import median, nearest_rank, percentiles, ratio
from bench.lib.waiting import NotMet, holds_within, wait_until


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
    cfg = {
        "applications": [
            {
                "name": "chattts",
                "args": {},
                "deployments": [{"name": "Acoustic", "autoscaling_config": {"min_replicas": 1}}],
            }
        ],
        "http_options": {"port": 8000},
    }
    out = apply_overrides(
        cfg,
        weights="random",
        port=1234,
        overrides={"applications.chattts.deployments.Acoustic.user_config.max_batch_size": 4},
    )
    assert out["http_options"] == {"port": 1234, "host": "127.0.0.1", "request_timeout_s": 600}
    assert get_path(out, "applications.chattts.args.model.weights.source") == "random"
    assert get_path(out, "applications.chattts.deployments.Acoustic.user_config.max_batch_size") == 4
    set_replicas(out, "Acoustic", 2)
    d = get_path(out, "applications.chattts.deployments.Acoustic")
    assert "num_replicas" not in d
    assert d["autoscaling_config"] == {"min_replicas": 2, "max_replicas": 2, "initial_replicas": 2}
    set_threads(out, "Vocoder", 2)  # a deployment not in the file is added by name
    assert (
        get_path(out, "applications.chattts.deployments.Vocoder.ray_actor_options.runtime_env.env_vars.OMP_NUM_THREADS")
        == "2"
    )
    assert cfg["http_options"] == {"port": 8000}  # the input is not modified
    set_path(out, "applications.0.route_prefix", "/")
    assert out["applications"][0]["route_prefix"] == "/"


def test_profile_summary():
    raw = (
        "run (t.py:1);_decode_step (a.py:2);forward (llama.py:3) 6\n"
        "run (t.py:1);_sample_and_advance (a.py:4);softmax (f.py:5) 3\n"
        "run (t.py:1);wait (q.py:9) 1\n"
    )
    s = summarize_raw(raw)
    assert s["samples"] == 10
    assert s["stages_pct"]["GPT forward (decode)"] == 60.0
    assert s["stages_pct"]["sampling per row"] == 30.0
    assert s["top_self_pct"][0] == ["forward (llama.py:3)", 60.0]


def test_thread_sampling_splits_on_cpu_and_runqueue_time():
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


def test_machine_cores_split_every_process_by_part():
    """The load generator is this process; a process that started during the phase counts whole,
    one whose pid was another part's before counts from zero; what is left of the CPUs is idle."""
    now = machine_cpu()
    assert now[os.getpid()][0] == "load generator"
    before = {1: ("Acoustic", 10.0), 2: ("proxy", 1.0), 3: ("other", 5.0)}
    after = {1: ("Acoustic", 11.5), 2: ("proxy", 1.1), 3: ("Vocoder", 0.2), 4: ("Serve controller", 0.05)}
    out = machine_cores(before, after, wall_s=1.0)
    assert out["cores"] == {"Acoustic": 1.5, "Vocoder": 0.2, "proxy": 0.1, "Serve controller": 0.05}
    assert out["idle"] == pytest.approx(max(0.0, psutil.cpu_count() - 1.85), abs=1e-6)


# ------------------------------------------------------------------ stats


def test_percentiles_interpolate_and_nearest_rank_does_not():
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentiles(values) == {"p50": 2.5, "p95": 3.85, "p99": 3.97, "mean": 2.5, "max": 4.0, "n": 4}
    assert percentiles(values, (50, 95), 3, ()) == {"p50": 2.5, "p95": 3.85, "n": 4}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None, "mean": None, "max": None, "n": 0}
    # rank round(q * (n - 1)) of the sorted values: 0.9 * 3 = 2.7 -> rank 3; 0.5 * 3 = 1.5 -> 2 (half to even)
    assert nearest_rank(values, 0.9) == 4.0 and nearest_rank(values, 0.5) == 3.0 and nearest_rank([], 0.5) is None
    assert median(values) == 2.5 and median([]) is None
    assert ratio(1.0, 3.0) == 0.3333 and ratio(1.0, 0) is None and ratio(None, 1.0) is None


def test_planned_audio_is_half_a_token_short_per_segment():
    assert planned_samples([10, 2]) == 512 * 12 - 2 * 256
    assert expected_audio_s([("a", [10], ["a"])]) == {"a": (512 * 10 - 256) / 24000}


# ------------------------------------------------------------------ processes, waits, sampler


def test_free_port_draws_below_the_ephemeral_range():
    ports = {free_port() for _ in range(20)}
    assert len(ports) == 20 and all(20000 <= p <= 32767 for p in ports)


def test_managed_process_stops_its_group_and_keeps_its_log(tmp_path):
    log = tmp_path / "p.log"
    code = (
        "import subprocess, sys, time; print('up', flush=True); "
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"
    )
    p = ManagedProcess("sleeper", [sys.executable, "-c", code], log)
    wait_until(lambda: "up" in log.read_text(), 20, 0.05)
    children = psutil.Process(p.pid).children()
    rc, tail = p.finish(timeout_s=0.1)  # still running: stopped
    assert rc is None and not p.alive() and "up" in tail
    _, alive = psutil.wait_procs(children, timeout=5)  # the group went too
    assert len(children) == 1 and not alive


def test_a_process_that_ends_gives_its_status_and_log(tmp_path):
    p = ManagedProcess("quick", [sys.executable, "-c", "print('done'); raise SystemExit(3)"], tmp_path / "q.log")
    assert p.finish(timeout_s=60) == (3, "done")


def test_children_never_inherit_weights_overrides_nor_another_ray(monkeypatch):
    monkeypatch.setenv("CHATTTS_WEIGHTS", "random")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    monkeypatch.setenv("RAY_TMPDIR", "/tmp/r")
    env = child_env(CHATTTS_SERVE_CACHE="/c")
    assert "CHATTTS_WEIGHTS" not in env and "RAY_ADDRESS" not in env and env["RAY_TMPDIR"] == "/tmp/r"
    assert env["RAY_AUTH_MODE"] == "disabled" and env["CHATTTS_SERVE_CACHE"] == "/c"
    own = child_env(own_ray=True, RAY_TMPDIR="/tmp/mine")
    assert (
        not {k for k in own if k.startswith("RAY_")} - {"RAY_AUTH_MODE", "RAY_TMPDIR"}
        and own["RAY_TMPDIR"] == "/tmp/mine"
    )


def test_wait_until_returns_the_value_or_fails_as_an_assertion_and_a_timeout():
    calls = []
    assert wait_until(lambda: calls.append(1) or (len(calls) >= 3 and "ok"), 5, 0.01) == "ok"
    for kind in (AssertionError, TimeoutError):  # a test's failure, the bench's timeout
        with pytest.raises(kind, match="never: not met within"):
            wait_until(lambda: False, 0.05, 0.01, what="never")
    assert holds_within(lambda: False, 0.05, 0.01) is False
    errors = iter([ValueError("starting"), ValueError("starting"), 7])

    def probe():
        x = next(errors)
        if isinstance(x, Exception):
            raise x
        return x

    assert wait_until(probe, 5, 0.01, retry_on=(ValueError,)) == 7
    with pytest.raises(KeyError):  # not retried
        wait_until(lambda: {}["x"], 1, 0.01, retry_on=(ValueError,))
    assert issubclass(NotMet, AssertionError) and issubclass(NotMet, TimeoutError)


def test_periodic_ticks_until_stopped_and_counts_failures():
    class Ticker(Periodic):
        n = 0

        def tick(self):
            self.n += 1
            if self.n == 2:
                raise RuntimeError("one bad sample")

    t = Ticker(0.01, "ticker").start()
    wait_until(lambda: t.n >= 5, 10, 0.01)
    t.stop()
    n = t.n
    time.sleep(0.05)  # no tick after stop: an absence, so a fixed look
    assert n >= 5 and t.n == n and t.missed == 1


# ------------------------------------------------------------------ harness: paths and partial reports


def test_paths_are_recorded_relative_to_the_output(tmp_path):
    out = tmp_path / "run1"
    assert relative_path(out, out) == "."
    assert relative_path(out / "profile" / "a.txt", out) == "profile/a.txt"
    assert relative_path(REPO_ROOT / "config" / "serve.yaml", out) == "config/serve.yaml"
    ray_session = os.path.join(os.sep, "tmp", "ray", "session_2026-12-01_01-58-40_1")  # outside the output
    assert relative_path(ray_session, out) == "session_2026-12-01_01-58-40_1"
    assert relative_path("config/x.yaml", None) == "config/x.yaml"
    argv = [
        "run",
        "--quick",
        "--out",
        str(out),
        "--config",
        "/etc/x/serve.yaml",
        "--junitxml=" + str(out / "p.xml"),
        "--loads",
        "0.5,0.7",
        "--set",
        "a.b=1",
    ]
    cmd = command_line(argv, out)
    assert cmd == "python -m bench run --quick --out . --config serve.yaml --junitxml=p.xml --loads 0.5,0.7 --set a.b=1"
    assert str(tmp_path) not in cmd


def test_harness_writes_a_partial_report_with_the_error(tmp_path):
    written = []

    def render(report, out):
        written.append((dict(report), out))

    h = Harness(tmp_path / "o", render, ["run", "--out", str(tmp_path / "o")], quick=True)
    meta = h.meta  # held before the run starts: still the report's
    with pytest.raises(RuntimeError):
        with h:
            h.report["phase"] = 1
            raise RuntimeError("phase 2 failed")
    report, out = written[-1]
    assert out == tmp_path / "o" and out.is_dir() and report["meta"] is meta
    assert report["error"] == "RuntimeError: phase 2 failed" and report["phase"] == 1
    meta = report["meta"]
    assert meta["command"] == "python -m bench run --out ." and meta["quick"] is True
    assert {"started", "finished", "wall_s", "git", "cpus", "loadavg_start", "loadavg_end"} <= set(meta)


def test_pinning_moves_every_thread_and_the_threads_started_after():
    from bench.lib.pinning import cpu_set, pin_threads

    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("pinning needs two CPUs")
    first = min(allowed)
    assert cpu_set(f"{first}") == {first}
    with pytest.raises(ValueError):
        cpu_set(",".join(map(str, sorted(allowed))))  # nothing left for the rest of the graph
    assert cpu_set(",".join(map(str, sorted(allowed))), leave_rest=False) == allowed  # the ceiling alone
    with pytest.raises(ValueError):
        cpu_set("4096")
    code = (
        "import sys, threading, time\n"
        "go = lambda: time.sleep(30)\n"
        "for _ in range(2): threading.Thread(target=go, daemon=True).start()\n"
        "print('up', flush=True); sys.stdin.readline()\n"
        "threading.Thread(target=go, daemon=True).start()\n"
        "print('more', flush=True); time.sleep(30)\n"
    )
    import subprocess

    child = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert pin_threads(child.pid, {first}) == 3
        child.stdin.write("\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "more"
        tasks = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        assert len(tasks) == 4 and all(os.sched_getaffinity(t) == {first} for t in tasks)
    finally:
        child.kill()
        child.wait()


def test_pinning_a_run_touches_its_own_processes_only_and_gives_the_cpus_back():
    import subprocess

    from bench.lib.pinning import pin_acoustic, pin_threads

    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("pinning needs two CPUs")
    first = min(allowed)
    # A run's root with one child (its "Acoustic replica"); this process stands for the machine.
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(c.pid, flush=True); time.sleep(60)\n"
    )
    root = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(root.stdout.readline())
        info = pin_acoustic(root.pid, [child], {first})
        assert info["acoustic_cpus"] == [first] and info["rest_cpus"] == sorted(allowed - {first})
        assert os.sched_getaffinity(child) == {first}
        assert os.sched_getaffinity(root.pid) == allowed - {first}
        assert os.sched_getaffinity(0) == allowed  # outside the run: untouched
        pin_threads(root.pid, allowed)  # the CPUs back
        assert os.sched_getaffinity(root.pid) == allowed
    finally:
        for p in psutil.Process(root.pid).children(recursive=True) + [psutil.Process(root.pid)]:
            p.kill()
        root.wait()
