"""The shipped Serve configs (config/serve.yaml, config/serve.gpu.yaml) as dicts, and the GPU config
as the cluster tests deploy it on a local cluster (bench/lib/cluster.py)."""

from __future__ import annotations

import copy
from typing import Optional

from bench.lib.cluster import HEAD_RESOURCE
from bench.lib.config import DEFAULT_CONFIG, GPU_CONFIG, get_path, load_config, set_path
from bench.lib.procs import REPO_ROOT as REPO  # noqa: F401  (the repository's root, for the tests)

CONFIGS = {"cpu": DEFAULT_CONFIG, "gpu": GPU_CONFIG}


def load(name: str) -> dict:
    """The whole config ``name`` (``cpu`` or ``gpu``), freshly read (callers may change it)."""
    return load_config(CONFIGS[name])


def chattts_app(config: dict) -> dict:
    apps = [a for a in config["applications"] if a["name"] == "chattts"]
    assert len(apps) == 1, [a["name"] for a in config["applications"]]
    return apps[0]


def deployments(config: dict) -> dict[str, dict]:
    """Deployment name -> its entry in the config's ``chattts`` app."""
    return {d["name"]: d for d in chattts_app(config).get("deployments", [])}


def cluster_config(
    *,
    port: int,
    weights_cache: Optional[str] = None,
    acoustic_bounds: tuple[int, int] = (1, 3),
    downscale_delay_s: float = 6.0,
    pin_cpu_stages: bool = True,
    extra_apps: Optional[list[dict]] = None,
) -> dict:
    """config/serve.gpu.yaml for the local cluster.

    Kept from the GPU config: the graph, the Acoustic policy and its resources (num_gpus 0.5,
    num_cpus 1: two replicas per GPU node), the user_config, the drain timeouts. Changed: tiny random
    weights on the CPU in float32 (torch has no GPU here) from ``weights_cache`` (None: the default
    cache directory, which the nodes inherit from this environment), one torch thread, ``max_rows``
    and ``target_fill`` small enough that a few streams ask for several replicas, delays and the
    metrics push interval in seconds instead of minutes, one replica of each CPU stage pinned to the
    head (``pin_cpu_stages``; else the CPU stages as shipped), the proxy on the head only, loopback
    HTTP on ``port`` without API keys (``auth: optional``).
    """
    cfg = load("gpu")
    cfg["proxy_location"] = "HeadOnly"  # only one node per host can bind the HTTP port
    cfg["http_options"] = {**cfg.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = "applications.chattts"
    weights = {"source": "random-tiny", **({"cache_dir": weights_cache} if weights_cache else {})}
    set_path(cfg, f"{app}.args.model", {"weights": weights, "device": "cpu", "dtype": "float32", "torch_threads": 1})
    set_path(cfg, f"{app}.args.acoustic.max_rows", 4)
    set_path(cfg, f"{app}.args.cache", {"backend": "none"})  # every request is a synthesis
    # Loopback only, and the tests send no key: the GPU config's auth: required would keep the
    # Ingress from starting.
    set_path(cfg, f"{app}.args.ingress.security.auth", "optional")
    for dep in ("Ingress", "TextNormalizer", "Vocoder") if pin_cpu_stages else ():
        set_path(cfg, f"{app}.deployments.{dep}.ray_actor_options", {"num_cpus": 0.25, "resources": {HEAD_RESOURCE: 1}})
        set_path(cfg, f"{app}.deployments.{dep}.autoscaling_config", {"min_replicas": 1, "max_replicas": 1})
    acoustic = f"{app}.deployments.Acoustic"
    low, high = acoustic_bounds
    auto = copy.deepcopy(get_path(cfg, f"{acoustic}.autoscaling_config"))
    auto.update(
        min_replicas=low,
        max_replicas=high,
        initial_replicas=low,
        upscale_delay_s=2.0,
        downscale_delay_s=downscale_delay_s,
        look_back_period_s=3.0,
        # How often replicas push their stats to the controller (Serve's default 10 s).
        metrics_interval_s=1.0,
    )
    auto["policy"]["policy_kwargs"] = {"target_fill": 0.5}
    set_path(cfg, f"{acoustic}.autoscaling_config", auto)
    cfg["applications"] += copy.deepcopy(extra_apps or [])
    return cfg
