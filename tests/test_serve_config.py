"""The shipped Serve configs: valid for Ray's schema and our AppArgs, consistent with the graph,
and ``serve run config/serve.yaml`` actually serving (a subprocess with its own Ray)."""

from __future__ import annotations

import copy
import io
import time

import httpx
import pytest
import soundfile as sf
import yaml
from ray.serve.schema import ServeDeploySchema

from serve_fixtures import free_port, report, walk_graph
from serve_run import REPO, ServeRun, describe, marked_pids
from serve_app.engine.wav import with_true_length

CONFIGS = {"cpu": REPO / "config" / "serve.yaml", "gpu": REPO / "config" / "serve.gpu.yaml"}
README_BODY = {"model": "chattts", "input": "你好", "voice": "alloy", "response_format": "wav"}


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
    assert app.import_path == "serve_app.serving.app:build_app"
    assert app.route_prefix == "/"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_args_validate_with_app_args(name):
    from serve_app.settings import AppArgs

    args = AppArgs.model_validate(chattts_app(load(name))["args"])
    assert args.model.weights.source == "auto"  # works offline: CHATTTS_WEIGHTS / fallback decide
    # A typo in the args must not pass silently.
    bad = copy.deepcopy(chattts_app(load(name))["args"])
    bad.setdefault("acoustic", {})["max_rowz"] = 1
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
    from serve_app.serving.app import build_app

    args = copy.deepcopy(chattts_app(load(name))["args"])
    # Building the graph resolves the weights: use the session's tiny ones, not the hub.
    args["model"]["weights"] = {"source": "random-tiny", "cache_dir": str(serve_weights_cache)}
    graph = {node._bound_deployment.name for node in walk_graph(build_app(args))}
    assert graph == {"Ingress", "TextNormalizer", "Acoustic", "Vocoder"}
    configured = set(deployments(load(name)))
    assert configured <= graph, f"configured deployments not in the graph: {configured - graph}"
    assert configured == graph, f"deployments without config: {graph - configured}"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_is_the_one_source_of_deployment_numbers(name):
    """The config file sets every stage's replicas and request limits; the deployment classes
    carry none of their own that a config could contradict."""
    from deployments.acoustic import Acoustic
    from deployments.ingress import Ingress
    from deployments.normalizer import TextNormalizer
    from deployments.vocoder import Vocoder

    for cls in (Ingress, TextNormalizer, Acoustic, Vocoder):
        cfg = cls._deployment_config
        assert cfg.autoscaling_config is None, cls.name
        set_in_code = set(cfg.user_configured_option_names)
        assert not {"max_ongoing_requests", "max_queued_requests", "num_replicas", "ray_actor_options"} & set_in_code, cls.name
    for dep_name, dep in deployments(load(name)).items():
        assert "max_ongoing_requests" in dep and "autoscaling_config" in dep, dep_name
        assert "num_cpus" in dep.get("ray_actor_options", {}), dep_name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ingress_args_refuse_typos(name):
    from serve_app.settings import AppArgs

    args = copy.deepcopy(chattts_app(load(name))["args"])
    args.setdefault("ingress", {})["max_input_charz"] = 10
    with pytest.raises(ValueError, match="max_input_charz"):
        AppArgs.model_validate(args)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_acoustic_ongoing_requests_cover_a_batch(name):
    from serve_app.settings import AcousticLive

    acoustic = deployments(load(name))["Acoustic"]
    live = AcousticLive.model_validate(acoustic.get("user_config", {}))
    # Serve's default max_ongoing_requests (5) would silently cap every admission window at 5 requests.
    assert acoustic["max_ongoing_requests"] >= live.max_batch_size


# ------------------------------------------------------------------------------ serve run smoke


def _expected_samples(config: dict, text: str) -> int:
    from serve_app.engine.config import SegmentLimits
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions

    limits = SegmentLimits.model_validate(chattts_app(config)["args"].get("segments", {}))
    plan = Planner(limits).plan(text, SynthesisOptions(voice="alloy"))
    return sum(min(r.target_tokens, r.max_new_tokens) * 512 - 256 for r in plan.segments)


@pytest.mark.timeout(420)
@pytest.mark.parametrize("front_door", ["proxy", "haproxy"])
def test_serve_run_default_config(serve_weights_cache, tmp_path, front_door):
    """``serve run`` of config/serve.yaml (port moved, loopback only) serves the README's curl
    request. It starts its own local Ray: no RAY_ADDRESS, its own RAY_TMPDIR, so it can never
    attach to the session's cluster (``ray.init()`` without an address only joins a cluster
    started by ``ray start``). ``haproxy``: the fast front door of docs/operations.md (Ray's
    bundled HAProxy in front of the Ingress replicas' own HTTP servers) streams and answers cache
    hits too."""
    config = load("cpu")
    config["http_options"].update(host="127.0.0.1", port=free_port())
    env = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_HAPROXY_NBTHREAD": "1"} if front_door == "haproxy" else {}
    with ServeRun(config, tmp_path, serve_weights_cache, env) as run:
        url = run.url
        report("`serve run config/serve.yaml` start-up to /readyz 200", f"{run.startup_s:.1f} s (own Ray, random-tiny weights)")
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
                assert again.headers.get("x-cache") == "hit" and again.content == with_true_length(b"".join(pieces))
        report(f"`serve run` ({front_door}): cache hit p50", f"{1000 * sorted(hits)[len(hits) // 2]:.1f} ms ({len(again.content)} bytes)")
        assert marked_pids(run.marker), "no processes found for the serve run subprocess"
    report(f"`serve run` ({front_door}) shutdown", f"exit code {run.returncode}; killed by the test: {run.killed or 'none'}")
    assert not run.remaining, f"processes of the serve run subprocess survive SIGKILL: {describe(run.remaining)}"
    assert not run.killed, f"serve run left processes behind after Ctrl-C: {run.killed}"
