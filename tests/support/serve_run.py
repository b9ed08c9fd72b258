"""``serve run CONFIG`` as a user starts it: a subprocess with its own local Ray, stopped with
Ctrl-C the way a terminal stops it, and every process it left behind found (by a marker in their
environment) and killed. A ``ManagedProcess`` (bench/lib/procs.py), the one process class of
the bench and the tests."""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Iterator, Optional

import pytest
import yaml

from bench.lib.procs import REPO_ROOT, ManagedProcess, child_env, command_of, marked
from bench.lib.serve import wait_ready
from bench.lib.waiting import NotMet

READY_TIMEOUT_S = 240.0


class ServeRun:
    """``ServeRun(config, tmp, weights_cache).start()``, then ``wait_ready()``: ``run.url`` answers
    /readyz 200; ``stop()`` (or ``stop_in_background()`` first: several runs' waits overlap).

    The config (a dict) is written to ``tmp``; the subprocess gets no RAY_* variables and its own
    RAY_TMPDIR, so it can never attach to the test session's cluster, and random-tiny weights from
    ``weights_cache``. To stop: Ctrl-C (SIGINT), then SIGTERM and SIGKILL after 60 s each;
    processes it started that are still there 30 s after it ended are killed and listed in
    ``run.killed`` (with any signal it ignored); ``run.remaining`` are those that survived even
    that."""

    def __init__(self, config: dict, tmp: Path, weights_cache: Path, env: Optional[dict[str, str]] = None):
        self.tmp = Path(tmp)
        self.cfg_path = self.tmp / "serve.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config, sort_keys=False))
        http = config["http_options"]
        self.url = f"http://{http['host']}:{http['port']}"
        self.log_path = self.tmp / "serve_run.log"
        self.marker = f"serve-run-{uuid.uuid4().hex}"
        self.ray_tmp = tempfile.mkdtemp(prefix="rs", dir="/tmp")  # short: Ray's socket paths must fit
        self.env = child_env(
            own_ray=True,
            RAY_TMPDIR=self.ray_tmp,
            CHATTTS_WEIGHTS="random-tiny",
            CHATTTS_SERVE_CACHE=str(weights_cache),
            **(env or {}),
        )
        self.process: Optional[ManagedProcess] = None
        self.startup_s = 0.0
        self.stop_s = 0.0
        self.killed: list[str] = []
        self.remaining: list[str] = []
        self._ready: Optional[threading.Thread] = None
        self._not_ready: Optional[Exception] = None
        self._stopping: Optional[threading.Thread] = None

    def log_tail(self, lines: int = 60) -> str:
        return self.process.log_tail(lines) if self.process else ""

    def start(self) -> "ServeRun":
        """Start ``serve run`` and watch for /readyz 200 (returns at once; ``wait_ready`` waits)."""
        t0 = time.monotonic()
        self.process = ManagedProcess(
            "serve run",
            [str(Path(sys.executable).with_name("serve")), "run", str(self.cfg_path)],
            self.log_path,
            env=self.env,
            cwd=REPO_ROOT,
            marker=self.marker,
        )

        def watch() -> None:
            try:
                wait_ready(self.url, READY_TIMEOUT_S, proc=self.process.proc)
                self.startup_s = time.monotonic() - t0
            except (NotMet, RuntimeError) as exc:
                self._not_ready = exc

        self._ready = threading.Thread(target=watch, name="serve-run-ready", daemon=True)
        self._ready.start()
        return self

    def wait_ready(self) -> "ServeRun":
        """Wait for /readyz 200 (``startup_s``: from ``start``); stop it and fail if it never comes."""
        self._ready.join()
        if self._not_ready is not None:
            self.stop()
            raise AssertionError(f"{self._not_ready}\n--- serve run log (tail) ---\n{self.log_tail()}")
        return self

    def processes(self) -> list[int]:
        """Pids of the processes it started (the subprocess, its Ray, the replicas): never the
        session's own."""
        return [p.pid for p in marked(self.marker)]

    def stop_in_background(self) -> None:
        """Ctrl-C now; ``stop()`` then waits for the end (the waits of several runs overlap)."""
        if self.process is not None and self._stopping is None:
            self._stopping = threading.Thread(target=self._stop, name="serve-run-stop", daemon=True)
            self._stopping.start()

    def stop(self) -> None:
        """Ctrl-C (if not sent yet) and wait: ``serve run`` deletes its apps and shuts down the Ray
        it started; ``stop_s``, ``killed`` and ``remaining`` say how that went."""
        self.stop_in_background()
        if self._stopping is not None:
            self._stopping.join()

    def _stop(self) -> None:
        t0 = time.monotonic()
        self.killed = self.process.stop(timeout=120, grace_s=30)
        self.stop_s = time.monotonic() - t0
        self.remaining = [f"{p.pid}: {command_of(p)}" for p in marked(self.marker)]
        if not self.remaining:  # its Ray logs stay behind only when something survived
            shutil.rmtree(self.ray_tmp, ignore_errors=True)

    @property
    def returncode(self) -> Optional[int]:
        return None if self.process is None else self.process.proc.returncode


@pytest.fixture(scope="session")
def stopped_by_session_end() -> Iterator[list[ServeRun]]:
    """Runs a module has Ctrl-C'd (``stop_in_background``) without waiting for their end, so the
    next module's start-ups overlap their shutdown; waited for (``stop``) as the session ends."""
    runs: list[ServeRun] = []
    yield runs
    for run in runs:
        run.stop()
