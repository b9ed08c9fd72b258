"""The shipped Serve configs: valid for Ray's schema and our AppArgs, consistent with the graph,
and ``serve run config/serve.yaml`` actually serving (a subprocess with its own Ray)."""

from __future__ import annotations

import contextlib
import copy
import io
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
import soundfile as sf
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_fixtures import free_port, report, wait_ready, walk_graph

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"cpu": REPO / "config" / "serve.yaml", "gpu": REPO / "config" / "serve.gpu.yaml"}
README_BODY = {"model": "chattts", "input": "你好", "voice": "alloy", "response_format": "wav"}
SERVE_RUN_READY_TIMEOUT_S = 240.0


def load(name: str) -> dict:
    with open(CONFIGS[name]) as f:
        return yaml.safe_load(f)


def chattts_app(config: dict) -> dict:
    apps = [a for a in config["applications"] if a["name"] == "chattts"]
    assert len(apps) == 1, [a["name"] for a in config["applications"]]
    return apps[0]


def deployments(config: dict) -> dict[str, dict]:
    return {d["name"]: d for d in chattts_app(config).get("deployments", [])}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_validates_with_ray_schema(name):
    schema = ServeDeploySchema.model_validate(load(name))
    (app,) = [a for a in schema.applications if a.name == "chattts"]
    assert app.import_path == "serve_app.app:build_app"
    assert app.route_prefix == "/"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_args_validate_with_app_args(name):
    from serve_app.app import AppArgs

    args = AppArgs.model_validate(chattts_app(load(name))["args"])
    assert args.model.weights.source == "auto"  # works offline: CHATTTS_WEIGHTS / fallback decide
    # A typo in the args must not pass silently.
    bad = copy.deepcopy(chattts_app(load(name))["args"])
    bad["acoustic"]["max_rowz"] = 1
    with pytest.raises(ValueError):
        AppArgs.model_validate(bad)


def test_gpu_config_shares_gpus_between_acoustic_replicas():
    deps = deployments(load("gpu"))
    assert deps["Acoustic"]["ray_actor_options"]["num_gpus"] == 0.5
    assert chattts_app(load("gpu"))["args"]["model"]["device"] == "cuda"
    for name, dep in deps.items():  # only the acoustic stage asks for a GPU
        if name != "Acoustic":
            assert not dep.get("ray_actor_options", {}).get("num_gpus"), name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_deployments_exist_in_graph(name, serve_weights_cache):
    from serve_app.app import build_app

    args = copy.deepcopy(chattts_app(load(name))["args"])
    # Building the graph resolves the weights: use the session's tiny ones, not the hub.
    args["model"]["weights"] = {"source": "random-tiny", "cache_dir": str(serve_weights_cache)}
    graph = {node._bound_deployment.name for node in walk_graph(build_app(args))}
    assert graph == {"Ingress", "TextNormalizer", "Acoustic", "Vocoder"}
    configured = set(deployments(load(name)))
    assert configured <= graph, f"configured deployments not in the graph: {configured - graph}"
    assert configured == graph, f"deployments without config: {graph - configured}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_acoustic_ongoing_requests_cover_a_batch(name):
    acoustic = deployments(load(name))["Acoustic"]
    batch = acoustic["user_config"]["max_batch_size"]
    # Serve's default max_ongoing_requests (5) would silently cap every batch (DESIGN.md 12).
    assert acoustic["max_ongoing_requests"] >= batch
    from deployments.acoustic import AcousticUserConfig

    AcousticUserConfig.model_validate(acoustic["user_config"])


# ------------------------------------------------------------------------------ serve run smoke


def _expected_samples(config: dict, text: str) -> int:
    from deployments.normalizer import chattts_speaker
    from serve_app.engine.config import SegmentLimits
    from serve_app.engine.pipeline import Planner, SynthesisOptions

    limits = SegmentLimits.model_validate(chattts_app(config)["args"].get("segments", {}))
    plan = Planner(chattts_speaker(), limits).plan(text, SynthesisOptions(voice="alloy"))
    return sum(min(r.target_tokens, r.max_new_tokens) * 512 - 256 for r in plan.segments)


def _marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``marker``: the subprocess and everything it (and the
    Ray it started: GCS, raylet, workers, replicas) spawned. Nothing of the session's Ray."""
    needle = marker.encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
        except OSError:
            continue
        out.append(f"{pid}: {cmd.decode(errors='replace')}")
    return out


def _wait_gone(marker: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    pids = _marked_pids(marker)
    while pids and time.monotonic() < deadline:
        time.sleep(0.5)
        pids = _marked_pids(marker)
    return pids


@contextlib.contextmanager
def _sigint_as_from_a_terminal():
    """Let a child started here take SIGINT as it would from a terminal. A test run started in the
    background (``.ci/run &``) ignores SIGINT, as POSIX has every background job of a
    non-interactive shell do; an ignored signal stays ignored across exec, and Python then never
    installs its KeyboardInterrupt handler, so the Ctrl-C below would be lost. A *handled* signal
    is reset to the default on exec: handle it in this process while the child is started."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("front_door", ["proxy", "haproxy"])
def test_serve_run_default_config(serve_weights_cache, tmp_path, front_door):
    """``serve run`` of config/serve.yaml (port moved, loopback only) serves the README's curl
    request. It starts its own local Ray: no RAY_ADDRESS, its own RAY_TMPDIR, so it can never
    attach to the session's cluster (``ray.init()`` without an address only joins a cluster
    started by ``ray start``). ``haproxy``: the README's fast front door (Ray's bundled HAProxy
    in front of the Ingress replicas' own HTTP servers) streams and answers cache hits too."""
    config = load("cpu")
    port = free_port()
    config["http_options"]["port"] = port
    config["http_options"]["host"] = "127.0.0.1"
    cfg_path = tmp_path / "serve.yaml"
    cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))

    marker = f"CHATTTS_SERVE_RUN_TEST={uuid.uuid4().hex}"
    ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must fit
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(
        RAY_AUTH_MODE="disabled",
        RAY_TMPDIR=ray_tmp,
        CHATTTS_WEIGHTS="random-tiny",
        CHATTTS_SERVE_CACHE=str(serve_weights_cache),
        PYTHONUNBUFFERED="1",
    )
    env.pop("CHATTTS_WEIGHTS_PATH", None)
    if front_door == "haproxy":
        env.update(RAY_SERVE_ENABLE_HA_PROXY="1", RAY_SERVE_HAPROXY_NBTHREAD="1")
    key, value = marker.split("=", 1)
    env[key] = value
    serve_exe = Path(sys.executable).with_name("serve")
    log_path = tmp_path / "serve_run.log"
    url = f"http://127.0.0.1:{port}"

    with open(log_path, "wb") as log:
        t0 = time.monotonic()
        with _sigint_as_from_a_terminal():
            proc = subprocess.Popen(
                [str(serve_exe), "run", str(cfg_path)],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        killed: list[str] = []
        try:
            try:
                wait_ready(url, SERVE_RUN_READY_TIMEOUT_S, proc=proc)
            except AssertionError as exc:
                raise AssertionError(f"{exc}\n--- serve run log (tail) ---\n{log_path.read_text(errors='replace')[-4000:]}") from None
            startup_s = time.monotonic() - t0
            report("`serve run config/serve.yaml` start-up to /readyz 200", f"{startup_s:.1f} s (own Ray, random-tiny weights)")

            t1 = time.perf_counter()
            r = httpx.post(url + "/v1/audio/speech", json=README_BODY, timeout=120)
            first_request_s = time.perf_counter() - t1
            assert r.status_code == 200, r.text[:500]
            assert r.headers["content-type"] == "audio/wav"
            assert r.headers.get("x-weights") == "random"
            pcm, rate = sf.read(io.BytesIO(r.content), dtype="int16")
            assert rate == 24000 and pcm.ndim == 1
            # Random weights: exactly the planned tokens (512 samples each, less half a token).
            assert len(pcm) == _expected_samples(config, README_BODY["input"]), f"{len(pcm)} samples"
            report(f"`serve run` ({front_door}): README curl request", f"{first_request_s:.2f} s, {len(pcm) / rate:.2f} s of audio")
            # Streamed in pieces, and a repeated seeded request is a cache hit, through this front door.
            body = {**README_BODY, "seed": 5}
            with httpx.stream("POST", url + "/v1/audio/speech", json=body, timeout=120) as resp:
                assert resp.status_code == 200 and resp.headers.get("x-cache") == "miss"
                pieces = [p for p in resp.iter_raw() if p]
            assert len(pieces) >= 2, len(pieces)
            hits = []
            with httpx.Client(base_url=url, timeout=30) as client:  # keep-alive, as a real client
                for _ in range(20):
                    t2 = time.perf_counter()
                    again = client.post("/v1/audio/speech", json=body)
                    hits.append(time.perf_counter() - t2)
                    assert again.headers.get("x-cache") == "hit" and again.content == b"".join(pieces)
            report(f"`serve run` ({front_door}): cache hit p50", f"{1000 * sorted(hits)[len(hits) // 2]:.1f} ms ({len(again.content)} bytes)")
            assert _marked_pids(marker), "no processes found for the serve run subprocess"
        finally:
            # Ctrl-C: serve run deletes its apps and shuts down the Ray it started.
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    killed.append(f"serve run {proc.pid} (ignored SIGINT for 60 s)")
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait(timeout=30)
            leftovers = _wait_gone(marker, timeout_s=30)
            if leftovers:  # kill exactly the processes this test's subprocess started
                killed += _describe(leftovers)
                for pid in leftovers:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            remaining = _wait_gone(marker, timeout_s=10)
            report(f"`serve run` ({front_door}) shutdown", f"exit code {proc.returncode}; killed by the test: {killed or 'none'}")
    assert not remaining, f"processes of the serve run subprocess survive SIGKILL: {_describe(remaining)}"
    assert not killed, f"serve run left processes behind after Ctrl-C: {killed}"
    shutil.rmtree(ray_tmp, ignore_errors=True)  # its Ray logs stay behind only when the test fails
