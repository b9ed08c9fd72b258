"""Processes the benchmark starts: free ports, subprocesses that always get stopped, RSS sampling."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional, Sequence

import psutil


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


def bench_env(**extra: str) -> dict[str, str]:
    """Environment of everything the benchmark starts: no auth prompt, no weights override."""
    env = dict(os.environ)
    env["RAY_AUTH_MODE"] = "disabled"
    env.pop("CHATTTS_WEIGHTS", None)  # the bench chooses the weights explicitly
    env.pop("CHATTTS_WEIGHTS_PATH", None)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(extra)
    return env


class ManagedProcess:
    """A subprocess in its own process group; ``stop()`` ends the group (TERM, then KILL)."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path, env: Optional[dict] = None, cwd: Optional[str] = None):
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env or bench_env(),
            cwd=cwd,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def log_tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def stop(self, timeout: float = 15.0) -> None:
        if self.proc.poll() is None:
            for sig, wait in ((signal.SIGINT, timeout / 2), (signal.SIGTERM, timeout / 2), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        # Anything left in its process group (children) goes too.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()


def python_module(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def _title(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
        return cmd[0] if cmd else p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"


def serve_process_group(title: str) -> Optional[str]:
    """Ray worker titles -> the Serve part they belong to (None: not a Serve process)."""
    if title.startswith("ray::ServeReplica:"):
        # ray::ServeReplica:<app>:<Deployment>[.<method being run>]
        return title.split(":")[-1].split(".")[0]
    if title.startswith("ray::ServeController"):  # (a method suffix may follow)
        return "ServeController"
    if title.startswith("ray::ProxyActor"):
        return "ProxyActor"
    return None


class RssSampler:
    """Samples RSS of groups of processes every ``interval`` seconds on a thread.

    ``groups`` maps a process to a group name (or None to skip it); ``roots`` gives the pids
    whose descendants are looked at. ``window()`` returns the peaks since the last call.
    """

    def __init__(self, roots: Callable[[], list[int]], classify: Callable[[psutil.Process], Optional[str]], interval: float = 0.5):
        self.roots = roots
        self.classify = classify
        self.interval = interval
        self._peaks: dict[str, int] = defaultdict(int)
        self._peak_total = 0
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss-sampler", daemon=True)

    def start(self) -> "RssSampler":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def sample(self) -> dict[str, int]:
        per: dict[str, int] = defaultdict(int)
        seen: set[int] = set()
        for root in self.roots():
            try:
                rp = psutil.Process(root)
                procs = [rp] + rp.children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for p in procs:
                if p.pid in seen:
                    continue
                seen.add(p.pid)
                try:
                    group = self.classify(p)
                    if group is None:
                        continue
                    per[group] += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
        return dict(per)

    def _run(self) -> None:
        while not self._stop.is_set():
            per = self.sample()
            with self._lock:
                self._last = per
                for k, v in per.items():
                    self._peaks[k] = max(self._peaks[k], v)
                self._peak_total = max(self._peak_total, sum(per.values()))
            self._stop.wait(self.interval)

    def window(self) -> dict:
        """Peak RSS (MiB) per group and of the total since the last call; resets the peaks."""
        with self._lock:
            out = {
                "peak_total_mib": round(self._peak_total / 2**20, 1),
                "peak_by_process_mib": {k: round(v / 2**20, 1) for k, v in sorted(self._peaks.items())},
                "last_total_mib": round(sum(self._last.values()) / 2**20, 1),
            }
            self._peaks = defaultdict(int)
            self._peak_total = 0
        return out


def classify_serve(p: psutil.Process) -> Optional[str]:
    return serve_process_group(_title(p))


def classify_all(p: psutil.Process) -> Optional[str]:
    return "process"


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_descendants(pid: int, grace: float = 5.0) -> list[str]:
    """Terminate what is still running below ``pid`` (the benchmark's own children), by pid."""
    procs = descendants(pid)
    names = []
    for p in procs:
        try:
            names.append(f"{p.pid}:{_title(p)}")
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


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return pred()


def thread_cpu(pid: int) -> dict[int, tuple[float, Optional[float]]]:
    """Per thread of a process: (seconds on a CPU, seconds runnable but waiting for one).

    From ``/proc/PID/task/TID/schedstat``; the gap between wall time and the two is time asleep
    (a lock such as the GIL, an OpenMP barrier, I/O). Falls back to psutil CPU times (wait None)."""
    out: dict[int, tuple[float, Optional[float]]] = {}
    try:
        tids = [t.id for t in psutil.Process(pid).threads()]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return out
    for tid in tids:
        try:
            run_ns, wait_ns = Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[:2]
            out[tid] = (int(run_ns) / 1e9, int(wait_ns) / 1e9)
        except (OSError, ValueError):
            continue
    if not out:
        try:
            out = {t.id: (t.user_time + t.system_time, None) for t in psutil.Process(pid).threads()}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def busy_threads(before: dict[int, tuple], after: dict[int, tuple], wall_s: float) -> dict:
    """Which threads did the work between two ``thread_cpu`` samples: how many were busy
    (> 25% of one core), the busiest ones' share of the wall time on a CPU and waiting for one
    (runnable, preempted by another process). On-CPU + waiting < 1 for a thread that should
    never rest means it slept: a lock or a barrier, not CPU contention."""
    if wall_s <= 0:
        return {"cpu_cores_used": 0.0, "threads_over_25pct": 0, "top_thread_shares": [], "top_thread_runqueue": []}
    def delta(t: int) -> tuple[float, Optional[float]]:
        run0, wait0 = before.get(t, (0.0, 0.0))
        run1, wait1 = after[t]
        wait = None if wait0 is None or wait1 is None else (wait1 - wait0) / wall_s
        return (run1 - run0) / wall_s, wait

    shares = sorted((delta(t) for t in after), key=lambda x: x[0], reverse=True)
    return {
        "cpu_cores_used": round(sum(x for x, _ in shares), 3),
        "threads_over_25pct": sum(1 for x, _ in shares if x > 0.25),
        "top_thread_shares": [round(x, 3) for x, _ in shares[:4]],
        "top_thread_runqueue": [None if w is None else round(w, 3) for _, w in shares[:4]],
    }
