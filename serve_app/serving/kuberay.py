"""``python -m serve_app.serving.kuberay > deploy/kuberay/rayservice.yaml``: the KubeRay manifests of the
service, generated from config/serve.gpu.yaml so the two cannot drift (tests/unit/test_kuberay.py
checks the committed file is this output).

A ``RayService`` whose ``serveConfigV2`` is the GPU config's Serve part (proxy, HTTP options,
applications) and whose cluster has:

- a head with ``num-cpus: "0"``: no replica lands there; it runs the GCS, the dashboard, Serve's
  controller (where the Acoustic autoscaling policy runs) and a proxy;
- a GPU worker group (one ``nvidia.com/gpu`` per pod: two Acoustic replicas at ``num_gpus: 0.5``)
  and a CPU worker group for the Vocoder, Ingress and TextNormalizer replicas, their sizes and
  bounds derived from the Serve config's resources and ``max_replicas``;
- KubeRay's in-tree autoscaler: Serve asks for replicas, the autoscaler adds the pods they need;
- every Ray node's metrics on a port named ``metrics`` and a ``PodMonitor`` for the Prometheus
  operator.

The image is the user's to build (IMAGE below): Ray 2.60's GPU image with this package installed.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_CONFIG = REPO_ROOT / "config" / "serve.gpu.yaml"
NAME = "chattts-serve"
RAY_VERSION = "2.60.0"
IMAGE = "REPLACE-ME/chattts-serve:0.1.0"  # FROM rayproject/ray:2.60.0-py311-gpu + `pip install .`
METRICS_PORT = 8080
POD_LABELS = {"app.kubernetes.io/name": NAME}

# Pod shapes. GPU pod: one GPU for two Acoustic replicas (1 CPU each) plus room for one Vocoder
# (2 CPUs) beside them. CPU pod: Vocoder, Ingress and TextNormalizer replicas.
GPU_POD = {"cpu": 8, "memory": "32Gi", "gpu": 1}
CPU_POD = {"cpu": 8, "memory": "16Gi"}
HEAD_POD = {"cpu": 4, "memory": "16Gi"}

HEADER = f"""\
# KubeRay manifests of chattts-serve: a RayService and a PodMonitor. GENERATED from
# config/serve.gpu.yaml by `python -m serve_app.serving.kuberay > deploy/kuberay/rayservice.yaml`: edit
# the config (or serve_app/serving/kuberay.py), not this file.
#
# What you provide:
#   - the image, {IMAGE} below: rayproject/ray:{RAY_VERSION}-py311-gpu with this
#     repository installed (`pip install .`), for every pod (the head too: Serve builds the app
#     there). No runtime_env is used, so nothing is installed at start-up.
#   - the weights: CHATTTS_WEIGHTS=huggingface below downloads 2Noise/ChatTTS into HF_HOME (a
#     volume: put a PersistentVolumeClaim there); with `local`, mount them and set
#     CHATTTS_WEIGHTS_PATH. Never leave `auto` in production: without weights it serves noise.
#   - the KubeRay operator (ray.io/v1 CRDs), the NVIDIA device plugin, and the Prometheus
#     operator for the PodMonitor.
# Not applied anywhere yet: it was validated offline only (tests/unit/test_kuberay.py).
"""


def serve_config(path: Path = GPU_CONFIG) -> dict:
    """The Serve part of the config, as KubeRay's serveConfigV2 takes it."""
    cfg = yaml.safe_load(path.read_text())
    return {k: cfg[k] for k in ("proxy_location", "http_options", "logging_config", "applications") if k in cfg}


def _deployments(serve: dict) -> dict[str, dict]:
    return {d["name"]: d for app in serve["applications"] for d in app.get("deployments", [])}


def _container(name: str, pod: dict, ports: list[dict], env: list[dict]) -> dict:
    resources: dict[str, Any] = {"cpu": str(pod["cpu"]), "memory": pod["memory"]}
    if pod.get("gpu"):
        resources["nvidia.com/gpu"] = str(pod["gpu"])
    return {
        "name": name,
        "image": IMAGE,
        "ports": ports,
        "env": env,
        # Requests = limits: Ray sizes the node from them (num-cpus, num-gpus, memory).
        "resources": {"limits": resources, "requests": dict(resources)},
        "volumeMounts": [{"name": "hf-cache", "mountPath": "/home/ray/.cache/huggingface"}],
    }


ENV = [
    {"name": "CHATTTS_WEIGHTS", "value": "huggingface"},
    {"name": "HF_HOME", "value": "/home/ray/.cache/huggingface"},
]
VOLUMES = [{"name": "hf-cache", "emptyDir": {}}]


def _template(container: dict, gpu: bool = False) -> dict:
    spec: dict[str, Any] = {"containers": [container], "volumes": VOLUMES}
    if gpu:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": dict(POD_LABELS)}, "spec": spec}


def worker_bounds(serve: dict) -> dict[str, tuple[int, int]]:
    """(minReplicas, maxReplicas) of each worker group: enough pods for every deployment's
    min_replicas / max_replicas given the pod shapes (what tests/unit/test_kuberay.py checks back)."""
    deps = _deployments(serve)
    acoustic = deps["Acoustic"]
    opts = acoustic["ray_actor_options"]
    per_gpu_pod = min(int(GPU_POD["gpu"] / opts["num_gpus"]), int(GPU_POD["cpu"] // opts["num_cpus"]))
    gpu = (math.ceil(acoustic["autoscaling_config"]["min_replicas"] / per_gpu_pod),
           math.ceil(acoustic["autoscaling_config"]["max_replicas"] / per_gpu_pod))
    cpu_stages = [d for n, d in deps.items() if n != "Acoustic"]
    cpus = {bound: sum(d["autoscaling_config"][bound] * d["ray_actor_options"]["num_cpus"] for d in cpu_stages)
            for bound in ("min_replicas", "max_replicas")}
    cpu = (max(1, math.ceil(cpus["min_replicas"] / CPU_POD["cpu"])), math.ceil(cpus["max_replicas"] / CPU_POD["cpu"]))
    return {"gpu": gpu, "cpu": cpu}


def manifests(path: Path = GPU_CONFIG) -> list[dict]:
    serve = serve_config(path)
    bounds = worker_bounds(serve)
    metrics = {"metrics-export-port": str(METRICS_PORT)}
    metrics_port = {"containerPort": METRICS_PORT, "name": "metrics"}
    head_ports = [{"containerPort": 6379, "name": "gcs"}, {"containerPort": 8265, "name": "dashboard"},
                  {"containerPort": 10001, "name": "client"}, {"containerPort": 8000, "name": "serve"}, metrics_port]
    worker_ports = [{"containerPort": 8000, "name": "serve"}, metrics_port]

    def group(name: str, pod: dict, gpu: bool) -> dict:
        low, high = bounds[name]
        return {
            "groupName": name,
            "replicas": low,
            "minReplicas": low,
            "maxReplicas": high,
            "rayStartParams": dict(metrics),
            "template": _template(_container("ray-worker", pod, worker_ports, ENV), gpu=gpu),
        }

    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": NAME},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve, sort_keys=False, width=100),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,  # the image's Ray: the same on every pod
                "enableInTreeAutoscaling": True,
                # Idle pods go after 5 minutes: the Acoustic downscale_delay_s (300 s) has
                # already removed their replicas by then.
                "autoscalerOptions": {"upscalingMode": "Default", "idleTimeoutSeconds": 300},
                "headGroupSpec": {
                    "rayStartParams": {"num-cpus": "0", "dashboard-host": "0.0.0.0", **metrics},
                    "template": _template(_container("ray-head", HEAD_POD, head_ports, ENV)),
                },
                "workerGroupSpecs": [group("gpu", GPU_POD, gpu=True), group("cpu", CPU_POD, gpu=False)],
            },
        },
    }
    pod_monitor = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": {"name": NAME, "labels": dict(POD_LABELS)},
        "spec": {
            "selector": {"matchLabels": dict(POD_LABELS)},
            "podMetricsEndpoints": [{"port": "metrics", "path": "/metrics", "interval": "15s"}],
        },
    }
    return [service, pod_monitor]


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # spell every block out: no &id001 / *id001
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(path: Path = GPU_CONFIG) -> str:
    return HEADER + yaml.dump_all(manifests(path), Dumper=_Dumper, sort_keys=False, width=100)


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
