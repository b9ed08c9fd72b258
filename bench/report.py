"""``python -m bench report DIR... [--to OUT]``: report.md and the plot of any runner's output
directory rendered again from its JSON (after a change to a renderer, or to check one; the JSON is
not rewritten). ``--compare``: instead, the key numbers of several ``run`` reports side by side as
one Markdown table (each run's config overrides, 8-client throughput, p99 and mean batch, 1-client
TTFB, the target ratios, the load average at the start).

Which runner wrote a directory is read from its files: its JSON's name, or for a ``report.json``
what it holds. The studies' reports (bench/README.md, "Studies") are rendered by their own code.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from .lib.report import Col, Kind, Table, get

# JSON file name -> the runner module whose KIND renders it; report.json: by a key only it holds.
BY_FILE = {
    "realtime.json": "bench.realtime",
    "abuse.json": "bench.abuse",
    "batch.json": "bench.batch",
    "plan.json": "bench.plan",
    "streams.json": "bench.streams",
}
BY_KEY = {"steps": "bench.gpu", "stagger": "bench.fidelity", "ratios": "bench.run_report"}


def renderer(d: Path) -> tuple[Path, Kind]:
    """The JSON file of an output directory and the report kind that renders it."""
    for name, module in BY_FILE.items():
        if (d / name).exists():
            return d / name, importlib.import_module(module).KIND
    path = d / "report.json"
    report = json.loads(path.read_text()) if path.exists() else {}
    module = next((m for key, m in BY_KEY.items() if key in report), None)
    if module is None:
        raise ValueError("not the report of a runner of this revision (a study's? bench/README.md, 'Studies')")
    return path, importlib.import_module(module).KIND


def _overrides(row: tuple) -> str:
    return ", ".join(f"{k}={v}" for k, v in (get(row[1], "serve", "overrides") or {}).items()) or "(config defaults)"


def compare(dirs: list[str]) -> Table:
    from .run_report import TARGETS

    reports = []
    for d in dirs:
        if not (Path(d) / "report.json").exists():
            print(f"skip {d}: no report.json", file=sys.stderr)
            continue
        reports.append((Path(d).name, json.loads((Path(d) / "report.json").read_text())))
    return Table(
        [
            Col("run", 0),
            Col("overrides", _overrides),
            Col("c8 audio s/s", (1, "serve", "closed", 8, "audio_s_per_s"), nd=3),
            Col("c8 p99 s", (1, "serve", "closed", 8, "latency_s", "p99"), nd=3),
            Col("c8 mean batch", (1, "serve", "closed", 8, "engine", "mean_rows_per_step"), nd=3),
            Col("c1 TTFB p50", (1, "serve", "closed", 1, "ttfb_s", "p50"), nd=3),
            *[Col(k, (1, "ratios", k), nd=3) for k in TARGETS],
            Col("loadavg", (1, "meta", "loadavg_start")),
        ],
        reports,
    )


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dirs", nargs="+", help="output directories of any runner")
    p.add_argument("--to", help="write the rendered files here (one subdirectory per DIR) instead of next to the JSON")
    p.add_argument("--compare", action="store_true", help="print one table of the key numbers of `run` reports")


def main(a: argparse.Namespace) -> int:
    if a.compare:
        print("\n".join(compare(a.dirs).lines()))
        return 0
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
