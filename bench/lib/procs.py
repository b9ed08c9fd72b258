"""Processes the bench starts and watches: free ports, subprocesses that always get stopped,
process groups by title, waits, per-thread CPU time.

``ManagedProcess`` is the one class for every process the bench starts (the ceiling, the
baseline server, the GPU check's pytest and ceiling, py-spy, the nodes of a local cluster): its
own process group, its output in a log file, ``stop()`` that escalates SIGINT, SIGTERM, SIGKILL
and then ends whatever is left in the group, and, with a ``marker``, every process it started
anywhere (found by that variable in their environment: Ray's processes leave the group).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
MARKER_ENV = "CHATTTS_LOCAL_CLUSTER"  # name kept: the cluster tests and Ray's processes carry it

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


def bench_command(subcommand: str, *args: str) -> list[str]:
    """``python -m bench SUBCOMMAND ARGS...`` with this interpreter (run from ``REPO_ROOT``)."""
    return [sys.executable, "-m", "bench", subcommand, *args]


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
        env = dict(env or bench_env())
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
                wait_until(lambda: not marked(self.marker), grace_s, interval=0.2)
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
    proc = ManagedProcess(name, argv, log_path, env=env)
    try:
        rc = proc.wait(timeout=timeout_s)
    finally:
        proc.stop()
    return rc, proc.log_tail()


# ------------------------------------------------------------------ processes by title or marker


def _title(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
        return cmd[0] if cmd else p.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "?"


def command_of(p: psutil.Process) -> str:
    """A process's command line (its first 120 characters), "?" once it is gone."""
    try:
        return " ".join(p.cmdline())[:120]
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


def classify_serve(p: psutil.Process) -> Optional[str]:
    return serve_process_group(_title(p))


def classify_all(p: psutil.Process) -> Optional[str]:
    return "process"


def processes_by_group(
    roots: Iterable[int], classify: Callable[[psutil.Process], Optional[str]]
) -> dict[str, list[psutil.Process]]:
    """The roots and all their descendants, each once, by ``classify`` (None: left out)."""
    out: dict[str, list[psutil.Process]] = {}
    seen: set[int] = set()
    for root in roots:
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
                group = classify(p)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            if group is not None:
                out.setdefault(group, []).append(p)
    return out


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


# ------------------------------------------------------------------ the machine, waiting


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def wait_for(probe: Callable[[], Any], timeout_s: float, interval_s: float = 1.0, what: str = "condition") -> Any:
    """Call ``probe`` every ``interval_s`` until it returns something true, and return that; an
    HTTP, value or key error counts as not yet. TimeoutError after ``timeout_s``."""
    import httpx

    deadline = time.monotonic() + timeout_s
    last = None
    while True:
        try:
            last = probe()
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s (last: {last!r})")
        time.sleep(interval_s)


def wait_until(pred: Callable[[], bool], timeout: float, interval: float = 0.5) -> bool:
    """``wait_for`` as a yes or no: whether ``pred`` came true within ``timeout``."""
    try:
        wait_for(pred, timeout, interval)
        return True
    except TimeoutError:
        return False


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


def machine_part(p: psutil.Process, me: int) -> str:
    """Which part of a benchmark's machine a process is: a Serve replica's deployment, the proxy,
    the Serve controller, the load generator (``me``), the rest of Ray (its daemons, other
    actors), or anything else."""
    if p.pid == me:
        return "load generator"
    group = serve_process_group(_title(p))
    if group == "ProxyActor":
        return "proxy"
    if group == "ServeController":
        return "Serve controller"
    if group is not None:
        return group
    cmd = command_of(p)
    return "Ray (daemons, other actors)" if cmd.startswith("ray::") or "/ray/" in cmd else "other"


def machine_cpu() -> dict[int, tuple[str, float]]:
    """Every process on the machine now: pid -> (its ``machine_part``, CPU seconds so far)."""
    out: dict[int, tuple[str, float]] = {}
    me = os.getpid()
    for p in psutil.process_iter():
        try:
            t = p.cpu_times()
            out[p.pid] = (machine_part(p, me), t.user + t.system)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def machine_cores(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], wall_s: float) -> dict:
    """Cores each part of the machine used between two ``machine_cpu`` samples (a process that
    exited between them is missing: a phase's processes live through it), and the cores left idle."""
    if wall_s <= 0:
        return {}
    parts: dict[str, float] = {}
    for pid, (part, cpu) in after.items():
        prev = before.get(pid)
        parts[part] = parts.get(part, 0.0) + (cpu - (prev[1] if prev and prev[0] == part else 0.0)) / wall_s
    used = {k: round(v, 3) for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.0005}
    return {"cores": used, "idle": round(max(0.0, (psutil.cpu_count() or 1) - sum(used.values())), 3)}


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
