"""``python -m bench report DIR... [--to OUT]``: render reports again from their JSON (after a
change to a renderer, or to check one): report.md and the plot of any subcommand's output
directory. Which subcommand wrote a directory is read from its files: its JSON's name
(``realtime.json``, ``abuse.json``...), or for a ``report.json`` what it holds: a ``timeline``
(autoscale), ``steps`` (gpu), ``current`` (step), ``stagger`` (fidelity), or else a run's.
The JSON itself is not rewritten."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .lib.report import Kind

# JSON file name -> the module whose KIND renders it; report.json: by a key it holds, then `run`.
BY_FILE = {
    "realtime.json": "bench.realtime",
    "abuse.json": "bench.abuse",
    "batch.json": "bench.batch",
    "dialogue.json": "bench.studies.dialogue",
    "jobs.json": "bench.studies.jobs",
    "memory.json": "bench.studies.memory",
    "fairness.json": "bench.studies.fairness",
    "vocoder.json": "bench.studies.vocoder",
}
BY_KEY = {
    "timeline": "bench.studies.autoscale",
    "steps": "bench.gpu_report",
    "current": "bench.studies.step",
    "stagger": "bench.fidelity",
}


def renderer(d: Path) -> tuple[Path, Kind]:
    """The JSON file of an output directory and the report kind that renders it."""
    for name, module in BY_FILE.items():
        if (d / name).exists():
            return d / name, importlib.import_module(module).KIND
    path = d / "report.json"
    report = json.loads(path.read_text())
    module = next((m for key, m in BY_KEY.items() if key in report), "bench.run_report")
    return path, importlib.import_module(module).KIND


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="output directories of any subcommand")
    p.add_argument("--to", help="write the rendered files here (one subdirectory per DIR) instead of next to the JSON")


def main(a: argparse.Namespace) -> int:
    failed = 0
    for name in a.dirs:
        d = Path(name)
        try:
            path, kind = renderer(d)
        except (OSError, ValueError) as exc:
            print(f"{d}: no report ({exc})", file=sys.stderr)
            failed += 1
            continue
        out = Path(a.to) / d.name if a.to else d
        out.mkdir(parents=True, exist_ok=True)
        kind.render(json.loads(path.read_text()), out)
        print(f"{path} rendered into {out}")
    return 1 if failed else 0
