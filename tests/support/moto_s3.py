"""A private S3 (moto's server) for the job-store tests: a loopback port, a subprocess, stopped
after the session. Skipped where moto is not installed (``pip install -e '.[test]'``).

moto's own ``moto_server`` serves requests on threads, and moto checks ``If-None-Match: *``
apart from the write, so two exclusive creates of one key can both succeed there (S3 itself
decides them atomically). This server answers one request at a time, which makes moto's check
and write one step, as S3's are: the lock tests then test the store, not moto's threads.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import uuid
from pathlib import Path

import pytest

from bench.lib.procs import ManagedProcess, free_port
from support.waiting import wait_until

needs_moto = pytest.mark.skipif(
    importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None,
    reason="moto[server] and s3fs not installed (pip install -e '.[test]')",
)

_SERVE = """
import sys
from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
run_simple("127.0.0.1", int(sys.argv[1]), DomainDispatcherApplication(create_backend_app), threaded=False,
           request_handler=MotoRequestHandler)
"""
CREDENTIALS = {"key": "testing", "secret": "testing"}


class MotoS3:
    def __init__(self, port: int, workdir: Path):
        self.port = port
        self.endpoint = f"http://127.0.0.1:{port}"
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        self.process = ManagedProcess(
            "moto-s3", [sys.executable, "-c", _SERVE, str(port)], workdir / "moto.log", env=env, cwd=workdir
        )
        self.fs = self._fs()
        wait_until(self._answers, timeout_s=30, interval_s=0.1, what="moto's S3 answering")

    def storage_options(self) -> dict:
        return {**CREDENTIALS, "endpoint_url": self.endpoint}

    def _fs(self):
        import s3fs

        return s3fs.S3FileSystem(**self.storage_options(), use_listings_cache=False, skip_instance_cache=True)

    def _answers(self) -> bool:
        assert self.process.alive(), f"moto's server exited at start:\n{self.process.log_tail()}"
        try:
            self.fs.ls("")
            return True
        except Exception:  # noqa: BLE001 - not listening yet
            return False

    def new_bucket(self) -> str:
        name = f"jobs-{uuid.uuid4().hex[:12]}"
        self.fs.mkdir(name)
        return name

    def stop(self) -> None:
        self.process.stop(timeout=10)


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    """A started ``MotoS3`` for the whole session (each test takes a bucket of its own)."""
    if importlib.util.find_spec("moto") is None or importlib.util.find_spec("s3fs") is None:
        pytest.skip(needs_moto.kwargs["reason"])
    server = MotoS3(free_port(), tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()
