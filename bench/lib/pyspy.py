"""py-spy profiles of Serve replicas during a phase (``run --profile``): ``py-spy record --nonblocking
--format raw`` (the replica is not paused), summarised by leaf function (self time) and by a few
stages of the decode loop (inclusive); the raw stacks stay in DIR/profile/ for flame graphs."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Optional

from .procs import ManagedProcess

# Inclusive buckets: a sample counts for the first of these frames found in its stack.
STAGES = [
    ("prefill (admission)", "_prefill"),
    ("merge KV (admission)", "merge (serve_app/engine/decode/batch.py"),
    ("retire rows (KV filter)", "_retire"),
    ("sampling per row", "_sample_and_advance"),
    ("GPT forward (decode)", "_decode_step"),
    ("vocoder decode", "decode (serve_app/engine/vocoder.py"),
    ("audio encode", "serve_app/engine/audio.py"),
    ("ray serve / rpc", "ray/"),
]


def py_spy() -> Optional[str]:
    exe = Path(sys.executable).with_name("py-spy")
    if exe.exists():
        return str(exe)
    return shutil.which("py-spy")


class Recorder:
    """``start()`` one py-spy per process, ``finish()`` waits for them and summarises each; the
    report names each raw file by ``record_path`` (the run's path relative to its output)."""

    def __init__(self, out_dir: Path, record_path: Callable[[Path], str] = str):
        self.out_dir = out_dir
        self.record_path = record_path
        self.procs: list[tuple[str, Path, ManagedProcess]] = []

    def start(self, name: str, pid: int, duration_s: float, rate: int = 50) -> bool:
        exe = py_spy()
        if exe is None:
            return False
        self.out_dir.mkdir(parents=True, exist_ok=True)
        out = self.out_dir / f"{name}.txt"
        argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, int(duration_s))), "--rate", str(rate)]
        argv += ["--format", "raw", "--nonblocking", "--output", str(out)]
        self.procs.append((name, out, ManagedProcess(f"py-spy {name}", argv, self.out_dir / f"{name}.log")))
        return True

    def finish(self, timeout_s: float = 60) -> dict:
        out = {}
        for name, path, proc in self.procs:
            proc.wait(timeout=timeout_s)
            proc.stop()
            if path.exists():
                out[name] = summarize_raw(path.read_text(errors="replace"))
                out[name]["raw"] = self.record_path(path)
            else:
                out[name] = {"error": (self.out_dir / f"{name}.log").read_text(errors="replace")[-500:]}
        self.procs.clear()
        return out


def summarize_raw(text: str, top: int = 15) -> dict:
    leaf: Counter = Counter()
    stage: Counter = Counter()
    total = 0
    for line in text.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        total += n
        frames = stack.split(";")
        leaf[frames[-1]] += n
        for label, needle in STAGES:
            if any(needle in f for f in frames):
                stage[label] += n
                break
        else:
            stage["other"] += n
    pct = (lambda c: round(100.0 * c / total, 1)) if total else (lambda c: 0.0)
    return {
        "samples": total,
        "stages_pct": {k: pct(v) for k, v in stage.most_common()},
        "top_self_pct": [[k, pct(v)] for k, v in leaf.most_common(top)],
    }
