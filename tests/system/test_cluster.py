"""The app on a multi-node Ray cluster on this host: a head (2 CPUs) and two worker nodes that each
declare the GPU node shape config/serve.gpu.yaml is sized for, 8 CPUs and one GPU (bench/lib/cluster.py),
the Serve config derived from config/serve.gpu.yaml (tiny random weights on the CPU, small bounds,
delays of seconds), deployed with ``serve deploy``.

One cluster for the whole module (the last test adds a CPU-only node, as a CPU group would). It is a
separate Ray made of ``ray start`` processes with its own ports and temp dir, driven only through
HTTP, Serve's REST API and the ``serve`` CLI: this process never calls ``ray.init``, so the session's local Ray of the other Serve tests
(support.app.ray_session) can run before, after or beside it, and neither can attach to the
other. Marker ``cluster`` (deselect with ``-m "not cluster"``).

The tests run in file order and each leaves the cluster as the next one expects.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
import re
import shutil
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from support import configs
from support.audio import snr_db
from support.configs import cluster_config
from support.report import report
from support.step_load import StepLoad, complete, stall_s
from support.waiting import wait_until, wait_until_async

from bench.lib.cluster import HTTP_ERRORS, LocalCluster
from bench.lib.config import get_path, set_path
from bench.lib.corpus import ONE_ROW_TEXTS, expected_pcm_bytes
from bench.lib.procs import REPO_ROOT as REPO
from bench.lib.procs import free_port
from bench.lib.serve import wait_ready
from deployments.kuberay import GPU_POD, cpu_pod
from serve_app.engine.wav import with_true_length

FAILOVER_BOUNDS = (2, 2)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

CALLER_APP = {
    "name": "caller",
    "route_prefix": "/caller",
    "import_path": "support.cluster_apps:caller",
    "deployments": [{"name": "Caller", "ray_actor_options": {"num_cpus": 0.1, "resources": {"head_only": 1}}}],
}
BOUNDS = (1, 3)  # 3 > 2 GPUs: the third replica must share a GPU
SEGMENTS = "applications.chattts.args.segments"
ACOUSTIC = "applications.chattts.deployments.Acoustic"
DEPLOYMENTS = "applications.chattts.deployments"
CPU_STAGES = ("Ingress", "TextNormalizer", "Vocoder")


class App:
    def __init__(self, cluster: LocalCluster, port: int, weights_cache: str, root: Path):
        self.cluster = cluster
        self.url = f"http://127.0.0.1:{port}"
        self.port = port
        self.weights_cache = weights_cache
        self.root = root

    def config(self, **kw) -> dict:
        kw.setdefault("acoustic_bounds", BOUNDS)
        return cluster_config(port=self.port, weights_cache=self.weights_cache, extra_apps=[CALLER_APP], **kw)

    def deploy(self, cfg: dict, name: str) -> float:
        """``serve deploy`` the config; wait until both apps run with healthy deployments."""
        t0 = time.monotonic()
        out = self.cluster.deploy(cfg, name)
        assert out.returncode == 0, out.stderr[-3000:]

        def settled() -> bool:
            apps = self.cluster.serve_details().get("applications") or {}
            return {"chattts", "caller"} <= set(apps) and all(
                a["status"] == "RUNNING" and all(d["status"] == "HEALTHY" for d in a["deployments"].values())
                for a in apps.values()
            )

        wait_until(
            settled, 300, 0.5, what=f"serve deploy {name}: apps RUNNING, deployments HEALTHY", retry_on=HTTP_ERRORS
        )
        return time.monotonic() - t0

    def acoustic(self, states=("RUNNING",)) -> list[dict]:
        return self.cluster.replicas("Acoustic", states=states)

    def placements(self) -> dict[str, dict]:
        """replica id -> what the replica logged about itself (node, actor, GPU ids Ray gave it)."""
        out = {}
        for f in (self.cluster.session_logs() / "serve").glob("replica_chattts_Acoustic_*.log"):
            for line in f.read_text(errors="replace").splitlines():
                if "Acoustic placement {" in line:
                    p = json.loads(line[line.index("{") :])
                    out[p["replica"]] = p
        return out


@pytest.fixture(scope="module")
def app(request, chattts_cache_dir) -> App:
    cluster = LocalCluster(workers=2, head_cpus=2, worker_cpus=GPU_POD["cpu"], worker_gpus=GPU_POD["gpu"])
    failed_before = request.session.testsfailed
    try:
        start_s = cluster.start()
        port = free_port()
        a = App(cluster, port, str(chattts_cache_dir), cluster.root)
        ready_s = a.deploy(a.config(), "base")
        wait_ready(a.url, 300)
        report("cluster: head + 2 GPU nodes started", f"{start_s:.1f} s")
        report("cluster: serve deploy to apps running", f"{ready_s:.1f} s")
        yield a
    finally:
        cluster.stop(grace_s=2)  # nothing to drain: the raylets' 30 s drain would only be waited out
        if request.session.testsfailed == failed_before:
            shutil.rmtree(cluster.root, ignore_errors=True)  # kept (logs) when a test failed


def _gpu_nodes(cluster: LocalCluster, alive: bool = False) -> set[str]:
    return {
        n["node_id"]
        for n in cluster.list_nodes()
        if n["resources_total"].get("GPU", 0) >= 1 and (not alive or n["state"] == "ALIVE")
    }


def test_handle_call_from_another_serve_application(app):
    """The ``caller`` app reaches ``chattts`` only through DeploymentHandles (synthesize and stream)."""
    body = {"input": "你好，世界。", "response_format": "wav"}
    r = httpx.post(app.url + "/caller/synthesize", json=body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    out = r.json()
    whole, streamed = base64.b64decode(out["whole"]), base64.b64decode(out["stream"])
    pcm = expected_pcm_bytes((body["input"],), get_path(app.config(), SEGMENTS))[body["input"]]
    assert whole[:4] == b"RIFF" and len(whole) == 44 + pcm, len(whole)  # a header and exactly the planned audio
    # A stream's header says "unknown" sizes (it starts before its length is known); with its
    # true length it is the whole answer's header.
    assert out["stream_pieces"] >= 1 and with_true_length(streamed)[:44] == whole[:44] and len(streamed) == len(whole)
    # Same tokens, so the same audio; not always the same bytes: this config sends early chunks
    # when the engine's pace would let a listener run dry (listener_margin_s), and on this busy
    # box the two calls' chunks can fall differently, which moves only the vocoder's seams.
    a, b = (np.frombuffer(x[44:], dtype="<i2").astype(np.float64) for x in (whole, streamed))
    assert snr_db(a, b) >= 30.0, snr_db(a, b)


def _wait_acoustic(app: App, n: int, timeout_s: float, what: str) -> list[dict]:
    """Exactly ``n`` Acoustic replicas running and none on its way up (pending or starting).

    Stopping ones are let be: a replica that never got a node (its GPU share was not free) and is
    then scaled down stays STOPPING for ``graceful_shutdown_timeout_s`` - Serve queues its graceful
    shutdown call on an actor that never started and waits out the timeout (docs/operations.md)."""

    def probe() -> list[dict]:
        live = app.acoustic(states=None)
        running = [r for r in live if r["state"] == "RUNNING"]
        coming = [r for r in live if r["state"] not in ("RUNNING", "STOPPING")]
        return running if len(running) == n and not coming else []

    return wait_until(probe, timeout_s, 0.5, what=what, retry_on=HTTP_ERRORS)


async def _acoustic_target(cluster: LocalCluster) -> int:
    deps = (await asyncio.to_thread(cluster.serve_details))["applications"]["chattts"]["deployments"]
    return deps["Acoustic"]["target_num_replicas"]


async def test_step_load_scales_acoustic_across_gpu_nodes_and_back(app):
    """1 replica -> 3 under a step of load (two share one GPU node's GPU) -> 1 when it falls, every
    request answered 200 with all its audio, and a replica removed while streaming drains first."""
    cluster = app.cluster
    cfg = app.config()
    auto = get_path(cfg, f"{ACOUSTIC}.autoscaling_config")
    expected = expected_pcm_bytes(ONE_ROW_TEXTS, get_path(cfg, SEGMENTS))
    assert len(app.acoustic()) == 1
    async with StepLoad(app.url) as load:
        load.set_clients(6)  # 6 one-row streams / (0.5 fill * 4 rows) -> 3 replicas
        t_step = load.clock()
        await wait_until_async(
            lambda: _acoustic_target(cluster),
            60,
            0.5,
            until=lambda n: n >= 2,
            what="the policy raising Acoustic's target",
        )
        decided_s = load.clock() - t_step
        peak = await asyncio.to_thread(_wait_acoustic, app, 3, 240, "3 Acoustic replicas running")
        running_s = load.clock() - t_step
        placements = app.placements()
        metrics = await asyncio.to_thread(cluster.head_metrics)
        load.set_clients(2)  # 2 rows -> 1 replica, with streams open on the ones removed
        t_down = load.clock()
        await asyncio.to_thread(_wait_acoustic, app, 1, 240, "back to 1 Acoustic replica")
        down_s = load.clock() - t_down
        await load.stop()

    # Scaled within the configured delays (plus a push interval and the look-back to see the load).
    slack = auto["upscale_delay_s"] + auto["look_back_period_s"] + auto["metrics_interval_s"] + 5
    assert decided_s <= slack, f"target raised {decided_s:.1f} s after the step (allowed {slack:g} s)"
    report(
        "cluster: load step -> Acoustic target raised / 3 replicas running", f"{decided_s:.1f} s / {running_s:.1f} s"
    )
    report(
        "cluster: load fall -> back to 1 replica", f"{down_s:.1f} s (downscale_delay_s {auto['downscale_delay_s']:g})"
    )

    # Placement: only on GPU nodes; 3 replicas on 2 GPUs, so two share one node's GPU (0.5 each).
    gpu_nodes = _gpu_nodes(cluster)
    assert {r["node_id"] for r in peak} <= gpu_nodes
    per_node = collections.Counter(r["node_id"] for r in peak)
    assert sorted(per_node.values()) == [1, 2], per_node
    shared = [placements[r["replica_id"]] for r in peak if per_node[r["node_id"]] == 2]
    assert [p["gpu_ids"] for p in shared] == [["0"], ["0"]], shared
    assert all(placements[r["replica_id"]]["node_id"] == r["node_id"] for r in peak)
    report(
        "cluster: replica -> node -> GPU ids at the peak",
        "; ".join(f"{r['replica_id']} -> {r['node_id'][:8]} -> {placements[r['replica_id']]['gpu_ids']}" for r in peak),
    )

    # The decision is visible: the controller's gauge on the head node and its Serve log.
    desired = [
        float(m.group(1))
        for m in re.finditer(r'ray_tts_autoscale_desired_replicas\{[^}]*deployment="Acoustic"[^}]*\} (\S+)', metrics)
    ]
    assert desired and max(desired) >= 2, metrics[-2000:]
    dashboard = json.loads((REPO / "deploy" / "grafana" / "chattts-serve.json").read_text())
    panel_names = {
        m
        for p in dashboard["panels"]
        for t in p["targets"]
        for m in re.findall(r"\b(ray_tts_autoscale_[a-z_]+)", t["expr"])
    }
    assert panel_names and all(f"{m}{{" in metrics for m in panel_names), panel_names  # the dashboard's names are real
    logs = "".join(f.read_text(errors="replace") for f in (cluster.session_logs() / "serve").glob("controller_*.log"))
    assert re.search(r"autoscale Acoustic: .* -> desired [23] ", logs)

    # Nothing lost: every request 200 with all its audio, and a removed replica drained open streams.
    bad = [(r.status, r.error, r.audio_bytes, expected[r.text]) for r in load.records if not complete(r, expected)]
    assert not bad and len(load.records) >= 10, bad
    # Past one replica's real-time capacity a new stream is told to come back (503, Retry-After),
    # never queued to stall; the refusals are the demand that scales the deployment.
    assert set(load.refusals()) <= {"capacity_exhausted"} and len(load.refused) == len(load.refusals())
    # As their listeners hear them (1x from half a second after the first bytes): the median stream
    # smooth while the deployment scaled (2 cores carry the whole cluster here: some stall).
    stalls = sorted(stall_s(r) for r in load.records)
    assert stalls[len(stalls) // 2] <= 0.25, stalls
    drained = [
        f.name
        for f in (cluster.session_logs() / "serve").glob("replica_chattts_Acoustic_*.log")
        if re.search(r"to shut down: [1-9]\d* ongoing requests", f.read_text(errors="replace"))
    ]
    # Whether a removed replica still had a stream open when told to stop depends on timing (the
    # load's requests are short); when one did, the completeness check above covers its drain.
    report(
        "cluster: step load requests",
        f"{len(load.records)}, all complete ({len(load.refused)} answers 503 capacity_exhausted asked again); "
        f"stalls at 1x: {sum(1 for x in stalls if x <= 0.25)} smooth, median {stalls[len(stalls) // 2]:.2f} s, "
        f"worst {stalls[-1]:.2f} s; "
        f"replicas drained with open streams: {len(drained)}",
    )


async def test_killed_gpu_node_fails_only_its_streams_and_replicas_come_back(app):
    cluster = app.cluster
    # Two replicas, one per GPU node, and no more: a third under the load would find no free GPU
    # share once a node is gone, and a replica scaled away before it ever started stays STOPPING
    # for graceful_shutdown_timeout_s (docs/operations.md), holding up the next deploy.
    cfg = app.config(acoustic_bounds=FAILOVER_BOUNDS)
    app.deploy(cfg, "two-replicas")
    before = _wait_acoustic(app, 2, 240, "2 Acoustic replicas")
    victim = cluster.node(before[0]["node_id"])
    lost = {r["replica_id"] for r in before if r["node_id"] == victim.node_id}
    expected = expected_pcm_bytes(ONE_ROW_TEXTS, get_path(cfg, SEGMENTS))
    async with StepLoad(app.url) as load:
        load.set_clients(4)

        async def streaming() -> int:
            return sum(1 for r in load.records if r.t_first is not None and r.t_end is None)

        await wait_until_async(streaming, 120, 0.2, until=lambda n: n >= 4, what="4 streams with audio")
        t_kill0 = load.clock()
        await asyncio.to_thread(cluster.kill_worker, victim)  # every process of that node, SIGKILL
        t_kill = load.clock()  # all of them gone

        async def back() -> list[dict]:
            reps = await asyncio.to_thread(app.acoustic)
            return reps if len(reps) >= 2 and all(r["node_id"] != victim.node_id for r in reps) else []

        after = await wait_until_async(back, 240, 0.5, what="2 Acoustic replicas on the surviving node")
        back_s = load.clock() - t_kill
        t_back = load.clock()

        async def served_since_back() -> int:  # keep sending once they are back
            return sum(1 for r in load.records if r.t_send >= t_back and r.t_end is not None)

        await wait_until_async(
            served_since_back, 60, 0.2, until=lambda n: n >= 4, what="4 requests answered after the replicas came back"
        )
        await load.stop()

    open_at_kill = [r for r in load.records if r.t_send < t_kill0 and (r.t_end is None or r.t_end > t_kill0)]
    failed = [r for r in load.records if not complete(r, expected)]
    # Only requests open while the node died fail, and cleanly: a cut stream the client sees, or an
    # error status with an OpenAI body; none hangs (each ended within its timeout).
    assert all(r.t_send < t_kill for r in failed)
    for r in failed:
        assert r.error in ("RemoteProtocolError", "ReadError") or (r.status or 0) >= 500, (r.status, r.error)
    for status, body in load.error_bodies:
        assert status >= 500 and {"message", "type", "code"} <= set(json.loads(body)["error"]), (status, body)
    afterwards = [r for r in load.records if r.t_send >= t_kill]
    assert afterwards and all(complete(r, expected) for r in afterwards), [
        (r.status, r.error) for r in afterwards if not complete(r, expected)
    ]
    # The lost replicas came back on the surviving GPU node, sharing its GPU.
    placements = app.placements()
    assert not lost & {r["replica_id"] for r in after}
    assert {r["node_id"] for r in after} <= _gpu_nodes(cluster) - {victim.node_id}
    assert all(placements[r["replica_id"]]["gpu_ids"] == ["0"] for r in after)
    report(
        "cluster: GPU node killed",
        f"{len(lost)} of {len(before)} Acoustic replicas on it; "
        f"{len(failed)} of {len(open_at_kill)} streams open at the kill cut "
        f"({sorted({r.error or r.status for r in failed}, key=str)}), {len(afterwards)} requests sent afterwards all complete; "
        f"replicas back on the other node {back_s:.1f} s after the kill",
    )


def test_serve_deploy_of_a_user_config_change_restarts_nothing(app):
    """An Acoustic user_config change through ``serve deploy`` reconfigures the running replicas in
    place: the same replica ids, actors and processes before and after, and the new value live."""

    def replicas() -> dict[str, tuple]:
        apps = app.cluster.serve_details()["applications"]
        return {
            f"{name}/{d}/{r['replica_id']}": (r.get("actor_id"), r.get("actor_name"), r.get("pid"))
            for name, a in apps.items()
            for d, dep in a["deployments"].items()
            for r in dep["replicas"]
            if r["state"] == "RUNNING"
        }  # not one left STOPPING by the last test (see _wait_acoustic)

    cfg = app.config(acoustic_bounds=FAILOVER_BOUNDS)  # as the last test left it: only user_config changes
    _wait_acoustic(app, 2, 120, "the 2 Acoustic replicas of the last test, settled")
    before = replicas()
    acoustic_before = [v for k, v in before.items() if "/Acoustic/" in k]
    assert len(acoustic_before) == 2 and all(actor and pid for actor, _, pid in acoustic_before), before
    acoustic = get_path(cfg, ACOUSTIC)
    acoustic["user_config"] = {**acoustic["user_config"], "max_rows": 6}
    took = app.deploy(cfg, "user-config")
    assert replicas() == before
    for _ in range(6):  # both replicas (the handle picks one at random each time)
        stats = httpx.get(app.url + "/caller/acoustic", timeout=60).json()
        assert stats["config"]["max_rows"] == 6, stats["config"]
    status = app.cluster.serve("status")
    assert status.returncode == 0 and "RUNNING" in status.stdout
    report("cluster: serve deploy of a user_config change", f"{took:.1f} s, {len(before)} replicas kept")


async def test_cpu_stages_never_take_the_cpus_of_new_acoustic_replicas(app):
    """The GPU config's CPU stages as shipped (Vocoder num_cpus 2, not pinned to the head) with the
    Vocoder forced to 8 replicas, which would hold all 16 CPUs of the two GPU nodes: their
    max_replicas_per_node keeps 2 of each node's 8 CPUs for its two Acoustic replicas. First on GPU
    nodes only (the README's ``ray start`` cluster): the Vocoder takes its bound on each GPU node
    and the rest wait. Then a CPU group's node joins (the KubeRay manifest's CPU pod, no GPU): it
    takes the waiting ones up to the same bounds, the GPU nodes stay at theirs, and when the load
    makes the Acoustic policy ask for 4 the new replicas start beside the Vocoders.

    Last in the module: it leaves Vocoder replicas that never get a node, which Serve would hold
    STOPPING for graceful_shutdown_timeout_s at the next deploy (docs/operations.md). Alone (``-k``)
    it starts from the module's first deploy."""
    cluster = app.cluster
    t0 = time.monotonic()
    while len(_gpu_nodes(cluster, alive=True)) < 2:  # the kill test took one
        cluster.add_worker()  # in this thread: starting a node sets a signal handler
    gpu_nodes = _gpu_nodes(cluster, alive=True)
    # The shipped downscale delay: on this busy box the rows in the decode dip for seconds while
    # the streams wait on the other stages, and the module's 6 s would stop the new replicas while
    # they start (a starting replica told to stop keeps its GPU share until its shutdown times out).
    shipped = configs.load("gpu")
    auto = get_path(shipped, f"{ACOUSTIC}.autoscaling_config")
    cfg = app.config(acoustic_bounds=(2, 4), pin_cpu_stages=False, downscale_delay_s=auto["downscale_delay_s"])
    forced = 8
    set_path(cfg, f"{DEPLOYMENTS}.Vocoder.autoscaling_config.min_replicas", forced)
    deps = get_path(cfg, DEPLOYMENTS)
    opts = {d["name"]: d for d in deps}
    per_node = {n: opts[n]["max_replicas_per_node"] for n in CPU_STAGES}
    old = {r["replica_id"] for n in CPU_STAGES for r in cluster.replicas(n, states=None)}
    out = await asyncio.to_thread(cluster.deploy, cfg, "cpu-stages")
    assert out.returncode == 0, out.stderr[-3000:]

    def running_per_node() -> dict[str, collections.Counter]:
        """node -> CPU-stage replicas of the new version RUNNING there. The old Vocoder replica
        stays on the head: Serve replaces an outdated replica once the new ones reach the target,
        which this one never does."""
        return {
            n: collections.Counter(r["node_id"] for r in cluster.replicas(n) if r["replica_id"] not in old)
            for n in CPU_STAGES
        }

    def placed_on(workers: set[str]):
        """Every CPU stage up, and the Vocoder at its per-node bound on each of ``workers`` (it asked for more)."""
        return lambda running: (
            all(running[n] for n in CPU_STAGES)
            and all(running["Vocoder"][node] == per_node["Vocoder"] for node in workers)
        )

    def unplaced() -> int:
        return sum(1 for r in cluster.replicas("Vocoder", states=None) if not r.get("node_id"))

    await asyncio.to_thread(
        wait_until,
        running_per_node,
        300,
        0.5,
        until=placed_on(gpu_nodes),
        what="GPU nodes only: the CPU stages placed, the Vocoder at its bound on each GPU node",
    )
    waiting = await asyncio.to_thread(unplaced)
    assert waiting >= per_node["Vocoder"] + 1, waiting  # the bounds left them nowhere to go
    placed_s = time.monotonic() - t0

    # The CPU group: a node of the KubeRay CPU pod's shape joins and takes what waited, within the bounds.
    cpu_cpus = cpu_pod(shipped)["cpu"]
    cpu_node = cluster.add_worker(cpus=cpu_cpus, gpus=0).node_id  # in this thread, as above
    workers = gpu_nodes | {cpu_node}
    await asyncio.to_thread(
        wait_until,
        running_per_node,
        300,
        0.5,
        until=placed_on(workers),
        what="with a CPU group: the Vocoder at its bound on the CPU node too",
    )
    left = await asyncio.to_thread(unplaced)
    assert left == waiting - per_node["Vocoder"] and left >= 1, (waiting, left)  # still asks for more
    await asyncio.to_thread(_wait_acoustic, app, 2, 240, "2 Acoustic replicas (min_replicas)")
    await asyncio.to_thread(wait_ready, app.url, 240)
    cpu_group_s = time.monotonic() - t0 - placed_s

    expected = expected_pcm_bytes(ONE_ROW_TEXTS, get_path(cfg, SEGMENTS))
    async with StepLoad(app.url) as load:
        load.set_clients(8)  # 8 one-row streams / (0.5 fill * 4 rows) -> 4 replicas: every half-GPU
        t_step = load.clock()
        await wait_until_async(
            lambda: _acoustic_target(cluster), 120, 0.5, until=lambda n: n >= 4, what="the policy asking for 4 Acoustic"
        )
        # Asked: the shipped downscale delay (minutes) holds the target while two clients keep
        # streaming. The full load would only starve the new replicas' start on these 2 cores
        # (seen: 80 s before their process ran, 160 s to RUNNING, under all 8).
        load.set_clients(2)
        peak = await asyncio.to_thread(_wait_acoustic, app, 4, 240, "4 Acoustic replicas running")
        running_s = load.clock() - t_step
        reps = {n: await asyncio.to_thread(cluster.replicas, n, states=None) for n in CPU_STAGES}
        nodes = {n["node_id"]: n for n in await asyncio.to_thread(cluster.list_nodes)}
        await load.stop()

    # Every half-GPU has its replica: two per GPU node, none on the CPU node.
    per_gpu_node = collections.Counter(r["node_id"] for r in peak)
    assert set(per_gpu_node) == gpu_nodes and set(per_gpu_node.values()) == {2}, per_gpu_node
    # Beside them the CPU stages hold at most their bounds, and together the CPUs the Acoustic
    # replicas leave; the Vocoder asked for more than the nodes give it (some never got one).
    acoustic_cpus = opts["Acoustic"]["ray_actor_options"]["num_cpus"]
    layout = []
    for node in sorted(workers):
        held = {n: sum(1 for r in reps[n] if r.get("node_id") == node) for n in CPU_STAGES}
        cpus = sum(held[n] * opts[n]["ray_actor_options"]["num_cpus"] for n in CPU_STAGES)
        total = cpus + per_gpu_node[node] * acoustic_cpus
        assert all(held[n] <= per_node[n] for n in CPU_STAGES), (node, held)
        assert total <= nodes[node]["resources_total"]["CPU"], (node, held)
        assert held["Vocoder"] == per_node["Vocoder"], (node, held)
        kind = "CPU node" if node == cpu_node else "GPU node"
        layout.append(
            f"{kind} {node[:8]}: {per_gpu_node[node]} Acoustic + "
            + ", ".join(f"{held[n]} {n}" for n in CPU_STAGES)
            + f" = {total:g} of {nodes[node]['resources_total']['CPU']:g} CPUs"
        )
    assert sum(1 for r in reps["Vocoder"] if not r.get("node_id")) >= 1, reps["Vocoder"]
    bad = [(r.status, r.error, r.audio_bytes, expected[r.text]) for r in load.records if not complete(r, expected)]
    assert not bad and load.records, bad
    assert set(load.refusals()) <= {"capacity_exhausted"}, load.refusals()
    report(
        "cluster: CPU stages as shipped, Vocoder forced to 8: GPU nodes only / + a CPU node / 2 -> 4 Acoustic running",
        f"placed in {placed_s:.1f} s ({waiting} without a node) / {cpu_group_s:.1f} s ({left} without a node)"
        f" / {running_s:.1f} s after the load",
    )
    report("cluster: per node at the peak", "; ".join(layout))
