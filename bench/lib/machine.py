"""The machine's processes as parts of what a run measures: which part of the Serve graph each
process is (by its title: a replica's deployment, the proxy, the controller), the processes of
each part, and the CPU time they and their threads use (``thread_cpu``, ``busy_threads``,
``machine_cpu`` / ``machine_cores``: every process on the machine, by part)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable, Iterable, Optional

import psutil

from .procs import command_of


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
