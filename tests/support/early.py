"""Scenarios that are one subprocess with a Ray of its own and wait on it much of their time (its
Ray's start, its Serve app's start, load phases of a fixed length): ``python -m bench gpu
--dry-run`` leaves ~37 % of the two cores idle over its minute and a quarter.

A test that owns one is marked ``early_start(run)``. tests/conftest.py starts every such run of
the session when the first test with a Ray of its own begins (the session's Ray is down by
then), so its waits overlap the tests before its owner; the owner then waits for the end and
checks what it left in ``run.out``. Run alone (``-k``), the owner starts it itself.
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from pathlib import Path
from typing import ClassVar, Optional, Sequence

from bench.lib.procs import ManagedProcess


class EarlyRun:
    """``argv`` (``{out}`` in it: the run's output folder) as a ``ManagedProcess`` with a marker,
    so whatever it starts (its Ray) ends with it."""

    runs: ClassVar[list["EarlyRun"]] = []

    def __init__(self, name: str, argv: Sequence[str], timeout_s: float):
        self.name, self.argv, self.timeout_s = name, list(argv), timeout_s
        self.proc: Optional[ManagedProcess] = None
        self.root: Optional[Path] = None
        self.started_at = 0.0
        EarlyRun.runs.append(self)

    @property
    def out(self) -> Path:
        assert self.root is not None, f"{self.name} was never started"
        return self.root / "out"

    def start(self) -> "EarlyRun":
        if self.proc is None:
            self.root = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
            self.started_at = time.monotonic()
            argv = [a.replace("{out}", str(self.out)) for a in self.argv]
            self.proc = ManagedProcess(self.name, argv, self.root / "log.txt", marker=uuid.uuid4().hex)
        return self

    def finish(self) -> tuple[Optional[int], str]:
        """Wait for the end, at most ``timeout_s`` from the start (then it is stopped): its exit
        status (None: timed out) and the tail of its output."""
        self.start()
        left = self.timeout_s - (time.monotonic() - self.started_at)
        return self.proc.finish(max(1.0, left), grace_s=5, lines=80)  # what it left (marked) goes too

    @classmethod
    def stop_all(cls) -> None:
        """End of the session: stop what is still running, remove the output folders."""
        for run in cls.runs:
            if run.proc is not None and run.proc.alive():
                run.proc.stop()
            if run.root is not None:
                shutil.rmtree(run.root, ignore_errors=True)
