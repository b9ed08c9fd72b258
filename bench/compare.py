"""``python -m bench compare DIR...``: the key numbers of several ``run`` reports side by side, as
one Markdown table (for tuning: each run's config overrides, 8-client throughput, p99 and mean
batch, 1-client TTFB, the target ratios and the load average at the start)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .lib.report import fmt, get
from .run_report import TARGETS


def add_arguments(c: argparse.ArgumentParser) -> None:
    c.add_argument("dirs", nargs="+", help="output directories of `python -m bench run`")


def main(a: argparse.Namespace) -> int:
    rows = []
    for d in a.dirs:
        p = Path(d) / "report.json"
        if not p.exists():
            print(f"skip {d}: no report.json", file=sys.stderr)
            continue
        r = json.loads(p.read_text())
        ov = get(r, "serve", "overrides") or {}
        s8 = get(r, "serve", "closed", "8") or {}
        s1 = get(r, "serve", "closed", "1") or {}
        rows.append(
            [
                Path(d).name,
                ", ".join(f"{k}={v}" for k, v in ov.items()) or "(config defaults)",
                s8.get("audio_s_per_s"),
                get(s8, "latency_s", "p99"),
                get(s8, "engine", "mean_rows_per_step"),
                get(s1, "ttfb_s", "p50"),
                *[(r.get("ratios") or {}).get(k) for k in TARGETS],
                (r.get("meta") or {}).get("loadavg_start"),
            ]
        )
    head = ["run", "overrides", "c8 audio s/s", "c8 p99 s", "c8 mean batch", "c1 TTFB p50", *TARGETS, "loadavg"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for row in rows:
        print("| " + " | ".join(fmt(v, 3) for v in row) + " |")
    return 0
