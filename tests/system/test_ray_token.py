"""Ray's token authentication as the KubeRay manifest switches it on (RAY_AUTH_MODE=token and the
token in RAY_AUTH_TOKEN): a node without the token does not start, and the dashboard and the GCS
refuse callers without it. (The app's own fail-closed keys: tests/unit/test_deploy_security.py and
tests/serve/test_abuse.py.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest
from support import waiting

from bench.lib.procs import MARKER_ENV, ManagedProcess, child_env, free_port, marked
from bench.lib.waiting import holds_within


@pytest.mark.timeout(300)
def test_ray_token_auth_as_the_manifest_sets_it(tmp_path):
    """What deploy/kuberay/rayservice.yaml relies on, against the installed Ray, with a head of its
    own (its own ports, temp dir and HOME; never the session's Ray): RAY_AUTH_MODE=token without a
    token is a node that does not start (so the manifest's explicit RAY_AUTH_MODE fails closed if
    the operator injected no token); with RAY_AUTH_TOKEN the dashboard refuses job submission and
    Serve deploys without the token (and takes KubeRay's x-ray-authorization header), leaves the
    probes' health path open, and the GCS refuses drivers and nodes with a wrong token."""
    marker = uuid.uuid4().hex  # in MARKER_ENV of every process this test starts
    home = tmp_path / "home"
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit
    base = child_env(own_ray=True, HOME=str(home), RAY_TMPDIR=ray_tmp, **{MARKER_ENV: marker})
    gcs, dash = free_port(), free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    start = [
        ray,
        "start",
        "--head",
        f"--port={gcs}",
        "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dash}",
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        "--num-cpus=1",
        "--include-dashboard=true",
        "--disable-usage-stats",
    ]
    refused = subprocess.run(start, env={**base, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "no authentication token was found" in refused.stderr, refused.stderr[-2000:]
    assert not (home / ".ray" / "auth_token").exists()  # ray start makes none up

    token = os.urandom(32).hex()
    env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    head = ManagedProcess("ray head", [*start, "--block"], tmp_path / "head.log", env=env, marker=marker)
    url = f"http://127.0.0.1:{dash}"
    try:

        def healthz() -> int:
            assert head.alive(), head.log_tail(60)
            try:
                return httpx.get(url + "/api/gcs_healthz", timeout=5).status_code
            except httpx.HTTPError:
                return 0

        # The probes' path answers without a token.
        waiting.wait_until(
            healthz,
            180,
            0.25,
            until=lambda status: status == 200,
            what=lambda: "dashboard healthz: " + head.log_tail(60),
        )
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.post(url + "/api/jobs/", json={"entrypoint": "echo pwned"}, timeout=10).status_code == 401
        assert httpx.put(url + "/api/serve/applications/", json={"applications": []}, timeout=10).status_code == 401
        assert httpx.get(url + "/api/jobs/", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 403
        assert httpx.get(url + "/api/jobs/", headers=bearer, timeout=10).status_code == 200
        assert (
            httpx.get(url + "/api/jobs/", headers={"x-ray-authorization": f"Bearer {token}"}, timeout=10).status_code
            == 200
        )  # the header the KubeRay operator sends
        driver = f"import ray; ray.init(address='127.0.0.1:{gcs}', log_to_driver=False); print(ray.cluster_resources()['CPU'])"
        ok = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0 and ok.stdout.strip().endswith("1.0"), ok.stderr[-2000:]
        # A refused driver retries its GCS lookup once a second, RAY_NUM_REDIS_GET_RETRIES (20) times.
        wrong = subprocess.run(
            [sys.executable, "-c", driver],
            env={**env, "RAY_AUTH_TOKEN": "f" * 64, "RAY_NUM_REDIS_GET_RETRIES": "3"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert wrong.returncode != 0
        node = subprocess.run(
            [
                ray,
                "start",
                f"--address=127.0.0.1:{gcs}",
                "--num-cpus=1",
                f"--dashboard-agent-listen-port={free_port()}",
                "--disable-usage-stats",
            ],
            env={**env, "RAY_AUTH_TOKEN": "f" * 64, "RAY_NUM_REDIS_GET_RETRIES": "3"},  # as the driver above
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert node.returncode != 0 and "InvalidAuthToken" in node.stderr, node.stderr[-2000:]
        nodes = httpx.get(url + "/api/v0/nodes", headers=bearer, timeout=10).json()["data"]["result"]["result"]
        assert sum(n["state"] == "ALIVE" for n in nodes) == 1
    finally:
        # SIGTERM, then SIGKILL after a moment: its raylet would drain for ~30 s, and nothing here
        # needs that (bench/lib/cluster.py stops its nodes the same way).
        head.signal(signal.SIGTERM)
        head.wait(2)
        head.kill()  # the group and exactly what this test started (marked)
        holds_within(lambda: not marked(marker), 15)
        remaining = [p.pid for p in marked(marker)]
        if not remaining:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not remaining, remaining
