"""``python -m deployments.kuberay > deploy/kuberay/rayservice.yaml``: the KubeRay manifests of the
service, generated from config/serve.gpu.yaml so the two cannot drift (tests/unit/test_kuberay.py
checks the committed file is this output).

A ``RayService`` whose ``serveConfigV2`` is the GPU config's Serve part (proxy, HTTP options,
applications) and whose cluster has:

- a head with ``num-cpus: "0"``: no replica lands there; it runs the GCS, the dashboard, Serve's
  controller (where the Acoustic autoscaling policy runs) and a proxy;
- a GPU worker group whose pod is the node shape the GPU config is sized for (``GPU_POD``: one
  ``nvidia.com/gpu`` for two Acoustic replicas at ``num_gpus: 0.5``, and the CPUs they need plus
  what the CPU stages may hold on a node) and a CPU worker group for more Vocoder, Ingress and
  TextNormalizer replicas, its pod as large as those per-node bounds use, the groups' bounds
  derived from the Serve config's resources, ``max_replicas`` and ``max_replicas_per_node``;
- KubeRay's in-tree autoscaler: Serve asks for replicas, the autoscaler adds the pods they need;
- every Ray node's metrics on a port named ``metrics`` and a ``PodMonitor`` for the Prometheus
  operator.

Nothing is exposed that should not be (``for_kubernetes`` is what the manifest changes in the
Serve config):

- the API fails closed: ``ingress.security.auth: required``, the keys from the Secret
  ``chattts-api-keys`` in ``CHATTTS_API_KEYS`` on every pod an Ingress replica can land on (a pod
  without the Secret does not start; an Ingress without a key refuses to);
- Ray's token authentication on (``authOptions.mode: token``, KubeRay >= v1.5.1: the operator
  makes a random token per RayCluster in a Secret, gives it to every Ray container and uses it for
  the dashboard calls that deploy serveConfigV2), and ``RAY_AUTH_MODE=token`` set on every Ray
  container as well, so that an operator that ignored ``authOptions`` gives a cluster that does
  not start rather than one without auth;
- no LoadBalancer or NodePort (the head Service is ClusterIP) and a ``NetworkPolicy`` that admits
  to the Ray pods only the other Ray pods (every Ray port), the KubeRay operator (dashboard),
  Prometheus (metrics), and anyone on the Serve HTTP port (the API, behind its keys);
- custom voices in Redis (an Ingress pod's directory is lost with the pod and not shared), the
  response cache too when the config puts it in Redis; a second ``NetworkPolicy`` admits to the
  Redis pods only the Ray pods.

The image is the user's to build (IMAGE below): Ray 2.60's GPU image with this package installed.
"""

from __future__ import annotations

import copy
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from serve_app.settings import HOOK_ENV, IMPORT_PATH

REPO_ROOT = Path(__file__).resolve().parents[1]
GPU_CONFIG = REPO_ROOT / "config" / "serve.gpu.yaml"
NAME = "chattts-serve"
RAY_VERSION = "2.60.0"
IMAGE = "REPLACE-ME/chattts-serve:0.1.0"  # FROM rayproject/ray:2.60.0-py311-gpu + `pip install .`
METRICS_PORT = 8080
POD_LABELS = {"app.kubernetes.io/name": NAME}
# Ray's own ports on the head: never outside the cluster, and inside it only for the Ray pods (and
# the KubeRay operator for the dashboard).
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT = 6379, 8265, 10001

# API keys: a Secret the operator makes (`chattts-serve keys new`), its value comma-separated keys.
API_KEYS_SECRET = "chattts-api-keys"
API_KEYS_SECRET_KEY = "keys"
# Redis for custom voices (and the response cache when the config says redis): a Service the
# operator provides in the same namespace, its pods labelled REDIS_LABELS. Not the Ray head's GCS.
REDIS_SERVICE = "chattts-redis"
REDIS_LABELS = {"app.kubernetes.io/name": REDIS_SERVICE}
REDIS_PORT = 6379
REDIS_URL = f"redis://{REDIS_SERVICE}:{REDIS_PORT}"
CACHE_DB, VOICES_DB = 0, 1
# Who else may reach the Ray pods: the KubeRay operator (Helm chart's pod label, any namespace) on
# the dashboard port, Prometheus (kube-prometheus-stack's labels) on the metrics port.
KUBERAY_OPERATOR_LABELS = {"app.kubernetes.io/name": "kuberay-operator"}
PROMETHEUS_NAMESPACE = "monitoring"
PROMETHEUS_LABELS = {"app.kubernetes.io/name": "prometheus"}

# The GPU node config/serve.gpu.yaml is sized for (the one home of that shape: the config's comment,
# the README and docs/operations.md name it; tests/unit/test_configs.py checks the config against
# it). Its CPUs are its Acoustic replicas' (two at 1 CPU) plus the most the CPU stages may hold on
# one node (their max_replicas_per_node): gpu_node_cpus. The CPU pod is sized by cpu_pod.
GPU_POD = {"cpu": 8, "memory": "32Gi", "gpu": 1}
CPU_POD_MEMORY = "16Gi"
HEAD_POD = {"cpu": 4, "memory": "16Gi"}

HEADER = f"""\
# KubeRay manifests of chattts-serve: a RayService, a PodMonitor and two NetworkPolicies. GENERATED
# from config/serve.gpu.yaml by `python -m deployments.kuberay > deploy/kuberay/rayservice.yaml`:
# edit the config (or deployments/kuberay.py), not this file.
#
# What you provide (in the namespace you apply this to; give the service a namespace of its own):
#   - the image, {IMAGE} below: rayproject/ray:{RAY_VERSION}-py311-gpu with this
#     repository installed (`pip install .`), for every pod (the head too: Serve builds the app
#     there). No runtime_env is used, so nothing is installed at start-up.
#   - the weights: CHATTTS_WEIGHTS=huggingface below downloads 2Noise/ChatTTS into HF_HOME (a
#     volume: put a PersistentVolumeClaim there); with `local`, mount them and set
#     CHATTTS_WEIGHTS_PATH. Never leave `auto` in production: without weights it serves noise.
#   - the API keys, a Secret (never in this file). Worker pods do not start without it, and an
#     Ingress replica without a key refuses to (ingress.security.auth: required):
#       kubectl create secret generic {API_KEYS_SECRET} --from-literal={API_KEYS_SECRET_KEY}="$(chattts-serve keys new)"
#     (several keys: comma-separated; a key's id for per-key grants: `chattts-serve keys id`).
#   - Redis for custom voices (db {VOICES_DB}; the response cache too, db {CACHE_DB}, if the config's cache says
#     redis): a Service named {REDIS_SERVICE} on port {REDIS_PORT}, its pods labelled
#     app.kubernetes.io/name={REDIS_SERVICE} (the NetworkPolicy {REDIS_SERVICE} admits only the Ray pods),
#     with persistence on (AOF or RDB): the voices live only there. The URL carries no password.
#   - the KubeRay operator >= v1.5.1 (authOptions: Ray's token authentication; the operator makes
#     the token, a Secret named after the RayCluster, key auth_token), the NVIDIA device plugin,
#     the Prometheus operator for the PodMonitor (Prometheus pods in namespace {PROMETHEUS_NAMESPACE}, labelled
#     app.kubernetes.io/name=prometheus), and a CNI that enforces NetworkPolicy (without one
#     the policies are ignored).
#   - the way in for clients: the API is the RayService's serve Service ({NAME}-serve-svc,
#     ClusterIP, port 8000); put an Ingress or Gateway with TLS in front of it. Nothing else is
#     exposed: the dashboard ({DASHBOARD_PORT}), GCS ({GCS_PORT}), Ray client ({CLIENT_PORT}) and metrics ({METRICS_PORT}) ports stay
#     inside the cluster (kubectl port-forward and the Ray token for the dashboard).
# Not applied anywhere yet: it was validated offline only (tests/unit/test_kuberay.py).
"""


def serve_config(path: Path = GPU_CONFIG) -> dict:
    """The Serve part of the config, as KubeRay's serveConfigV2 takes it."""
    cfg = yaml.safe_load(path.read_text())
    return {k: cfg[k] for k in ("proxy_location", "http_options", "logging_config", "applications") if k in cfg}


def for_kubernetes(serve: dict) -> dict:
    """What the manifest changes in the Serve config, and nothing else: API keys required (the
    serve Service puts the API on the cluster network), in the Ingress ``user_config`` too if it
    sets ``security`` (a live change must not switch auth off); custom voices in Redis (an Ingress
    pod's directory is lost with the pod and not shared between pods; the voice limits are kept);
    a Redis response cache pointed at the same Redis."""
    serve = copy.deepcopy(serve)
    for app in serve["applications"]:
        args = app.setdefault("args", {})
        args.setdefault("ingress", {}).setdefault("security", {})["auth"] = "required"
        voices = {k: v for k, v in (args.get("voices") or {}).items() if k not in ("backend", "path", "redis_url")}
        args["voices"] = {"backend": "redis", "redis_url": f"{REDIS_URL}/{VOICES_DB}", **voices}
        cache = args.get("cache") or {}
        if cache.get("backend") == "redis":
            cache["redis_url"] = f"{REDIS_URL}/{CACHE_DB}"
        for dep in app.get("deployments", []):
            live = dep.get("user_config") or {}
            if dep["name"] == "Ingress" and "security" in live:
                live["security"]["auth"] = "required"
    return serve


def api_keys_env(serve: dict) -> str:
    """The variable the Ingress reads its keys from (``ingress.security.api_keys_env``)."""
    (app,) = serve["applications"]
    security = ((app.get("args") or {}).get("ingress") or {}).get("security") or {}
    return security.get("api_keys_env", "CHATTTS_API_KEYS")


def hosts_ingress(serve: dict, ray_cpus: float) -> bool:
    """Whether a Ray node with ``ray_cpus`` CPUs can take an Ingress replica (so needs the keys)."""
    return ray_cpus >= _deployments(serve)["Ingress"]["ray_actor_options"].get("num_cpus", 1)


def _deployments(serve: dict) -> dict[str, dict]:
    return {d["name"]: d for app in serve["applications"] for d in app.get("deployments", [])}


def cpu_stages(serve: dict) -> dict[str, dict]:
    """The deployments that ask for no GPU (Ingress, TextNormalizer, Vocoder)."""
    return {n: d for n, d in _deployments(serve).items() if not d["ray_actor_options"].get("num_gpus")}


def cpu_stage_cpus_per_node(serve: dict) -> float:
    """The most CPUs the CPU stages can hold on one node: each one's ``max_replicas_per_node`` x
    ``num_cpus``. ValueError for a stage without that bound: its replicas could take every CPU of
    a GPU node and leave its Acoustic replicas unscheduled beside a free GPU share."""
    unbounded = [n for n, d in cpu_stages(serve).items() if not d.get("max_replicas_per_node")]
    if unbounded:
        raise ValueError(f"CPU stages without max_replicas_per_node: {unbounded}")
    return sum(d["max_replicas_per_node"] * d["ray_actor_options"]["num_cpus"] for d in cpu_stages(serve).values())


def acoustic_per_gpu_node(serve: dict, node: dict = GPU_POD) -> int:
    """Acoustic replicas a node of shape ``node`` takes: its GPUs / ``num_gpus`` per replica."""
    return int(node["gpu"] / _deployments(serve)["Acoustic"]["ray_actor_options"]["num_gpus"])


def gpu_node_cpus(serve: dict, node: dict = GPU_POD) -> float:
    """CPUs a GPU node needs so that the CPU stages can never take those of its Acoustic replicas:
    theirs plus the CPU stages' per-node bound. At most ``node["cpu"]`` for the shape the config
    is sized for."""
    acoustic = _deployments(serve)["Acoustic"]["ray_actor_options"]
    return acoustic_per_gpu_node(serve, node) * acoustic["num_cpus"] + cpu_stage_cpus_per_node(serve)


def cpu_pod(serve: dict) -> dict:
    """The CPU group's pod: as many CPUs as the CPU stages' per-node bounds can use (a larger pod's
    extra CPUs would stay idle)."""
    return {"cpu": cpu_stage_cpus_per_node(serve), "memory": CPU_POD_MEMORY}


def _cpu_quantity(cpus: float) -> str:
    return str(int(cpus)) if float(cpus).is_integer() else f"{round(cpus * 1000)}m"


def _container(name: str, pod: dict, ports: list[dict], env: list[dict]) -> dict:
    resources: dict[str, Any] = {"cpu": _cpu_quantity(pod["cpu"]), "memory": pod["memory"]}
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
    # Also set by the operator through authOptions; here so that a cluster whose operator ignored
    # authOptions fails to start (token mode without a token) instead of running without auth.
    {"name": "RAY_AUTH_MODE", "value": "token"},
    # The front guard in Serve's proxy (deployments/proxy/front_guard.py): refusal budgets per client.
    {"name": HOOK_ENV, "value": IMPORT_PATH},
]
VOLUMES = [{"name": "hf-cache", "emptyDir": {}}]


def _env(serve: dict, ray_cpus: float) -> list[dict]:
    """Every Ray container's env, plus the API keys from their Secret where an Ingress can run."""
    env = [dict(e) for e in ENV]
    if hosts_ingress(serve, ray_cpus):
        env.append(
            {
                "name": api_keys_env(serve),
                "valueFrom": {"secretKeyRef": {"name": API_KEYS_SECRET, "key": API_KEYS_SECRET_KEY}},
            }
        )
    return env


def _template(container: dict, gpu: bool = False) -> dict:
    spec: dict[str, Any] = {"containers": [container], "volumes": VOLUMES}
    if gpu:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"metadata": {"labels": dict(POD_LABELS)}, "spec": spec}


def worker_bounds(serve: dict) -> dict[str, tuple[int, int]]:
    """(minReplicas, maxReplicas) of each worker group: enough pods for every deployment's
    min_replicas / max_replicas given the pod shapes and the per-node bounds (what
    tests/unit/test_kuberay.py checks back). Every pod, GPU or CPU, holds each CPU stage's
    ``max_replicas_per_node``; the CPU group holds what the GPU pods do not."""
    need = gpu_node_cpus(serve)
    if need > GPU_POD["cpu"]:
        raise ValueError(
            f"a GPU pod has {GPU_POD['cpu']} CPUs; its Acoustic replicas and the CPU stages' "
            f"max_replicas_per_node need {need:g}"
        )
    acoustic = _deployments(serve)["Acoustic"]["autoscaling_config"]
    per_gpu_pod = acoustic_per_gpu_node(serve)
    gpu = (math.ceil(acoustic["min_replicas"] / per_gpu_pod), math.ceil(acoustic["max_replicas"] / per_gpu_pod))

    def cpu_pods(bound: str, gpu_pods: int) -> int:
        return max(
            math.ceil(
                max(0, d["autoscaling_config"][bound] - gpu_pods * d["max_replicas_per_node"])
                / d["max_replicas_per_node"]
            )
            for d in cpu_stages(serve).values()
        )

    cpu = (max(1, cpu_pods("min_replicas", gpu[0])), cpu_pods("max_replicas", gpu[1]))
    return {"gpu": gpu, "cpu": cpu}


def _policy(name: str, pods: dict, ingress: list[dict]) -> dict:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": dict(POD_LABELS)},
        "spec": {"podSelector": {"matchLabels": dict(pods)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def network_policies(serve_port: int) -> list[dict]:
    """Who may open a connection to the Ray pods and to the Redis pods. Egress stays open (the
    weights download, Redis, DNS, the autoscaler's calls to the API server)."""

    def tcp(*ports: int) -> list[dict]:
        return [{"protocol": "TCP", "port": p} for p in ports]

    ray_pods = {"podSelector": {"matchLabels": dict(POD_LABELS)}}
    ray = _policy(
        NAME,
        POD_LABELS,
        [
            # Ray pods among themselves: GCS, raylets, object managers, workers, the dashboard agents.
            {"from": [ray_pods]},
            # The KubeRay operator deploys serveConfigV2 and reads Serve's status through the dashboard.
            {
                "from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": dict(KUBERAY_OPERATOR_LABELS)}}],
                "ports": tcp(DASHBOARD_PORT),
            },
            # Prometheus scrapes every pod's metrics port (the PodMonitor).
            {
                "from": [
                    {
                        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": PROMETHEUS_NAMESPACE}},
                        "podSelector": {"matchLabels": dict(PROMETHEUS_LABELS)},
                    }
                ],
                "ports": tcp(METRICS_PORT),
            },
            # The API, from whatever fronts the serve Service (an Ingress controller, a Gateway, other
            # pods): its API keys guard it. Narrow `from` to the Ingress controller's namespace if you can.
            {"ports": tcp(serve_port)},
        ],
    )
    redis = _policy(REDIS_SERVICE, REDIS_LABELS, [{"from": [ray_pods], "ports": tcp(REDIS_PORT)}])
    return [ray, redis]


def manifests(path: Path = GPU_CONFIG) -> list[dict]:
    serve = for_kubernetes(serve_config(path))
    bounds = worker_bounds(serve)
    serve_port = int(serve.get("http_options", {}).get("port", 8000))
    metrics = {"metrics-export-port": str(METRICS_PORT)}
    metrics_port = {"containerPort": METRICS_PORT, "name": "metrics"}
    head_ports = [
        {"containerPort": GCS_PORT, "name": "gcs"},
        {"containerPort": DASHBOARD_PORT, "name": "dashboard"},
        {"containerPort": CLIENT_PORT, "name": "client"},
        {"containerPort": serve_port, "name": "serve"},
        metrics_port,
    ]
    worker_ports = [{"containerPort": serve_port, "name": "serve"}, metrics_port]
    head_start = {"num-cpus": "0", "dashboard-host": "0.0.0.0", **metrics}

    def group(name: str, pod: dict, gpu: bool) -> dict:
        low, high = bounds[name]
        return {
            "groupName": name,
            "replicas": low,
            "minReplicas": low,
            "maxReplicas": high,
            "rayStartParams": dict(metrics),
            "template": _template(_container("ray-worker", pod, worker_ports, _env(serve, pod["cpu"])), gpu=gpu),
        }

    service = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": NAME},
        "spec": {
            "serveConfigV2": yaml.safe_dump(serve, sort_keys=False, width=100),
            "rayClusterConfig": {
                "rayVersion": RAY_VERSION,  # the image's Ray: the same on every pod
                # Ray's token authentication (KubeRay >= v1.5.1): the operator makes a random
                # token per RayCluster (a Secret named after it, key auth_token), sets RAY_AUTH_MODE
                # and RAY_AUTH_TOKEN on every Ray container and the autoscaler, and sends the token
                # on its own dashboard calls. The dashboard, GCS and Ray client then refuse callers
                # without it: job submission is remote code execution.
                "authOptions": {"mode": "token"},
                "enableInTreeAutoscaling": True,
                # Idle pods go after 5 minutes: the Acoustic downscale_delay_s (300 s) has
                # already removed their replicas by then.
                "autoscalerOptions": {"upscalingMode": "Default", "idleTimeoutSeconds": 300},
                "headGroupSpec": {
                    # Inside the cluster only (the default, spelled out): no LoadBalancer, no NodePort.
                    "serviceType": "ClusterIP",
                    "enableIngress": False,
                    # The dashboard listens on the pod IP for the operator; the NetworkPolicy and
                    # the token keep everyone else out.
                    "rayStartParams": head_start,
                    "template": _template(
                        _container("ray-head", HEAD_POD, head_ports, _env(serve, float(head_start["num-cpus"])))
                    ),
                },
                "workerGroupSpecs": [group("gpu", GPU_POD, gpu=True), group("cpu", cpu_pod(serve), gpu=False)],
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
    return [service, pod_monitor, *network_policies(serve_port)]


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
