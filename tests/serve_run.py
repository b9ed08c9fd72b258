"""``serve run CONFIG`` as a user starts it: a subprocess with its own local Ray, stopped with
Ctrl-C the way a terminal stops it, and every process it left behind found (by a marker in their
environment) and killed. Used by the ``serve run`` tests and the browser tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import yaml

from serve_fixtures import wait_ready

REPO = Path(__file__).resolve().parents[1]
READY_TIMEOUT_S = 240.0


def marked_pids(marker: str) -> list[int]:
    """Processes whose environment carries ``marker``: the subprocess and everything it (and the
    Ray it started: GCS, raylet, workers, replicas) spawned. Nothing of the session's Ray."""
    needle = marker.encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes():
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours to read
            continue
    return pids


def describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
        except OSError:
            continue
        out.append(f"{pid}: {cmd.decode(errors='replace')}")
    return out


def wait_gone(marker: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    pids = marked_pids(marker)
    while pids and time.monotonic() < deadline:
        time.sleep(0.5)
        pids = marked_pids(marker)
    return pids


@contextlib.contextmanager
def sigint_as_from_a_terminal():
    """Let a child started here take SIGINT as it would from a terminal. A test run started in the
    background (``.ci/run &``) ignores SIGINT, as POSIX has every background job of a
    non-interactive shell do; an ignored signal stays ignored across exec, and Python then never
    installs its KeyboardInterrupt handler, so the Ctrl-C below would be lost. A *handled* signal
    is reset to the default on exec: handle it in this process while the child is started."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class ServeRun:
    """``with ServeRun(config, tmp, weights_cache) as run:`` - ``run.url`` answers /readyz 200.

    The config (a dict) is written to ``tmp``; the subprocess gets no RAY_* variables and its own
    RAY_TMPDIR, so it can never attach to the test session's cluster, and random-tiny weights from
    ``weights_cache``. On exit: Ctrl-C, then (after 60 s) SIGKILL; processes still marked 30 s
    later are killed one by one and listed in ``run.killed``; ``run.remaining`` are those that
    survived even that."""

    def __init__(self, config: dict, tmp: Path, weights_cache: Path, env: Optional[dict[str, str]] = None):
        self.tmp = Path(tmp)
        self.cfg_path = self.tmp / "serve.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        http = config["http_options"]
        self.url = f"http://{http['host']}:{http['port']}"
        self.log_path = self.tmp / "serve_run.log"
        self.marker = f"CHATTTS_SERVE_RUN_TEST={uuid.uuid4().hex}"
        self.ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must fit
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        self.env.pop("CHATTTS_WEIGHTS_PATH", None)
        self.env.update(RAY_AUTH_MODE="disabled", RAY_TMPDIR=self.ray_tmp, CHATTTS_WEIGHTS="random-tiny",
                        CHATTTS_SERVE_CACHE=str(weights_cache), PYTHONUNBUFFERED="1", **(env or {}))
        key, value = self.marker.split("=", 1)
        self.env[key] = value
        self.proc: Optional[subprocess.Popen] = None
        self.startup_s = 0.0
        self.killed: list[str] = []
        self.remaining: list[int] = []

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def __enter__(self) -> "ServeRun":
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log, sigint_as_from_a_terminal():
            self.proc = subprocess.Popen([str(Path(sys.executable).with_name("serve")), "run", str(self.cfg_path)], cwd=REPO,
                                         env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(self.url, READY_TIMEOUT_S, proc=self.proc)
        except AssertionError as exc:
            self.stop()
            raise AssertionError(f"{exc}\n--- serve run log (tail) ---\n{self.log_tail()}") from None
        self.startup_s = time.monotonic() - t0
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> None:
        """Ctrl-C: ``serve run`` deletes its apps and shuts down the Ray it started."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.killed.append(f"serve run {proc.pid} (ignored SIGINT for 60 s)")
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        leftovers = wait_gone(self.marker, timeout_s=30)
        if leftovers:  # kill exactly the processes this subprocess started
            self.killed += describe(leftovers)
            for pid in leftovers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.remaining = wait_gone(self.marker, timeout_s=10)
        if not self.remaining:  # its Ray logs stay behind only when something survived
            shutil.rmtree(self.ray_tmp, ignore_errors=True)

    @property
    def returncode(self) -> Optional[int]:
        return None if self.proc is None else self.proc.returncode
