"""The processes the bench and the tests start: free ports, their environment, and
``ManagedProcess``, the one class for every subprocess (the ceiling, the baseline server, the GPU
check's steps, py-spy, the nodes of a local cluster; in the tests ``serve run``, redis, S3, the
early-started runs).

A ``ManagedProcess`` has its own process group and its output in a log file; ``stop()`` escalates
SIGINT, SIGTERM, SIGKILL and then ends whatever is left in the group and, with a ``marker``, every
process it started anywhere (found by that variable in their environment: Ray's processes leave
the group).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import psutil

from .waiting import holds_within

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER_ENV = "CHATTTS_LOCAL_CLUSTER"  # name kept: the cluster tests and Ray's processes carry it
WEIGHTS_ENV = ("CHATTTS_WEIGHTS", "CHATTTS_WEIGHTS_PATH")  # overrides of the weights: callers choose theirs

# Ports handed out are drawn from 20000-32767: below Linux's ephemeral range (32768-60999), from
# which the OS picks the local port of every outgoing connection and every bind to port 0, and
# above Ray's worker ports (10002-19999). A port from bind(0) is free only until the next
# connection takes it: Ray opens hundreds while it starts, and one of them once took the port
# chosen for Serve's proxy ("Failed to bind to address") before the proxy could bind it.
_PORTS = range(20000, 32768)
_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback TCP port that is free now and that no connection will take by chance."""
    for _ in range(200):
        port = random.choice(_PORTS)
        if port in _handed_out:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")


def child_env(own_ray: bool = False, **extra: str) -> dict[str, str]:
    """The environment of a process the bench or a test starts: this one's without the weights
    overrides and without ``RAY_ADDRESS`` (every Ray is the caller's own, never one it would
    attach to), Ray's auth prompt off, output unbuffered (its log is read while it runs), then
    ``extra``. ``own_ray``: no ``RAY_*`` variable at all (a process that starts a Ray of its own
    inherits none of this one's Ray settings)."""
    env = {k: v for k, v in os.environ.items() if not (own_ray and k.startswith("RAY_"))}
    for key in (*WEIGHTS_ENV, "RAY_ADDRESS"):
        env.pop(key, None)
    env.update(RAY_AUTH_MODE="disabled", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env.update(extra)
    return env


def isolate_environ() -> None:
    """``child_env``'s rules for a Ray this process starts in-process (``ray.init``: its raylet and
    workers inherit this environment)."""
    for key in (*WEIGHTS_ENV, "RAY_ADDRESS"):
        os.environ.pop(key, None)
    os.environ["RAY_AUTH_MODE"] = "disabled"


def bench_command(runner: str, *args: str) -> list[str]:
    """``python -m bench RUNNER ARGS...`` with this interpreter (run from ``REPO_ROOT``)."""
    return [sys.executable, "-m", "bench", runner, *args]


@contextlib.contextmanager
def sigint_as_from_a_terminal():
    """Let a child started here take SIGINT as it would from a terminal. A run started in the
    background (``.ci/run &``) ignores SIGINT, as POSIX has every background job of a
    non-interactive shell do; an ignored signal stays ignored across exec, and Python then never
    installs its KeyboardInterrupt handler, so a later Ctrl-C (``stop()``'s SIGINT) would be lost.
    A *handled* signal is reset to the default on exec: handle it here while the child starts."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class ManagedProcess:
    """A subprocess in its own process group, output to ``log_path``; see the module docstring."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        env: Optional[dict] = None,
        cwd: Optional[str | Path] = REPO_ROOT,
        marker: Optional[str] = None,
    ):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.marker = marker
        env = dict(env or child_env())
        if marker:
            env[MARKER_ENV] = marker
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        with sigint_as_from_a_terminal():
            self.proc = subprocess.Popen(
                self.argv,
                stdout=self._log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=cwd,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> Optional[int]:
        """The exit status, or None if still running after ``timeout`` seconds."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def finish(self, timeout_s: float, grace_s: float = 0.0, lines: int = 30) -> tuple[Optional[int], str]:
        """Wait for the end, at most ``timeout_s`` (then it is stopped), and stop whatever it left:
        its exit status (None: timed out) and the tail of its log."""
        try:
            rc = self.wait(timeout_s)
        finally:  # also when the wait is interrupted (Ctrl-C, SIGTERM)
            self.stop(grace_s=grace_s)
        return rc, self.log_tail(lines)

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def signal(self, sig: int) -> bool:
        """``sig`` to the whole process group; False if it is gone."""
        try:
            os.killpg(self.proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def kill(self, timeout: float = 30.0) -> int:
        """SIGKILL the group and every marked process at once (a machine that dies); how many
        marked processes there were."""
        self.signal(signal.SIGKILL)
        n = kill_marked(self.marker) if self.marker else 0
        self.wait(timeout)
        self.close()
        return n

    def stop(self, timeout: float = 15.0, grace_s: float = 0.0) -> list[str]:
        """SIGINT, then SIGTERM (``timeout / 2`` each), then SIGKILL; then whatever is left in its
        group and, with a marker, anywhere, once marked processes have had ``grace_s`` to end by
        themselves. Returns what had to be forced: each signal it ignored, and each marked
        process still there after the grace (``"pid: command line"``)."""
        forced = []
        if self.alive():
            for sig, wait in ((signal.SIGINT, timeout / 2), (signal.SIGTERM, timeout / 2), (signal.SIGKILL, 5)):
                if not self.signal(sig) or self.wait(wait) is not None:
                    break
                forced.append(f"{self.name} {self.pid} ignored {signal.Signals(sig).name} for {wait:g} s")
        if self.marker:
            if grace_s > 0:
                holds_within(lambda: not marked(self.marker), grace_s, 0.2)
            forced += [f"{p.pid}: {command_of(p)}" for p in marked(self.marker)]
        self.signal(signal.SIGKILL)  # anything left in its process group (children) goes too
        if self.marker:
            kill_marked(self.marker)
        self.close()
        return forced

    def close(self) -> None:
        self._log.close()


def run_to_end(
    name: str, argv: Sequence[str], log_path: Path, timeout_s: float, env: Optional[dict] = None
) -> tuple[Optional[int], str]:
    """Run ``argv`` as a ``ManagedProcess`` until it exits or ``timeout_s`` passes (then it is
    stopped); its exit status (None: timed out) and the tail of its log."""
    return ManagedProcess(name, argv, log_path, env=env).finish(timeout_s)


# ------------------------------------------------------------------ processes by marker or parent


def command_of(p: psutil.Process) -> str:
    """A process's command line (its first 120 characters), "?" once it is gone."""
    try:
        return " ".join(p.cmdline())[:120]
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"


def marked(*markers: str) -> list[psutil.Process]:
    """Live processes whose environment holds ``MARKER_ENV=`` one of ``markers`` (everything the
    ``ManagedProcess`` with that marker started, wherever it went)."""
    wanted = set(markers)
    out = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            env = p.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get(MARKER_ENV) in wanted:
            out.append(p)
    return out


def kill_marked(*markers: str) -> int:
    """SIGKILL every process of ``markers`` (one pass over the machine's processes: a pass takes
    ~2 s on the 2-core box with a cluster up) and wait up to 10 s for them to go."""
    procs = marked(*markers)
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=10)
    return len(procs)


def kill_descendants(pid: int, grace: float = 5.0) -> list[str]:
    """Terminate what is still running below ``pid`` (the benchmark's own children), by pid."""
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    names = []
    for p in procs:
        try:
            names.append(f"{p.pid}:{command_of(p)[:60]}")
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    return names


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []
