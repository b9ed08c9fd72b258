"""``python -m bench <subcommand>``: every entry point of the bench (see bench/README.md).

Only the module of the subcommand that runs is imported (the subprocesses the bench starts are
subcommands too, and some of them measure their own memory).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

# subcommand: (module, one line of help). Runners first, then the tools and studies.
SUBCOMMANDS = {
    "run": ("bench.run", "ceiling, baseline and the project under load; writes report.json/.md/.png"),
    "ceiling": ("bench.ceiling", "the model alone, in-process: audio s/s by batch size, the first chunk's time"),
    "baseline": ("bench.baseline", "the 'before' server (one Chat.infer at a time), for `run` or by hand"),
    "cache-hit": ("bench.cache_hit", "latency and throughput of the response cache against a running app"),
    "realtime": (
        "bench.realtime",
        "WebSocket sessions fed like an LLM writes: first audio vs HTTP TTFB, playback gaps",
    ),
    "vocoder": ("bench.vocoder", "the Vocoder stage alone: audio s/s per core, today's path vs the optimised one, SNR"),
    "fidelity": (
        "bench.fidelity",
        "batch invariance: rows alone vs batched vs ChatTTS's own decode, int8 and float32, deep and full size",
    ),
    "step": (
        "bench.step",
        "the decode step: GPT forward vs the rest, batch 1/8/16, tiny and full size, int8 vs float32",
    ),
    "batch": (
        "bench.batch",
        "bulk synthesis (chattts-serve batch) against the service on one corpus; 1 vs 2 acoustic actors",
    ),
    "dialogue": ("bench.dialogue", "a ten-turn, two-voice dialogue: /v1/audio/dialogue vs the turns one after another"),
    "jobs": ("bench.jobs", "an interactive client's first audio alone and beside a running background job"),
    "memory": (
        "bench.memory",
        "where the model stages' memory goes, in-process: RSS per load and decode step, KV, mappings",
    ),
    "fairness": (
        "bench.fairness",
        "the engine alone: a polite client's first chunk beside a client with 200 queued segments",
    ),
    "abuse": (
        "bench.abuse",
        "a polite client's first audio alone and under eight attackers (costly requests, idle sockets, slow bodies, "
        "flush floods, dot jobs, silence dialogues, public-page keys, unkeyed slow bodies)",
    ),
    "autoscale": (
        "bench.autoscale",
        "step load on a local multi-node cluster: replicas, engine queue, latency per second",
    ),
    "gpu": ("bench.gpu", "the one-command GPU check: gpu tests, ceiling, Serve 2x0.5 vs 1x1 GPU (~8 min)"),
    "gpu-ceiling": ("bench.gpu_steps", "(the GPU check's ceiling step, in its own process)"),
    "compare": ("bench.compare", "key numbers of several `run` reports side by side (markdown)"),
    "report": ("bench.report", "render reports again from their JSON (report.md, report.png, timeline.png)"),
    "numerics": ("bench.studies.numerics", "study: int8 vs float32 GPT linear layers (kernels, profile)"),
    "text-compare": ("bench.studies.text_compare", "study: our number rules against WeTextProcessing"),
}
# Subcommands whose module serves another one too: (add_arguments, main) by name.
_ENTRY = {"gpu-ceiling": ("add_worker_arguments", "ceiling_worker")}


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m bench", description="chattts-serve benchmarks (bench/README.md)")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="SUBCOMMAND")
    chosen = next((x for x in argv if not x.startswith("-")), None)
    for name, (module, text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=text, description=text)
        if name == chosen:
            mod = importlib.import_module(module)
            add_name, main_name = _ENTRY.get(name, ("add_arguments", "main"))
            getattr(mod, add_name)(p)
            p.set_defaults(main=getattr(mod, main_name), argv=argv)
            if mod.__doc__:
                p.description = mod.__doc__.strip().split("\n\n")[0]
                p.formatter_class = argparse.RawDescriptionHelpFormatter
    a = ap.parse_args(argv)
    return a.main(a)


if __name__ == "__main__":
    sys.exit(main())
