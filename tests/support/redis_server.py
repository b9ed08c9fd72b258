"""A private ``redis-server`` for the cache and voice-store tests: a loopback port, no
persistence unless asked (``persistent``: an append-only file, fsynced before each reply),
stoppable, crashable, restartable on the same port and pausable (a hung server). A
``ManagedProcess`` (bench/lib/procs.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
from pathlib import Path
from typing import Optional

import pytest

from bench.lib.procs import ManagedProcess, free_port
from support.waiting import wait_until

REDIS_SERVER = shutil.which("redis-server")
needs_redis = pytest.mark.skipif(
    REDIS_SERVER is None, reason="redis-server binary not found (apt-get install redis-server)"
)


class RedisServer:
    """``start()`` answers PING before it returns; ``stop()``, ``pause()`` (SIGSTOP: it accepts
    connections and never answers), ``resume()``."""

    def __init__(self, port: int, workdir: Path, persistent: bool = False):
        self.port = port
        self.workdir = Path(workdir)
        self.persistent = persistent  # an append-only file, each write on disk before its reply
        self.process: Optional[ManagedProcess] = None
        self.url = f"redis://127.0.0.1:{port}/0"

    def start(self) -> None:
        argv = [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes" if self.persistent else "no",
            "--appendfsync",
            "always",
            "--dir",
            str(self.workdir),
        ]
        self.process = ManagedProcess(
            "redis-server", argv, self.workdir / "redis.log", env=dict(os.environ), cwd=self.workdir
        )
        wait_until(self._answers_ping, timeout_s=10, interval_s=0.02, what="redis-server answering PING")

    def _answers_ping(self) -> bool:
        assert self.process is not None and self.process.alive(), "redis-server exited at start"
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.signal(signal.SIGCONT)  # in case a test paused it
            self.process.stop(timeout=10)
        self.process = None

    def crash(self) -> None:
        """SIGKILL: no shutdown of its own (a persistent server keeps what it acknowledged)."""
        if self.process is not None:
            self.process.kill(timeout=10)
        self.process = None

    def pause(self) -> None:
        assert self.process is not None
        self.process.signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.signal(signal.SIGCONT)

    def client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=2)


@pytest.fixture
def redis_server(tmp_path):
    """A started ``RedisServer`` on a free port, stopped after the test."""
    if REDIS_SERVER is None:
        pytest.skip(needs_redis.kwargs["reason"])
    srv = RedisServer(free_port(), tmp_path)
    srv.start()
    yield srv
    srv.stop()
