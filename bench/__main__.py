"""``python -m bench <runner>``: every entry point of the bench (bench/README.md).

A runner is one module with ``add_arguments(parser)`` and ``main(args) -> exit status`` and one line
in ``RUNNERS``. Only the module of the runner that runs is imported (the subprocesses the bench
starts are runners too, and some of them measure their own memory).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

# name: (module, one line of help). The runners, then the tools they use or that read their reports.
RUNNERS = {
    "run": ("bench.run", "ceiling, baseline and the project under load; writes report.json/.md/.png"),
    "ceiling": ("bench.ceiling", "the model alone, in-process: audio s/s by batch size, the first chunk's time"),
    "realtime": ("bench.realtime", "WebSocket sessions fed like an LLM writes: first audio vs HTTP TTFB, gaps"),
    "streams": (
        "bench.streams",
        "listeners playing streamed answers at 1x past capacity: stalls, refusals, fair vs deadline",
    ),
    "gpu": ("bench.gpu", "the one-command GPU check: gpu tests, fidelity, ceiling, Serve 2x0.5 vs 1x1 GPU (~8 min)"),
    "fidelity": ("bench.fidelity", "batch invariance: rows alone vs batched vs ChatTTS's own decode"),
    "abuse": ("bench.abuse", "a polite client's first audio alone and under eight kinds of attacker"),
    "batch": ("bench.batch", "bulk synthesis (chattts-serve batch) against the service; 1 vs 2 speech actors"),
    "baseline": ("bench.baseline", "the 'before' server (one Chat.infer at a time), for `run` or by hand"),
    "cache-hit": ("bench.cache_hit", "latency and throughput of the response cache against a running app"),
    "report": ("bench.report", "render reports again from their JSON, or compare `run` reports (--compare)"),
}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench", description="chattts-serve benchmarks (bench/README.md)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="RUNNER")
    chosen = next((x for x in argv if not x.startswith("-")), None)
    for name, (module, text) in RUNNERS.items():
        p = sub.add_parser(name, help=text, description=text)
        if name == chosen:
            mod = importlib.import_module(module)
            mod.add_arguments(p)
            p.set_defaults(main=mod.main, argv=argv)
            if mod.__doc__:
                p.description = mod.__doc__.strip().split("\n\n")[0]
                p.formatter_class = argparse.RawDescriptionHelpFormatter
    a = ap.parse_args(argv)
    return a.main(a)


if __name__ == "__main__":
    sys.exit(main())
