"""A multi-node Ray cluster on this one host, made of ``ray start`` processes (the cluster tests,
tests/system/test_cluster.py; the Serve config they deploy on it: tests/support/configs.py).

A head node (CPUs, no GPU, the dashboard, Serve's controller and proxy) and worker nodes that
each declare one GPU (``--num-gpus 1``) without having one: Ray schedules by declared resources,
and torch runs the Acoustic replicas there on the CPU. Every node is a ``ray start --block``
child in its own process group, carries a marker in its environment (so are the processes it
starts: raylet, agents, workers) and gets its own ports, so several nodes share the host and the
cluster never touches another Ray running on it. ``kill_worker`` SIGKILLs one node's processes
(a machine that dies); ``stop`` ends all of them. Nothing here runs ``ray stop``, which would
end every Ray on the host. Each node is a ``ManagedProcess`` (bench/lib/procs.py) with a marker.
"""

from __future__ import annotations

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

from .procs import MARKER_ENV, REPO_ROOT, ManagedProcess, child_env, free_port, kill_marked
from .waiting import wait_until

HEAD_RESOURCE = "head_only"  # a custom resource only the head declares
APP = "chattts"
HTTP_ERRORS = (httpx.HTTPError, ValueError, KeyError)  # the dashboard still starting, or busy: not yet


def cli(name: str) -> str:
    """Ray's command-line tools (``ray``, ``serve``) next to this interpreter."""
    return str(Path(sys.executable).with_name(name))


class Node(ManagedProcess):
    """One ``ray start --block`` process, marked: ``kill()`` takes every process of the node."""

    def __init__(self, name: str, argv: list[str], env: dict, log_path: Path):
        super().__init__(name, argv, log_path, env=env, marker=env[MARKER_ENV])
        self.metrics_port = int(next(a for a in argv if a.startswith("--metrics-export-port=")).split("=")[1])
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
        """Environment of the nodes (and of ``serve`` CLI calls): this repo (and tests/, for their
        apps) importable, no Ray setting of this process's. Metrics reach each node's Prometheus
        endpoint every second (Ray's default: 10 s), so a test of the policy's gauge sees current
        values."""
        return child_env(
            own_ray=True,
            PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(REPO_ROOT / "tests")]),
            RAY_metrics_report_interval_ms="1000",
            **self._extra_env,
            **({MARKER_ENV: marker} if marker else {}),
        )

    def _node_args(self) -> list[str]:
        """A node's own ports (several nodes share the host), loopback, the process blocking."""
        ports = ("metrics-export", "dashboard-agent-listen", "dashboard-agent-grpc", "runtime-env-agent")
        own = [f"--{name}-port={free_port()}" for name in ports]
        return ["--node-ip-address=127.0.0.1", *own, "--min-worker-port=0", "--max-worker-port=0", "--block"]

    def start(self, timeout_s: float = 180.0) -> float:
        t0 = time.monotonic()
        head = [
            cli("ray"),
            "start",
            "--head",
            f"--port={self.gcs_port}",
            f"--num-cpus={self.head_cpus}",
            "--num-gpus=0",
        ]
        head += [
            f"--resources={json.dumps({HEAD_RESOURCE: 1000})}",
            "--include-dashboard=true",
            "--disable-usage-stats",
        ]
        head += ["--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}", f"--temp-dir={self.root}"]
        head += [f"--ray-client-server-port={free_port()}", *self._node_args()]
        self._join(Node("head", head, self.env(f"{self.id}-head"), self.root / "head.log"), timeout_s)
        for _ in range(self.workers):
            self.add_worker(timeout_s)
        return time.monotonic() - t0

    def add_worker(self, timeout_s: float = 180.0, cpus: Optional[float] = None, gpus: Optional[int] = None) -> Node:
        """A worker of the cluster's shape, or of ``cpus`` / ``gpus`` (a CPU-group node: ``gpus=0``)."""
        i = len(self.nodes)
        cpus, gpus = (self.worker_cpus if cpus is None else cpus), (self.worker_gpus if gpus is None else gpus)
        argv = [cli("ray"), "start", f"--address={self.address}", f"--num-cpus={cpus:g}", f"--num-gpus={gpus}"]
        argv += ["--disable-usage-stats", *self._node_args()]
        return self._join(
            Node(f"worker{i}", argv, self.env(f"{self.id}-w{i}"), self.root / f"worker{i}.log"), timeout_s
        )

    def _join(self, node: Node, timeout_s: float) -> Node:
        """Wait until ``node`` is alive in the GCS; nodes join one at a time, so its id is the new one."""
        known = {n.node_id for n in self.nodes}
        self.nodes.append(node)

        def new() -> list[str]:
            if not node.alive():
                raise RuntimeError(f"{node.name} exited: {node.log_tail(40)}")
            return [x["node_id"] for x in self.list_nodes() if x["state"] == "ALIVE" and x["node_id"] not in known]

        node.node_id = wait_until(new, timeout_s, 1.0, what=f"{node.name} alive", retry_on=HTTP_ERRORS)[0]
        return node

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
            [cli("serve"), *args, "--address", self.dashboard_url],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            cwd=REPO_ROOT,
        )

    def deploy(self, cfg: dict, name: str) -> subprocess.CompletedProcess:
        """``serve deploy`` of ``cfg``, written as ``<name>.yaml`` in the cluster's directory."""
        path = self.root / f"{name}.yaml"
        path.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return self.serve("deploy", str(path))

    def session_logs(self) -> Path:
        return self.root / "session_latest" / "logs"

    def head_metrics(self) -> str:
        r = httpx.get(f"http://127.0.0.1:{self.nodes[0].metrics_port}/metrics", timeout=10, trust_env=False)
        r.raise_for_status()
        return r.text
