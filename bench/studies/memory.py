"""Where the model stages' memory goes, in-process, one process per stage (no Serve).

Each stage runs in a fresh interpreter and records its RSS (VmRSS, anonymous and file-backed
parts, from ``/proc/self/status``) after each step of what its Serve replica does:

* ``acoustic``: import torch, import the engine, ``load_model(audio=False)`` (full-size random
  weights, ``--quantize``: the GPT's part alone, as the replica loads it); then the ``AcousticEngine`` decodes N rows of the
  corpus' mean segment length (``--rows``), all joining at once and one joining every 8 steps
  (each admission merges into the running batch), with the peak RSS and the peak size of the
  batch's KV buffers sampled after every step;
* ``vocoder``: import, ``load_vocoder``, ``Vocoder``, ``load_voice_encoder``, the warm-up, the
  loader's modules dropped (as the replica's ``__init__`` ends), 8 wav and 8 mp3 streams of
  random hidden states, then the first clip encoded.

At the end of each: the largest mappings (``/proc/self/smaps``: the heap, anonymous memory,
each file) and, for the acoustic stage, the RSS once the heap's free pages went back
(``malloc_trim``). A Serve replica adds Ray's worker (~150 MiB: an Ingress replica, no torch, is
~160 MiB) to these figures.

    python -m bench memory --out bench/results/memory-DATE [--stages acoustic,vocoder] [--quantize auto]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ..lib.harness import command_line, git_revision, ints, logger, now
from ..lib.procs import REPO_ROOT, load_average
from ..lib.report import Col, Doc, Kind, fmt

_log = logger("memory")
STAGES = ("acoustic", "vocoder")


# ---------------------------------------------------------------------------------- in the worker


def status_mib() -> dict[str, int]:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[{"VmRSS": "rss", "VmHWM": "hwm", "RssAnon": "anon", "RssFile": "file"}[key]] = (
                int(value.split()[0]) // 1024
            )
    return out


def short_path(path: str) -> str:
    """A mapped file's name without this machine's directories (reports are committed): relative to
    the venv or the Python install, else the file's own name."""
    for root in (sys.prefix, sys.base_prefix):
        if path.startswith(root + os.sep):
            return os.path.relpath(path, root)
    return os.path.basename(path)


def largest_mappings(n: int = 12) -> list[dict]:
    """RSS per mapping name (a file, ``[heap]``, ``[anon]`` for unnamed anonymous memory)."""
    rows: dict[str, int] = {}
    name = "[anon]"
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):
            name = parts[5] if len(parts) > 5 else "[anon]"
            name = name if name.startswith("[") else short_path(name)
        elif parts and parts[0] == "Rss:":
            rows[name] = rows.get(name, 0) + int(parts[1])
    top = sorted(rows.items(), key=lambda kv: -kv[1])[:n]
    return [{"mapping": k, "rss_mib": v // 1024} for k, v in top]


class Phases:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def mark(self, phase: str, **extra: Any) -> dict:
        row = {"phase": phase, **status_mib(), **extra}
        self.rows.append(row)
        _log(f"{phase}: {row}")
        return row


def acoustic(weights: str, quantize: str, dual_layout: bool, rows: list[int], threads: int) -> dict:
    ph = Phases()
    ph.mark("start")
    import torch

    ph.mark("import torch")
    import dataclasses

    from serve_app.engine.acoustic import AcousticConfig, AcousticEngine
    from serve_app.engine.config import ModelConfig, SegmentConfig, WeightsConfig
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions
    from serve_app.engine.weights.loading import load_model

    from ..lib.corpus import load_corpus

    ph.mark("import engine")
    torch.set_grad_enabled(False)
    model = load_model(
        ModelConfig(
            weights=WeightsConfig(source=weights), torch_threads=threads, quantize=quantize, cpu_dual_layout=dual_layout
        ),
        audio=False,
    )
    ph.mark("load_model", quantize=model.quantize)
    planner = Planner(SegmentConfig())
    planner.warmup()
    segs = [s for text in load_corpus() for s in planner.plan(text, SynthesisOptions()).segments]
    mean = round(sum(s.target_tokens for s in segs) / len(segs))
    ranked = sorted(range(len(segs)), key=lambda i: (abs(segs[i].target_tokens - mean), i))
    engine = AcousticEngine(model, AcousticConfig(max_rows=max(rows) + 1, token_budget=1 << 20))

    def kv_mib() -> float:
        storages = {
            t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in engine.batch.kbuf + engine.batch.vbuf
        }
        return sum(storages.values()) / 2**20

    decodes = []
    for n in rows:
        for stagger in (0, 8):
            reqs = [dataclasses.replace(segs[i], seed=1000 + j) for j, i in enumerate(ranked[:n])]
            streams, submitted, steps, peak_rss, peak_kv = [], 0, 0, 0, 0.0
            t0 = time.perf_counter()
            while True:
                if submitted < n and (stagger == 0 or steps % stagger == 0):
                    k = n if stagger == 0 else 1
                    streams += [engine.submit(r) for r in reqs[submitted : submitted + k]]
                    submitted += k
                busy = engine.step()
                steps += 1
                peak_rss, peak_kv = max(peak_rss, status_mib()["rss"]), max(peak_kv, kv_mib())
                if not busy and submitted >= n:
                    break
            for s in streams:
                for _ in s:
                    pass
            row = ph.mark(
                f"decode {n} rows, " + ("together" if not stagger else f"one joining every {stagger} steps"),
                peak_rss=peak_rss,
                peak_kv_mib=round(peak_kv, 1),
                steps=steps,
                seconds=round(time.perf_counter() - t0, 1),
            )
            decodes.append(
                {"rows": n, "stagger": stagger, **{k: row[k] for k in ("peak_rss", "peak_kv_mib", "steps", "seconds")}}
            )
    try:
        from serve_app.engine.weights.loading import release_free_memory
    except ImportError:  # a revision before it (measured for before/after)
        import ctypes

        def release_free_memory() -> None:
            ctypes.CDLL("libc.so.6").malloc_trim(0)

    release_free_memory()
    ph.mark("free pages returned (malloc_trim)")
    return {
        "stage": "acoustic",
        "quantize": model.quantize,
        "cpu_dual_layout": dual_layout,
        "mean_tokens": mean,
        "phases": ph.rows,
        "decodes": decodes,
        "mappings": largest_mappings(),
    }


def vocoder(weights: str) -> dict:
    ph = Phases()
    ph.mark("start")
    import torch

    ph.mark("import torch")
    import numpy as np

    from serve_app.engine.assembly import AudioAssembler
    from serve_app.engine.clips import load_voice_encoder
    from serve_app.engine.config import ModelConfig, VocoderConfig, WeightsConfig
    from serve_app.engine.vocoder import VocoderEngine
    from serve_app.engine.weights.loading import load_vocoder

    ph.mark("import engine")
    torch.set_grad_enabled(False)
    cfg = ModelConfig(weights=WeightsConfig(source=weights), torch_threads=1)

    def init() -> tuple[Any, Any]:  # the replica's __init__: the loader's result is dropped at its end
        parts = load_vocoder(cfg)
        ph.mark("load_vocoder")
        voc = VocoderEngine(parts, VocoderConfig())
        ph.mark("Vocoder", precision=str(voc.dtype))
        enc = load_voice_encoder(cfg)
        ph.mark("load_voice_encoder")
        voc.decode(torch.zeros(8, 768))
        ph.mark("warm-up decode")
        return voc, enc

    voc, enc = init()
    ph.mark("loader's modules dropped")
    g = torch.Generator().manual_seed(0)
    for fmt_ in ("wav", "mp3"):
        asms = [AudioAssembler(voc, fmt_, VocoderConfig()) for _ in range(8)]
        for step in range(8):
            for a in asms:
                a.feed(0, torch.randn(12 if step == 0 else 24, 768, generator=g), step == 7)
        for a in asms:
            a.close()
        ph.mark(f"8 {fmt_} streams")
    del asms
    t = np.arange(3 * 24000) / 24000
    pcm = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32)
    t0 = time.perf_counter()
    enc.encode(pcm)
    ph.mark("first clip encoded", seconds=round(time.perf_counter() - t0, 2))
    return {"stage": "vocoder", "phases": ph.rows, "mappings": largest_mappings()}


def worker(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("stage", choices=STAGES)
    ap.add_argument("--weights", default="random")
    ap.add_argument("--quantize", default="auto")
    ap.add_argument("--no-dual-layout", action="store_true")
    ap.add_argument("--rows", type=ints, default=[8, 16])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", required=True)
    a = ap.parse_args(argv)
    if a.stage == "acoustic":
        res = acoustic(a.weights, a.quantize, not a.no_dual_layout, a.rows, a.threads)
    else:
        res = vocoder(a.weights)
    Path(a.json).write_text(json.dumps(res))
    return 0


# ---------------------------------------------------------------------------------- runner


def run_stage(stage: str, a: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / f"{stage}.json"
        argv = [
            sys.executable,
            "-c",
            "import sys, bench.memory as m; sys.exit(m.worker(sys.argv[1:]))",
            stage,
            "--weights",
            a.weights,
            "--quantize",
            a.quantize,
            "--rows",
            ",".join(map(str, a.rows)),
            "--threads",
            str(a.threads),
            "--json",
            str(out),
        ] + (["--no-dual-layout"] if a.no_dual_layout else [])
        subprocess.run(
            argv,
            check=True,
            cwd=str(REPO_ROOT),
            env={**os.environ, "OMP_NUM_THREADS": str(a.threads if stage == "acoustic" else 1)},
        )
        return json.loads(out.read_text())


PHASES = [
    Col("after", "phase"),
    Col("RSS", "rss", right=True),
    Col("anon", "anon", right=True),
    Col("file", "file", right=True),
    Col("peak RSS", lambda p: str(p.get("peak_rss", "")), right=True),
    Col("peak KV", lambda p: fmt(p["peak_kv_mib"], 1) if "peak_kv_mib" in p else "", right=True),
]
MAPPINGS = [Col("mapping", lambda m: f"`{m['mapping']}`"), Col("RSS", "rss_mib", right=True)]


def to_doc(r: dict) -> Doc:
    doc = Doc(f"Memory of the model stages, in-process ({r['revision']}, {r['started']})", r["command"], end="")
    doc.add(
        f"Load average at the start {r['load_average']}. RSS in MiB (anonymous + file-backed); a Serve replica "
        "adds Ray's worker (~150 MiB).",
        "",
    )
    for res in r["stages"]:
        title = res["stage"] + (
            f" (quantize {res['quantize']}, dual layout {res['cpu_dual_layout']}, rows of {res['mean_tokens']} tokens)"
            if res["stage"] == "acoustic"
            else ""
        )
        doc.table(PHASES, res["phases"], before=(f"## {title}", ""))
        doc.table(MAPPINGS, res["mappings"], before=("", "Largest mappings at the end:", "")).add("")
    return doc


KIND = Kind("memory.json", to_doc)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=None, help="directory (default bench/results/memory-<time>/)")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--weights", default="random")
    ap.add_argument("--quantize", default="auto", help="the acoustic stage's model.quantize")
    ap.add_argument("--no-dual-layout", action="store_true", help="float32: without the transposed weight copy")
    ap.add_argument("--rows", type=ints, default=[8, 16], help="rows decoded together (acoustic)")
    ap.add_argument("--threads", type=int, default=2, help="the acoustic stage's torch threads (as its replica)")


def main(a: argparse.Namespace) -> int:
    out: Path = a.out or REPO_ROOT / "bench" / "results" / f"memory-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    report: dict = {
        "command": command_line(a.argv, out),
        "revision": git_revision(),
        "started": now(),
        "load_average": load_average(),
        "stages": [],
    }
    for stage in a.stages.split(","):
        _log(f"stage {stage}")
        report["stages"].append(run_stage(stage, a))
        KIND.write(report, out)
    return 0
