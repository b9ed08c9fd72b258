"""deploy/kuberay/rayservice.yaml, validated offline (no Kubernetes here): it loads, it is what
``python -m serve_app.serving.kuberay`` generates from config/serve.gpu.yaml, it carries the fields KubeRay
and the Prometheus operator need, and its pods can hold what the Serve config asks for."""

from __future__ import annotations

import math

import pytest
import ray
import yaml
from ray.serve.schema import ServeDeploySchema

from bench.lib.procs import REPO_ROOT as REPO
from serve_app.serving import kuberay

MANIFEST = REPO / "deploy" / "kuberay" / "rayservice.yaml"
GPU_CONFIG = REPO / "config" / "serve.gpu.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    loaded = list(yaml.safe_load_all(MANIFEST.read_text()))
    return {d["kind"]: d for d in loaded}


def _quantity(q) -> float:
    q = str(q)
    return float(q[:-1]) / 1000 if q.endswith("m") else float(q)


def _pods(service: dict) -> dict[str, dict]:
    """group -> {cpu, gpu, min, max, container} as Ray will see each pod (num-cpus from the
    rayStartParams if set, else the container's CPU limit; GPUs from nvidia.com/gpu)."""
    cluster = service["spec"]["rayClusterConfig"]
    out = {}
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    for name, g in groups:
        (container,) = g["template"]["spec"]["containers"]
        limits = container["resources"]["limits"]
        cpu = g["rayStartParams"].get("num-cpus", limits["cpu"])
        out[name] = {"cpu": _quantity(cpu), "gpu": _quantity(limits.get("nvidia.com/gpu", 0)),
                     "min": g.get("minReplicas", 1), "max": g.get("maxReplicas", 1), "group": g, "container": container}
    return out


def test_the_committed_manifest_is_the_generated_one():
    assert MANIFEST.read_text() == kuberay.render(GPU_CONFIG), (
        "deploy/kuberay/rayservice.yaml is stale: python -m serve_app.serving.kuberay > deploy/kuberay/rayservice.yaml")


def test_serve_config_is_the_gpu_configs(docs):
    serve = yaml.safe_load(docs["RayService"]["spec"]["serveConfigV2"])
    gpu = yaml.safe_load(GPU_CONFIG.read_text())
    assert serve["applications"] == gpu["applications"]
    assert serve["http_options"] == gpu["http_options"] and serve["proxy_location"] == gpu["proxy_location"]
    ServeDeploySchema.model_validate(serve)


def test_required_fields(docs):
    service = docs["RayService"]
    assert service["apiVersion"] == "ray.io/v1" and service["metadata"]["name"]
    cluster = service["spec"]["rayClusterConfig"]
    assert cluster["rayVersion"] == ray.__version__
    assert cluster["enableInTreeAutoscaling"] is True
    pods = _pods(service)
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"  # no replica on the head
    assert pods["head"]["cpu"] == 0 and pods["head"]["gpu"] == 0
    images = {p["container"]["image"] for p in pods.values()}
    assert images == {kuberay.IMAGE}, images  # one image, the one the header tells users to build
    for name, p in pods.items():
        res = p["container"]["resources"]
        assert res["limits"] == res["requests"], name  # Kubernetes needs GPU requests == limits
        if name != "head":
            assert p["min"] <= p["group"]["replicas"] <= p["max"], name
    gpu_groups = [n for n, p in pods.items() if p["gpu"] > 0]
    assert gpu_groups == ["gpu"]
    assert pods["gpu"]["group"]["template"]["spec"]["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_metrics_port_and_pod_monitor(docs):
    service, monitor = docs["RayService"], docs["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    for name, p in _pods(service).items():
        port = int(p["group"]["rayStartParams"]["metrics-export-port"])
        named = {x["name"]: x["containerPort"] for x in p["container"]["ports"]}
        assert named[endpoint["port"]] == port, name
        labels = p["group"]["template"]["metadata"]["labels"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items(), name


def test_pods_hold_what_the_serve_config_asks_for(docs):
    """Every deployment fits a worker pod; the groups' maxReplicas hold every deployment at its
    max_replicas, their minReplicas the Acoustic min_replicas; Acoustic only on GPU pods."""
    service = docs["RayService"]
    pods = {n: p for n, p in _pods(service).items() if n != "head"}
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    deps = {d["name"]: d for a in serve["applications"] for d in a["deployments"]}

    def per_pod(dep: dict, pod: dict) -> int:
        """Replicas of ``dep`` one pod holds, by CPUs and by GPUs."""
        opts = dep["ray_actor_options"]
        fits = [math.floor(pod[key] / opts[opt]) for key, opt in (("cpu", "num_cpus"), ("gpu", "num_gpus")) if opts.get(opt)]
        return min(fits)

    acoustic = deps["Acoustic"]
    assert per_pod(acoustic, pods["cpu"]) == 0
    on_gpu = per_pod(acoustic, pods["gpu"])
    assert on_gpu == 2  # num_gpus 0.5 on one GPU
    assert pods["gpu"]["max"] * on_gpu >= acoustic["autoscaling_config"]["max_replicas"]
    assert pods["gpu"]["min"] * on_gpu >= acoustic["autoscaling_config"]["min_replicas"]
    for name, dep in deps.items():
        assert max(per_pod(dep, p) for p in pods.values()) >= 1, name
    need = sum(d["autoscaling_config"]["max_replicas"] * d["ray_actor_options"]["num_cpus"] for d in deps.values())
    have = sum(p["max"] * p["cpu"] for p in pods.values())
    assert need <= have, f"{need} CPUs at max_replicas, {have} in the largest cluster"
