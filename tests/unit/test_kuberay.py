"""deploy/kuberay/rayservice.yaml, validated offline (no Kubernetes here): it loads, it is what
``python -m deployments.kuberay`` generates from config/serve.gpu.yaml, it carries the fields KubeRay
and the Prometheus operator need, its pods can hold what the Serve config asks for, and it exposes
nothing it should not (API keys required and from a Secret, Ray's token auth, no outside Service
for Ray's ports, NetworkPolicies, voices in Redis)."""

from __future__ import annotations

import math

import pytest
import ray
import yaml
from ray.serve.schema import ServeDeploySchema

from bench.lib.procs import REPO_ROOT as REPO
from deployments import kuberay

MANIFEST = REPO / "deploy" / "kuberay" / "rayservice.yaml"
GPU_CONFIG = REPO / "config" / "serve.gpu.yaml"


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    loaded = list(yaml.safe_load_all(MANIFEST.read_text()))
    return {d["kind"]: d for d in loaded}


def chattts_args(serve: dict) -> dict:
    (app,) = [a for a in serve["applications"] if a["name"] == "chattts"]
    return app["args"]


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
        out[name] = {
            "cpu": _quantity(cpu),
            "gpu": _quantity(limits.get("nvidia.com/gpu", 0)),
            "min": g.get("minReplicas", 1),
            "max": g.get("maxReplicas", 1),
            "group": g,
            "container": container,
        }
    return out


def test_the_committed_manifest_is_the_generated_one():
    assert MANIFEST.read_text() == kuberay.render(), (  # the default path, as the command below runs it
        "deploy/kuberay/rayservice.yaml is stale: python -m deployments.kuberay > deploy/kuberay/rayservice.yaml"
    )


def test_serve_config_is_the_gpu_configs(docs):
    """The GPU config, but for what Kubernetes needs (kuberay.for_kubernetes): voices in Redis;
    everything else, auth included, as the config says."""
    serve = yaml.safe_load(docs["RayService"]["spec"]["serveConfigV2"])
    gpu = yaml.safe_load(GPU_CONFIG.read_text())
    assert serve["applications"] == kuberay.for_kubernetes(gpu)["applications"]
    assert chattts_args(gpu)["ingress"]["security"]["auth"] == "required"  # the config's own, not only the manifest's

    def without_voices(cfg: dict) -> list[dict]:
        return [{**a, "args": {k: v for k, v in a["args"].items() if k != "voices"}} for a in cfg["applications"]]

    assert without_voices(serve) == without_voices(gpu)
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
    max_replicas, their minReplicas the Acoustic min_replicas; Acoustic only on GPU pods. A pod
    holds at most ``max_replicas_per_node`` of a deployment (Serve enforces it on every node)."""
    service = docs["RayService"]
    pods = {n: p for n, p in _pods(service).items() if n != "head"}
    serve = yaml.safe_load(service["spec"]["serveConfigV2"])
    deps = {d["name"]: d for a in serve["applications"] for d in a["deployments"]}

    def per_pod(dep: dict, pod: dict) -> int:
        """Replicas of ``dep`` one pod holds, by CPUs, by GPUs and by its per-node bound."""
        opts = dep["ray_actor_options"]
        fits = [
            math.floor(pod[key] / opts[opt]) for key, opt in (("cpu", "num_cpus"), ("gpu", "num_gpus")) if opts.get(opt)
        ]
        return min(fits + [dep.get("max_replicas_per_node") or math.inf])

    acoustic = deps["Acoustic"]
    assert per_pod(acoustic, pods["cpu"]) == 0
    on_gpu = per_pod(acoustic, pods["gpu"])
    assert on_gpu == 2  # num_gpus 0.5 on one GPU
    assert pods["gpu"]["max"] * on_gpu >= acoustic["autoscaling_config"]["max_replicas"]
    assert pods["gpu"]["min"] * on_gpu >= acoustic["autoscaling_config"]["min_replicas"]
    for name, dep in deps.items():
        assert max(per_pod(dep, p) for p in pods.values()) >= 1, name
        held = sum(p["max"] * per_pod(dep, p) for p in pods.values())
        assert held >= dep["autoscaling_config"]["max_replicas"], (name, held)
    need = sum(d["autoscaling_config"]["max_replicas"] * d["ray_actor_options"]["num_cpus"] for d in deps.values())
    have = sum(p["max"] * p["cpu"] for p in pods.values())
    assert need <= have, f"{need} CPUs at max_replicas, {have} in the largest cluster"


def test_pods_have_the_node_shape_and_cpu_stages_leave_acoustic_its_cpus(docs):
    """The GPU pod is the node shape the GPU config is sized for (kuberay.GPU_POD), and on it the
    CPU stages at their per-node bounds plus the pod's Acoustic replicas fit its CPUs: the CPU
    stages can never take the CPUs a new Acoustic replica needs. The CPU pod is exactly what those
    bounds use (more CPUs would stay idle)."""
    pods = _pods(docs["RayService"])
    deps = {d["name"]: d for a in _serve(docs)["applications"] for d in a["deployments"]}
    assert (pods["gpu"]["cpu"], pods["gpu"]["gpu"]) == (kuberay.GPU_POD["cpu"], kuberay.GPU_POD["gpu"])
    cpu_stages = {n: d for n, d in deps.items() if not d["ray_actor_options"].get("num_gpus")}
    assert set(cpu_stages) == {"Ingress", "TextNormalizer", "Vocoder"}
    bounded = sum(d["max_replicas_per_node"] * d["ray_actor_options"]["num_cpus"] for d in cpu_stages.values())
    acoustic = deps["Acoustic"]["ray_actor_options"]
    acoustic_cpus = math.floor(pods["gpu"]["gpu"] / acoustic["num_gpus"]) * acoustic["num_cpus"]
    assert bounded + acoustic_cpus <= pods["gpu"]["cpu"], (bounded, acoustic_cpus, pods["gpu"]["cpu"])
    assert pods["cpu"]["cpu"] == bounded
    assert kuberay.gpu_node_cpus(_serve(docs)) == bounded + acoustic_cpus


def test_a_cpu_stage_without_a_per_node_bound_is_refused():
    """The generator will not write a manifest in which a CPU stage is unbounded per node, or in
    which the bounds leave a GPU pod too few CPUs for its Acoustic replicas."""
    serve = kuberay.for_kubernetes(kuberay.serve_config(GPU_CONFIG))
    (app,) = serve["applications"]
    deps = {d["name"]: d for d in app["deployments"]}
    del deps["Vocoder"]["max_replicas_per_node"]
    with pytest.raises(ValueError, match="Vocoder"):
        kuberay.worker_bounds(serve)
    deps["Vocoder"]["max_replicas_per_node"] = 3  # 6 + 1 + 1 + 2 Acoustic = 10 CPUs > 8
    with pytest.raises(ValueError, match="need 10"):
        kuberay.worker_bounds(serve)


# ---------------------------------------------------------------- exposes nothing it should not


def _serve(docs) -> dict:
    return yaml.safe_load(docs["RayService"]["spec"]["serveConfigV2"])


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


def test_auth_required_with_keys_from_a_secret(docs):
    """auth: required in serveConfigV2 (it validates as AppConfig), and the keys it reads come from
    the Secret on every pod an Ingress replica can land on: never a value in the manifest, and no
    Secret object either (a committed placeholder would be a known key)."""
    from serve_app.settings import AppConfig

    args = AppConfig.model_validate(chattts_args(_serve(docs)))
    assert args.ingress.security.auth == "required"
    var = args.ingress.security.api_keys_env
    assert var
    ingress_cpus = {d["name"]: d for a in _serve(docs)["applications"] for d in a["deployments"]}["Ingress"][
        "ray_actor_options"
    ]["num_cpus"]
    pods = _pods(docs["RayService"])
    hosts = [name for name, p in pods.items() if p["cpu"] >= ingress_cpus]
    assert set(hosts) == {"gpu", "cpu"}, hosts  # not the head (num-cpus 0)
    for name in hosts:
        ref = _env(pods[name]["container"])[var]
        assert "value" not in ref, name
        assert ref["valueFrom"]["secretKeyRef"] == {
            "name": kuberay.API_KEYS_SECRET,
            "key": kuberay.API_KEYS_SECRET_KEY,
        }, name
        assert not ref["valueFrom"]["secretKeyRef"].get("optional"), name  # no Secret: the pod does not start
    assert "Secret" not in docs
    assert (
        f"kubectl create secret generic {kuberay.API_KEYS_SECRET} --from-literal={kuberay.API_KEYS_SECRET_KEY}="
        in MANIFEST.read_text()
    )
    for name, p in pods.items():  # nothing secret-looking carries a literal value
        for env in p["container"]["env"]:
            if any(word in env["name"] for word in ("KEY", "TOKEN", "PASSWORD", "SECRET")):
                assert "valueFrom" in env and "value" not in env, (name, env["name"])


def test_ray_token_auth_on_every_ray_container(docs):
    """Ray's token auth through KubeRay's authOptions (the operator makes the token and injects
    RAY_AUTH_TOKEN), and RAY_AUTH_MODE=token on every Ray container too: an operator that ignores
    authOptions leaves a cluster that cannot start, not one without auth. Ray >= 2.52 has it."""
    cluster = docs["RayService"]["spec"]["rayClusterConfig"]
    assert cluster["authOptions"] == {"mode": "token"}
    assert tuple(int(x) for x in cluster["rayVersion"].split(".")[:2]) >= (2, 52)
    for name, p in _pods(docs["RayService"]).items():
        env = _env(p["container"])
        assert env["RAY_AUTH_MODE"] == {"name": "RAY_AUTH_MODE", "value": "token"}, name
        assert "RAY_AUTH_TOKEN" not in env, name  # the operator's Secret, never a value here


def test_no_service_exposes_ray_outside_the_cluster(docs):
    """No LoadBalancer or NodePort anywhere, the head Service ClusterIP, no Ingress for the head:
    Ray's ports (dashboard, GCS, Ray client, metrics) never leave the cluster."""
    text = MANIFEST.read_text()
    assert "LoadBalancer" not in text and "NodePort" not in text
    assert not {"Service", "Ingress", "Route", "HTTPRoute", "Gateway"} & set(docs)
    spec = docs["RayService"]["spec"]
    assert "serveService" not in spec  # KubeRay's default: ClusterIP, the serve port only
    head = spec["rayClusterConfig"]["headGroupSpec"]
    assert head["serviceType"] == "ClusterIP" and head["enableIngress"] is False


def test_network_policy_admits_only_ray_pods_to_ray_ports(docs):
    """One NetworkPolicy over every Ray pod: any port from the other Ray pods; from outside them
    only the dashboard for the KubeRay operator, the metrics port for Prometheus, and the Serve
    HTTP port for anyone (the serve Service and what fronts it). GCS and the Ray client port are
    in no rule that admits anyone else."""
    policies = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "NetworkPolicy"]
    ray_pol = [p for p in policies if p["spec"]["podSelector"]["matchLabels"] == kuberay.POD_LABELS]
    assert len(ray_pol) == 1, policies
    spec = ray_pol[0]["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for name, p in _pods(docs["RayService"]).items():  # the policy selects every Ray pod
        assert kuberay.POD_LABELS.items() <= p["group"]["template"]["metadata"]["labels"].items(), name
    ray_pods = {"podSelector": {"matchLabels": kuberay.POD_LABELS}}
    serve_port = _serve(docs)["http_options"]["port"]
    others: dict[int, list] = {}
    for rule in spec["ingress"]:
        sources = rule.get("from")
        if sources == [ray_pods]:
            assert "ports" not in rule  # Ray pods among themselves: every port
            continue
        assert rule.get("ports"), rule  # anyone else: named ports only
        for port in rule["ports"]:
            assert port["protocol"] == "TCP"
            others.setdefault(port["port"], []).append(sources)
    assert set(others) == {kuberay.DASHBOARD_PORT, kuberay.METRICS_PORT, serve_port}, others
    assert others[serve_port] == [None]  # the API: from anywhere, guarded by its keys
    (operator,) = others[kuberay.DASHBOARD_PORT]
    assert operator == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app.kubernetes.io/name": "kuberay-operator"}}}
    ]
    (prometheus,) = others[kuberay.METRICS_PORT]
    assert prometheus[0]["podSelector"]["matchLabels"] == kuberay.PROMETHEUS_LABELS
    assert prometheus[0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": kuberay.PROMETHEUS_NAMESPACE
    }
    for port in (kuberay.GCS_PORT, kuberay.CLIENT_PORT):
        assert port not in others
    # The head's named ports are the ones the operator and KubeRay's head Service use.
    head_ports = {x["name"]: x["containerPort"] for x in _pods(docs["RayService"])["head"]["container"]["ports"]}
    assert head_ports["dashboard"] == kuberay.DASHBOARD_PORT and head_ports["serve"] == serve_port
    assert head_ports["metrics"] == kuberay.METRICS_PORT
    # The PodMonitor scrapes the port Prometheus is admitted to.
    assert docs["PodMonitor"]["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"


def test_voices_in_redis_admitted_only_from_ray_pods(docs):
    """Custom voices in the operator's Redis (an Ingress pod's directory dies with the pod and is
    not shared), the voice limits kept; the response cache in the same Redis only if the config
    says redis; a NetworkPolicy admits to the Redis pods only the Ray pods."""
    from serve_app.settings import AppConfig

    args = AppConfig.model_validate(chattts_args(_serve(docs)))
    assert args.voices.backend == "redis" and args.voices.path is None
    assert args.voices.redis_url == f"redis://{kuberay.REDIS_SERVICE}:{kuberay.REDIS_PORT}/{kuberay.VOICES_DB}"
    gpu = chattts_args(yaml.safe_load(GPU_CONFIG.read_text()))
    assert args.cache.backend == (gpu.get("cache") or {}).get("backend", "memory")
    if args.cache.backend == "redis":
        assert args.cache.redis_url == f"redis://{kuberay.REDIS_SERVICE}:{kuberay.REDIS_PORT}/{kuberay.CACHE_DB}"
    policies = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d["kind"] == "NetworkPolicy"]
    (redis,) = [p for p in policies if p["spec"]["podSelector"]["matchLabels"] == kuberay.REDIS_LABELS]
    assert redis["spec"]["policyTypes"] == ["Ingress"]
    assert redis["spec"]["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": kuberay.POD_LABELS}}],
            "ports": [{"protocol": "TCP", "port": kuberay.REDIS_PORT}],
        }
    ]


def test_for_kubernetes_overrides_only_what_it_must():
    """A config that says otherwise still gets a manifest that fails closed: auth required (in a
    live Ingress user_config too), voices moved to Redis with their limits kept, a Redis cache
    pointed at the service's Redis; a memory cache and everything else untouched."""
    serve = {
        "applications": [
            {
                "name": "chattts",
                "args": {
                    "ingress": {"max_input_chars": 100, "security": {"auth": "optional", "max_priority": 3}},
                    "voices": {"backend": "directory", "path": "/data/voices", "max_voices": 5},
                    "cache": {"backend": "redis", "redis_url": "redis://elsewhere:6379/4", "ttl_s": 60},
                },
                "deployments": [
                    {"name": "Ingress", "user_config": {"security": {"cors_origins": ["https://a.example"]}}},
                    {"name": "Vocoder", "user_config": {"x": 1}},
                ],
            }
        ]
    }
    out = kuberay.for_kubernetes(serve)
    args = out["applications"][0]["args"]
    assert args["ingress"] == {"max_input_chars": 100, "security": {"auth": "required", "max_priority": 3}}
    assert args["voices"] == {
        "backend": "redis",
        "redis_url": f"{kuberay.REDIS_URL}/{kuberay.VOICES_DB}",
        "max_voices": 5,
    }
    assert args["cache"] == {"backend": "redis", "redis_url": f"{kuberay.REDIS_URL}/{kuberay.CACHE_DB}", "ttl_s": 60}
    deps = {d["name"]: d for d in out["applications"][0]["deployments"]}
    assert deps["Ingress"]["user_config"]["security"] == {"cors_origins": ["https://a.example"], "auth": "required"}
    assert deps["Vocoder"]["user_config"] == {"x": 1}
    assert serve["applications"][0]["args"]["ingress"]["security"]["auth"] == "optional"  # the input is not modified
    memory = kuberay.for_kubernetes({"applications": [{"name": "chattts", "args": {"cache": {"backend": "memory"}}}]})
    assert memory["applications"][0]["args"]["cache"] == {"backend": "memory"}


def test_front_guard_in_every_proxy(docs):
    """Every Ray container (a proxy runs on every node with proxy_location: EveryNode) installs the
    front guard through Ray's proxy hook, and the import path names the guard's Ray callback."""
    from ray._common.utils import import_attr

    from deployments.proxy.front_guard import middlewares
    from serve_app.settings import HOOK_ENV, IMPORT_PATH

    assert import_attr(IMPORT_PATH) is middlewares
    for name, p in _pods(docs["RayService"]).items():
        assert _env(p["container"])[HOOK_ENV] == {"name": HOOK_ENV, "value": IMPORT_PATH}, name
