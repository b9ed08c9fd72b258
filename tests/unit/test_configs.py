"""The shipped Serve configs: valid for Ray's schema and our AppConfig, consistent with the graph.
``serve run`` of them: tests/serve/test_serve_run.py."""

from __future__ import annotations

import copy

import pytest
from ray.serve.schema import ServeDeploySchema
from support.app import walk_graph
from support.configs import CONFIGS, chattts_app, deployments, load


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_validates_with_ray_schema(name):
    schema = ServeDeploySchema.model_validate(load(name))
    (app,) = [a for a in schema.applications if a.name == "chattts"]
    assert app.import_path == "deployments.app:build_app"
    assert app.route_prefix == "/"


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_args_validate_with_app_args(name):
    from serve_app.settings import AppConfig

    args = AppConfig.model_validate(chattts_app(load(name))["args"])
    assert args.model.weights.source == "auto"  # works offline: CHATTTS_WEIGHTS / fallback decide
    # A typo in the args must not pass silently.
    bad = copy.deepcopy(chattts_app(load(name))["args"])
    bad.setdefault("acoustic", {})["max_rowz"] = 1
    with pytest.raises(ValueError):
        AppConfig.model_validate(bad)


def test_gpu_config_shares_gpus_between_acoustic_replicas():
    deps = deployments(load("gpu"))
    assert deps["Acoustic"]["ray_actor_options"]["num_gpus"] == 0.5
    assert chattts_app(load("gpu"))["args"]["model"]["device"] == "cuda"
    for name, dep in deps.items():  # only the acoustic stage asks for a GPU
        if name != "Acoustic":
            assert not dep.get("ray_actor_options", {}).get("num_gpus"), name


def test_gpu_config_cpu_stages_never_take_the_acoustic_cpus_of_a_gpu_node():
    """On the node shape the GPU config is sized for (kuberay.GPU_POD, named in the config's
    comment), the CPU stages at their max_replicas_per_node plus the node's Acoustic replicas fit
    its CPUs: however far the CPU stages scale, each GPU node keeps the CPUs its GPU shares need."""
    from deployments.kuberay import GPU_POD

    deps = deployments(load("gpu"))
    cpu_stages = {n: d for n, d in deps.items() if n != "Acoustic"}
    for name, dep in cpu_stages.items():
        assert dep.get("max_replicas_per_node"), f"{name}: no per-node bound, it could take a GPU node's CPUs"
    bounded = sum(d["max_replicas_per_node"] * d["ray_actor_options"]["num_cpus"] for d in cpu_stages.values())
    acoustic = deps["Acoustic"]["ray_actor_options"]
    per_node = int(GPU_POD["gpu"] / acoustic["num_gpus"])
    assert per_node * acoustic["num_cpus"] + bounded <= GPU_POD["cpu"], (per_node, bounded, GPU_POD)
    # The config's comment names the shape checked here.
    assert f"a GPU node has {GPU_POD['gpu']} GPU and {GPU_POD['cpu']} CPUs" in CONFIGS["gpu"].read_text()


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_config_deployments_exist_in_graph(name, chattts_cache_dir):
    from deployments.app import build_app

    args = copy.deepcopy(chattts_app(load(name))["args"])
    # Building the graph resolves the weights: use the session's tiny ones, not the hub.
    args["model"]["weights"] = {"source": "random-tiny", "cache_dir": str(chattts_cache_dir)}
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
        assert not {"max_ongoing_requests", "max_queued_requests", "num_replicas", "ray_actor_options"} & set_in_code, (
            cls.name
        )
    for dep_name, dep in deployments(load(name)).items():
        assert "max_ongoing_requests" in dep and "autoscaling_config" in dep, dep_name
        assert "num_cpus" in dep.get("ray_actor_options", {}), dep_name


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_ingress_args_refuse_typos(name):
    from serve_app.settings import AppConfig

    args = copy.deepcopy(chattts_app(load(name))["args"])
    args.setdefault("ingress", {})["max_input_charz"] = 10
    with pytest.raises(ValueError, match="max_input_charz"):
        AppConfig.model_validate(args)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_acoustic_ongoing_requests_cover_a_batch(name):
    from serve_app.settings import AcousticUserConfig

    acoustic = deployments(load(name))["Acoustic"]
    live = AcousticUserConfig.model_validate(acoustic.get("user_config", {}))
    # Serve's default max_ongoing_requests (5) would silently cap every admission window at 5 requests.
    assert acoustic["max_ongoing_requests"] >= live.max_batch_size
