"""Authentication fails closed, and the shipped configs expose nothing by default: config/serve.yaml
binds loopback, config/serve.gpu.yaml requires API keys, an Ingress with ``auth: required`` and no
key refuses to start (unit level, and a real ``serve run``, which never serves the API then); and
Ray's token authentication, as the KubeRay manifest switches it on (RAY_AUTH_MODE=token and the
token in RAY_AUTH_TOKEN), closes the dashboard and the GCS to callers without the token."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
import yaml

from serve_fixtures import free_port, report
from serve_run import REPO, ServeRun, describe, sigint_as_from_a_terminal, wait_gone
from serve_app.http.security import APIKeyAuth, key_id
from serve_app.settings import AppArgs, SecuritySettings

UNSET = "CHATTTS_TEST_KEYS_NEVER_SET"
REFUSED = "security.auth is 'required' but no API key was loaded"


def load(name: str) -> dict:
    return yaml.safe_load((REPO / "config" / name).read_text())


def chattts_args(cfg: dict) -> dict:
    (app,) = [a for a in cfg["applications"] if a["name"] == "chattts"]
    return app.get("args") or {}


def test_default_config_listens_on_loopback_only():
    cfg = load("serve.yaml")
    assert cfg["http_options"]["host"] == "127.0.0.1"
    # optional (the default) is fine there: nothing beyond this machine reaches it.
    assert AppArgs.model_validate(chattts_args(cfg)).ingress.security.auth == "optional"


def test_gpu_config_requires_keys():
    """The config meant for clusters listens on every interface, so it fails closed."""
    cfg = load("serve.gpu.yaml")
    assert cfg["http_options"]["host"] == "0.0.0.0"
    security = AppArgs.model_validate(chattts_args(cfg)).ingress.security
    assert security.auth == "required" and security.api_keys_env == "CHATTTS_API_KEYS"


def test_required_auth_without_a_key_refuses(monkeypatch, tmp_path):
    """Every way a pod ends up with no key (the variable missing, empty or only separators, an
    empty keys file) is a refusal to start, never a replica without auth."""
    monkeypatch.delenv(UNSET, raising=False)
    with pytest.raises(RuntimeError, match=REFUSED):
        APIKeyAuth(SecuritySettings(auth="required", api_keys_env=UNSET))
    for value in ("", " , ,"):
        monkeypatch.setenv(UNSET, value)
        with pytest.raises(RuntimeError, match=REFUSED):
            APIKeyAuth(SecuritySettings(auth="required", api_keys_env=UNSET))
    keys_file = tmp_path / "keys"
    keys_file.write_text("# no key yet\n\n")
    with pytest.raises(RuntimeError, match=REFUSED):
        APIKeyAuth(SecuritySettings(auth="required", api_keys_env=None, api_keys_file=str(keys_file)))
    with pytest.raises(RuntimeError, match="nowhere"):
        APIKeyAuth(SecuritySettings(auth="required", api_keys_env=None))
    # With a key it starts, and only that key gets in.
    keys_file.write_text("# ops\nsk-from-the-file\n")
    auth = APIKeyAuth(SecuritySettings(auth="required", api_keys_env=UNSET, api_keys_file=str(keys_file)))
    assert auth.enabled and auth.identify("Bearer sk-from-the-file", "10.0.0.1").id == key_id("sk-from-the-file")
    # optional without keys: open, every caller anonymous (what config/serve.yaml on loopback does).
    monkeypatch.delenv(UNSET)
    assert not APIKeyAuth(SecuritySettings(auth="optional", api_keys_env=UNSET)).enabled


class _StartOnly(ServeRun):
    """``serve run`` started without waiting for /readyz (it is expected never to be ready)."""

    def __enter__(self) -> "_StartOnly":
        with open(self.log_path, "wb") as log, sigint_as_from_a_terminal():
            self.proc = subprocess.Popen([str(Path(sys.executable).with_name("serve")), "run", str(self.cfg_path)], cwd=REPO,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return self


@pytest.mark.timeout(360)
def test_serve_run_with_required_auth_and_no_key_never_serves(serve_weights_cache, tmp_path):
    """config/serve.yaml with ``auth: required`` and no key anywhere: the Ingress replica refuses to
    start, the refusal (what is missing, where from) is in ``serve run``'s log, and the API is never
    served (no /readyz 200, no audio). ``serve run`` itself keeps running: it does not exit when an
    application fails to deploy (Ray 2.60), so the test stops it."""
    cfg = load("serve.yaml")
    cfg["http_options"].update(host="127.0.0.1", port=free_port())
    chattts_args(cfg).setdefault("ingress", {})["security"] = {"auth": "required", "api_keys_env": UNSET}
    run = _StartOnly(cfg, tmp_path, serve_weights_cache)
    run.env.pop(UNSET, None)
    t0 = time.monotonic()
    statuses: set = set()
    with run:
        with httpx.Client(timeout=5.0) as client:
            # The replica's exception, as Serve's controller prints it: what is missing, where from.
            while f"RuntimeError: {REFUSED} (from ${UNSET})" not in run.log_path.read_text(errors="replace"):
                assert run.proc.poll() is None, f"serve run exited ({run.proc.returncode})\n{run.log_tail()}"
                assert time.monotonic() - t0 < 240, f"no refusal in the log after 240 s\n{run.log_tail()}"
                try:
                    statuses.add(client.get(run.url + "/readyz").status_code)
                except httpx.HTTPError:
                    statuses.add("no answer")
                time.sleep(1)
            refused_s = time.monotonic() - t0
            time.sleep(3)  # a retried replica gets no further
            for _ in range(3):
                try:
                    statuses.add(client.get(run.url + "/readyz").status_code)
                    r = client.post(run.url + "/v1/audio/speech", json={"input": "你好", "response_format": "wav"})
                    assert r.status_code != 200 and not r.headers.get("content-type", "").startswith("audio/"), r.status_code
                except httpx.HTTPError:
                    statuses.add("no answer")
                time.sleep(1)
        report("`serve run` with auth: required and no key", f"refused after {refused_s:.1f} s; /readyz answered {sorted(map(str, statuses))}")
    assert 200 not in statuses, statuses
    assert not run.remaining, f"processes of the serve run subprocess survive SIGKILL: {describe(run.remaining)}"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ray_token_auth_as_the_manifest_sets_it(tmp_path):
    """What deploy/kuberay/rayservice.yaml relies on, against the installed Ray, with a head of its
    own (its own ports, temp dir and HOME; never the session's Ray): RAY_AUTH_MODE=token without a
    token is a node that does not start (so the manifest's explicit RAY_AUTH_MODE fails closed if
    the operator injected no token); with RAY_AUTH_TOKEN the dashboard refuses job submission and
    Serve deploys without the token (and takes KubeRay's x-ray-authorization header), leaves the
    probes' health path open, and the GCS refuses drivers and nodes with a wrong token."""
    marker = f"CHATTTS_RAY_TOKEN_TEST={uuid.uuid4().hex}"
    home = tmp_path / "home"
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths must fit
    base = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    base.update(HOME=str(home), RAY_TMPDIR=ray_tmp, **dict([marker.split("=", 1)]))
    gcs, dash = free_port(), free_port()
    ray = str(Path(sys.executable).with_name("ray"))
    start = [ray, "start", "--head", f"--port={gcs}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
             f"--ray-client-server-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}", "--num-cpus=1",
             "--include-dashboard=true", "--disable-usage-stats"]
    refused = subprocess.run(start, env={**base, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "no authentication token was found" in refused.stderr, refused.stderr[-2000:]
    assert not (home / ".ray" / "auth_token").exists()  # ray start makes none up

    token = os.urandom(32).hex()
    env = {**base, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    log = tmp_path / "head.log"
    with open(log, "wb") as out:
        head = subprocess.Popen([*start, "--block"], env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{dash}"
    try:
        deadline = time.monotonic() + 180
        while True:  # the probes' path answers without a token
            assert head.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            try:
                if httpx.get(url + "/api/gcs_healthz", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        bearer = {"Authorization": f"Bearer {token}"}
        assert httpx.post(url + "/api/jobs/", json={"entrypoint": "echo pwned"}, timeout=10).status_code == 401
        assert httpx.put(url + "/api/serve/applications/", json={"applications": []}, timeout=10).status_code == 401
        assert httpx.get(url + "/api/jobs/", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 403
        assert httpx.get(url + "/api/jobs/", headers=bearer, timeout=10).status_code == 200
        assert httpx.get(url + "/api/jobs/", headers={"x-ray-authorization": f"Bearer {token}"},
                         timeout=10).status_code == 200  # the header the KubeRay operator sends
        driver = f"import ray; ray.init(address='127.0.0.1:{gcs}', log_to_driver=False); print(ray.cluster_resources()['CPU'])"
        ok = subprocess.run([sys.executable, "-c", driver], env=env, capture_output=True, text=True, timeout=120)
        assert ok.returncode == 0 and ok.stdout.strip().endswith("1.0"), ok.stderr[-2000:]
        wrong = subprocess.run([sys.executable, "-c", driver], env={**env, "RAY_AUTH_TOKEN": "f" * 64},
                               capture_output=True, text=True, timeout=120)
        assert wrong.returncode != 0
        node = subprocess.run([ray, "start", f"--address=127.0.0.1:{gcs}", "--num-cpus=1",
                               f"--dashboard-agent-listen-port={free_port()}", "--disable-usage-stats"],
                              env={**env, "RAY_AUTH_TOKEN": "f" * 64}, capture_output=True, text=True, timeout=120)
        assert node.returncode != 0 and "InvalidAuthToken" in node.stderr, node.stderr[-2000:]
        nodes = httpx.get(url + "/api/v0/nodes", headers=bearer, timeout=10).json()["data"]["result"]["result"]
        assert sum(n["state"] == "ALIVE" for n in nodes) == 1
    finally:
        os.killpg(head.pid, signal.SIGTERM)
        head.wait(timeout=60)
        for pid in wait_gone(marker, timeout_s=15):  # exactly what this test started
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        remaining = wait_gone(marker, timeout_s=10)
        if not remaining:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    assert not remaining, describe(remaining)
