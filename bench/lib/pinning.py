"""The decode on cores of its own (``python -m bench run --pin-acoustic 0``, bench/README.md): the
Acoustic replicas' threads on some CPUs, every other process of the run (Vocoder, Ingress, proxy,
Ray's daemons, the load generator) on the rest, the ceiling measured on the same CPUs. Linux only
(``sched_setaffinity`` per thread); threads and processes started later inherit their starter's set.
"""

from __future__ import annotations

import os
from pathlib import Path

import psutil


def cpu_set(spec: str, leave_rest: bool = True) -> set[int]:
    """``"0"``, ``"0,2"`` or ``"0-3"`` -> the CPUs, each one this process may run on (and, with
    ``leave_rest``, not all of them: the rest of the graph needs one)."""
    cpus: set[int] = set()
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    allowed = os.sched_getaffinity(0)
    if not cpus or not cpus <= allowed:
        raise ValueError(f"CPUs {spec!r} are not a non-empty subset of this process's {sorted(allowed)}")
    if leave_rest and cpus == allowed:
        raise ValueError(f"CPUs {spec!r} leave no CPU for the rest of the graph")
    return cpus


def pin_threads(pid: int, cpus: set[int]) -> int:
    """Every thread of ``pid`` onto ``cpus`` (``sched_setaffinity`` of a pid moves one thread);
    the threads moved."""
    moved = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
            moved += 1
        except OSError:
            pass  # ended meanwhile, or not ours to move
    return moved


def pin_acoustic(root: int, acoustic_pids: list[int], cpus: set[int]) -> dict:
    """The Acoustic replicas on ``cpus``, ``root`` (the bench process: the load generator, and the
    driver whose children are Ray's daemons and workers) and every other process under it on the
    rest of its CPUs; nothing else on the machine is touched. What was moved, for the report;
    ``pin_threads(root, cpus_before)`` gives the bench process its CPUs back."""
    rest = os.sched_getaffinity(root) - cpus
    moved = {"acoustic": 0, "rest": 0}
    top = psutil.Process(root)
    for p in [top, *top.children(recursive=True)]:
        if p.pid in acoustic_pids:
            moved["acoustic"] += pin_threads(p.pid, cpus)
        else:
            moved["rest"] += pin_threads(p.pid, rest)
    return {"acoustic_cpus": sorted(cpus), "rest_cpus": sorted(rest), "threads_moved": moved}
