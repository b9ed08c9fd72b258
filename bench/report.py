"""``python -m bench report DIR... [--to OUT]``: render reports again from their JSON (after a
change to a renderer, or to check one): report.md and report.png of ``run`` and ``gpu``,
report.md of ``realtime``, timeline.png of ``autoscale``. Which runner wrote a directory is read
from its files: ``realtime.json``; a ``report.json`` with a ``timeline`` (autoscale), with
``steps`` (gpu), or else a run's. The JSON itself is not rewritten."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable


def renderer(d: Path) -> tuple[Path, Callable[[dict, Path], None]]:
    """The JSON file of an output directory and the function that renders it."""
    if (d / "realtime.json").exists():
        from .realtime import render

        return d / "realtime.json", render
    path = d / "report.json"
    report = json.loads(path.read_text())
    if "timeline" in report:
        from .autoscale import render
    elif "steps" in report:
        from .gpu_report import render
    else:
        from .run_report import render
    return path, render


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="output directories of run, gpu, realtime or autoscale")
    p.add_argument("--to", help="write the rendered files here (one subdirectory per DIR) instead of next to the JSON")


def main(a: argparse.Namespace) -> int:
    failed = 0
    for name in a.dirs:
        d = Path(name)
        try:
            path, render = renderer(d)
        except (OSError, ValueError) as exc:
            print(f"{d}: no report ({exc})", file=sys.stderr)
            failed += 1
            continue
        out = Path(a.to) / d.name if a.to else d
        out.mkdir(parents=True, exist_ok=True)
        render(json.loads(path.read_text()), out)
        print(f"{path} rendered into {out}")
    return 1 if failed else 0
