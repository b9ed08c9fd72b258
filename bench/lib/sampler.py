"""The one periodic thread of the bench: ``Periodic`` calls ``tick()`` every ``interval_s`` seconds
on a daemon thread until ``stop()`` (a tick that raises counts in ``missed``); ``RssSampler`` (RSS
of groups of processes, peaks per window), ``GpuSampler`` (``nvidia-smi``: peak memory, mean
utilisation per window) and ``run``'s progress bar tick with it."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections import defaultdict
from typing import Callable, Optional

import psutil

from .machine import processes_by_group


class Periodic:
    def __init__(self, interval_s: float, name: str):
        self.interval_s = interval_s
        self.missed = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def start(self):
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=timeout_s)

    def _run(self) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a missed sample, not a failed run
                self.missed += 1
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))


class RssSampler(Periodic):
    """RSS of groups of processes every ``interval_s`` (0.5 s): ``roots()`` gives the pids whose
    descendants are looked at, ``classify`` maps a process to its group (None: skipped).
    ``window()`` returns the peaks since the last call."""

    def __init__(
        self,
        roots: Callable[[], list[int]],
        classify: Callable[[psutil.Process], Optional[str]],
        interval_s: float = 0.5,
    ):
        super().__init__(interval_s, "rss-sampler")
        self.roots = roots
        self.classify = classify
        self._peaks: dict[str, int] = defaultdict(int)
        self._peak_total = 0
        self._last: dict[str, int] = {}

    def sample(self) -> dict[str, int]:
        per: dict[str, int] = defaultdict(int)
        for group, procs in processes_by_group(self.roots(), self.classify).items():
            for p in procs:
                try:
                    per[group] += p.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
        return dict(per)

    def tick(self) -> None:
        per = self.sample()
        with self._lock:
            self._last = per
            for k, v in per.items():
                self._peaks[k] = max(self._peaks[k], v)
            self._peak_total = max(self._peak_total, sum(per.values()))

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


class GpuSampler(Periodic):
    """``nvidia-smi`` once a second: peak memory used and mean utilisation of the GPU between two
    ``window()`` calls (None without nvidia-smi: dry runs)."""

    QUERY = ["nvidia-smi", "--query-gpu=memory.used,utilization.gpu", "--format=csv,noheader,nounits"]

    def __init__(self, interval_s: float = 1.0):
        super().__init__(interval_s, "gpu-sampler")
        self.available = shutil.which("nvidia-smi") is not None
        self._samples: list[tuple[float, float]] = []

    def start(self) -> "GpuSampler":
        return super().start() if self.available else self

    def tick(self) -> None:
        line = subprocess.run(self.QUERY, capture_output=True, text=True, timeout=5).stdout.splitlines()[0]
        mem, util = (float(x) for x in line.split(","))
        with self._lock:
            self._samples.append((mem, util))

    def window(self) -> Optional[dict]:
        if not self.available:
            return None
        with self._lock:
            samples, self._samples = self._samples, []
        if not samples:
            return {"samples": 0}
        return {
            "samples": len(samples),
            "mem_used_peak_mib": max(m for m, _ in samples),
            "util_mean_pct": round(sum(u for _, u in samples) / len(samples), 1),
        }
