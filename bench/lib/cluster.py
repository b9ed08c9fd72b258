"""A multi-node Ray cluster on this one host, made of ``ray start`` processes, for the cluster tests
(tests/system/test_cluster.py) and ``python -m bench autoscale``.

A head node (CPUs, no GPU, the dashboard, Serve's controller and proxy) and worker nodes that
each declare one GPU (``--num-gpus 1``) without having one: Ray schedules by declared resources,
and torch runs the Acoustic replicas there on the CPU. Every node is a ``ray start --block``
child in its own process group, carries a marker in its environment (so are the processes it
starts: raylet, agents, workers) and gets its own ports, so several nodes share the host and the
cluster never touches another Ray running on it. ``kill_worker`` SIGKILLs one node's processes
(a machine that dies); ``stop`` ends all of them. Nothing here runs ``ray stop``, which would
end every Ray on the host. Each node is a ``ManagedProcess`` (bench/lib/procs.py) with a marker.

``cluster_config`` derives the Serve config the tests and the benchmark deploy from
config/serve.gpu.yaml: tiny random weights on the CPU, small bounds, short delays, the proxy on the
head only (one HTTP port per host), and by default the CPU stages pinned to the head (``head_only``
resource) so a killed GPU node takes only Acoustic replicas with it; ``pin_cpu_stages=False``
keeps the GPU config's CPU stages as shipped (resources, autoscaling, ``max_replicas_per_node``),
free to land on the GPU nodes.
"""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Optional

import httpx
import yaml

from .procs import MARKER_ENV, REPO_ROOT, ManagedProcess, free_port, kill_marked
from .serve import GPU_CONFIG, get_path, set_path

HEAD_RESOURCE = "head_only"  # a custom resource only the head declares
APP = "chattts"


def ray_exe() -> str:
    return str(Path(sys.executable).with_name("ray"))


def serve_exe() -> str:
    return str(Path(sys.executable).with_name("serve"))


class Node(ManagedProcess):
    """One ``ray start --block`` process, marked: ``kill()`` takes every process of the node."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path):
        super().__init__(name, argv, log_path, env=env, marker=env[MARKER_ENV])
        self.metrics_port = int(argv[argv.index("--metrics-export-port") + 1])
        self.node_id: Optional[str] = None


class LocalCluster:
    """``start()`` a head and ``workers`` GPU-declaring nodes; ``stop()`` ends them all."""

    def __init__(
        self,
        workers: int = 2,
        head_cpus: int = 4,
        worker_cpus: int = 2,
        worker_gpus: int = 1,
        root: Optional[Path] = None,
        env: Optional[dict] = None,
    ):
        self.workers = workers
        self.head_cpus, self.worker_cpus, self.worker_gpus = head_cpus, worker_cpus, worker_gpus
        # Short: Ray's socket paths under it must fit in 107 bytes.
        self.root = Path(root or tempfile.mkdtemp(prefix="rc", dir="/tmp"))
        self.id = uuid.uuid4().hex[:12]
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        self.address = f"127.0.0.1:{self.gcs_port}"
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.nodes: list[Node] = []
        self._extra_env = dict(env or {})

    # ------------------------------------------------------------------ lifecycle

    def env(self, marker: str = "") -> dict:
        """Environment of the nodes (and of ``serve`` CLI calls): this repo importable, no outside
        Ray address, no auth prompt."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(
            RAY_AUTH_MODE="disabled",
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]),
            TOKENIZERS_PARALLELISM="false",
            PYTHONUNBUFFERED="1",
        )
        env.pop("CHATTTS_WEIGHTS", None)
        env.pop("CHATTTS_WEIGHTS_PATH", None)
        # Metrics reach each node's Prometheus endpoint every second (Ray's default: 10 s), so a
        # per-second timeline and a test of the policy's gauge see current values.
        env["RAY_metrics_report_interval_ms"] = "1000"
        env.update(self._extra_env)
        if marker:
            env[MARKER_ENV] = marker
        return env

    def _node_ports(self) -> list[str]:
        return [
            "--node-ip-address",
            "127.0.0.1",
            "--metrics-export-port",
            str(free_port()),
            "--dashboard-agent-listen-port",
            str(free_port()),
            "--dashboard-agent-grpc-port",
            str(free_port()),
            "--runtime-env-agent-port",
            str(free_port()),
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
            "--disable-usage-stats",
            "--block",
        ]

    def start(self, timeout_s: float = 180.0) -> float:
        t0 = time.monotonic()
        head = [
            ray_exe(),
            "start",
            "--head",
            "--port",
            str(self.gcs_port),
            "--num-cpus",
            str(self.head_cpus),
            "--num-gpus",
            "0",
            "--resources",
            json.dumps({HEAD_RESOURCE: 1000}),
            "--include-dashboard",
            "true",
            "--dashboard-host",
            "127.0.0.1",
            "--dashboard-port",
            str(self.dashboard_port),
            "--temp-dir",
            str(self.root),
            "--ray-client-server-port",
            str(free_port()),
            *self._node_ports(),
        ]
        self._join(Node("head", head, self.env(f"{self.id}-head"), self.root / "head.log"), timeout_s)
        for _ in range(self.workers):
            self.add_worker(timeout_s)
        return time.monotonic() - t0

    def add_worker(self, timeout_s: float = 180.0, cpus: Optional[float] = None, gpus: Optional[int] = None) -> Node:
        """A worker of the cluster's shape, or of ``cpus`` / ``gpus`` (a CPU-group node: ``gpus=0``)."""
        i = len(self.nodes)
        cpus, gpus = (self.worker_cpus if cpus is None else cpus), (self.worker_gpus if gpus is None else gpus)
        argv = [
            ray_exe(),
            "start",
            "--address",
            self.address,
            "--num-cpus",
            f"{cpus:g}",
            "--num-gpus",
            str(gpus),
            *self._node_ports(),
        ]
        return self._join(
            Node(f"worker{i}", argv, self.env(f"{self.id}-w{i}"), self.root / f"worker{i}.log"), timeout_s
        )

    def _join(self, node: Node, timeout_s: float) -> Node:
        """Wait until ``node`` is alive in the GCS; nodes join one at a time, so its id is the new one."""
        known = {n.node_id for n in self.nodes}
        self.nodes.append(node)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if node.proc.poll() is not None:
                raise RuntimeError(f"{node.name} exited: {(self.root / (node.name + '.log')).read_text()[-2000:]}")
            try:
                new = [x["node_id"] for x in self.list_nodes() if x["state"] == "ALIVE" and x["node_id"] not in known]
            except (httpx.HTTPError, ValueError, KeyError):
                new = []
            if new:
                node.node_id = new[0]
                return node
            time.sleep(1.0)
        raise TimeoutError(f"{node.name} not alive within {timeout_s:g} s")

    def node(self, node_id: str) -> Node:
        return next(n for n in self.nodes if n.node_id == node_id)

    def kill_worker(self, node: Node) -> int:
        return node.kill()

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every node at once, then SIGKILL what is left after ``grace_s`` (a raylet
        would otherwise drain for up to 30 s; nothing here needs that)."""
        for node in self.nodes:
            if node.alive():
                node.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for node in self.nodes:
            node.wait(max(0.1, deadline - time.monotonic()))
        kill_marked(*(node.marker for node in self.nodes))
        for node in self.nodes:
            node.wait(10)
            node.close()

    # ------------------------------------------------------------------ state through the dashboard (no ray.init here)

    def _get(self, path: str, timeout: float = 15.0) -> Any:
        r = httpx.get(self.dashboard_url + path, timeout=timeout, trust_env=False)
        r.raise_for_status()
        return r.json()

    def list_nodes(self) -> list[dict]:
        return self._get("/api/v0/nodes?limit=100&detail=true")["data"]["result"]["result"]

    def serve_details(self) -> dict:
        return self._get("/api/serve/applications/")

    def replicas(self, deployment: str, app: str = APP, states: Optional[tuple] = ("RUNNING",)) -> list[dict]:
        """Replicas of a deployment as Serve's REST API lists them (replica_id, state, node_id, actor_id,
        pid), those in ``states`` (None: all, pending and stopping ones included)."""
        apps = self.serve_details().get("applications") or {}
        deps = (apps.get(app) or {}).get("deployments") or {}
        return [r for r in (deps.get(deployment) or {}).get("replicas", []) if states is None or r["state"] in states]

    def serve(self, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
        """The ``serve`` CLI against this cluster's dashboard (``serve deploy``, ``serve status``)."""
        return subprocess.run(
            [serve_exe(), *args, "--address", self.dashboard_url],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REPO_ROOT,
        )

    def session_logs(self) -> Path:
        return self.root / "session_latest" / "logs"

    def head_metrics(self) -> str:
        r = httpx.get(f"http://127.0.0.1:{self.nodes[0].metrics_port}/metrics", timeout=10, trust_env=False)
        r.raise_for_status()
        return r.text


# ---------------------------------------------------------------------- the deployed config


def cluster_config(
    *,
    port: int,
    weights_cache: Optional[str] = None,
    max_rows: int = 4,
    target_fill: float = 0.5,
    acoustic_bounds: tuple[int, int] = (1, 3),
    upscale_delay_s: float = 2.0,
    downscale_delay_s: float = 6.0,
    look_back_period_s: float = 3.0,
    pin_cpu_stages: bool = True,
    extra_apps: Optional[list[dict]] = None,
    base: Path = GPU_CONFIG,
) -> dict:
    """config/serve.gpu.yaml for the local cluster.

    Kept from the GPU config: the graph, the Acoustic policy and its resources (num_gpus 0.5,
    num_cpus 1: two replicas per GPU node), the user_config, the drain timeouts. Changed: tiny random
    weights on the CPU in float32 (torch has no GPU here) from ``weights_cache`` (None: the default
    cache directory, which the nodes inherit from this environment), one torch thread, ``max_rows`` and
    ``target_fill`` small enough that a few streams ask for several replicas, delays and the
    metrics push interval in seconds instead of minutes, one replica of each CPU stage pinned to the
    head (``pin_cpu_stages``; else the CPU stages as shipped), the proxy on the head only, loopback
    HTTP on ``port`` without API keys (``auth: optional``).
    """
    cfg = yaml.safe_load(base.read_text())
    cfg["proxy_location"] = "HeadOnly"  # only one node per host can bind the HTTP port
    cfg["http_options"] = {**cfg.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app = "applications.chattts"
    weights = {"source": "random-tiny", **({"cache_dir": weights_cache} if weights_cache else {})}
    set_path(cfg, f"{app}.args.model", {"weights": weights, "device": "cpu", "dtype": "float32", "torch_threads": 1})
    set_path(cfg, f"{app}.args.acoustic.max_rows", max_rows)
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
        upscale_delay_s=upscale_delay_s,
        downscale_delay_s=downscale_delay_s,
        look_back_period_s=look_back_period_s,
        # How often replicas push their stats to the controller (Serve's default 10 s).
        metrics_interval_s=1.0,
    )
    auto["policy"]["policy_kwargs"] = {"target_fill": target_fill}
    set_path(cfg, f"{acoustic}.autoscaling_config", auto)
    cfg["applications"] += copy.deepcopy(extra_apps or [])
    return cfg


def write_config(cfg: dict, path: Path) -> Path:
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path
