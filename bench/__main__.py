"""``python -m bench <subcommand>``: every entry point of the bench (see bench/README.md).

Only the module of the subcommand that runs is imported (the subprocesses the bench starts are
subcommands too, and some of them measure their own memory).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional

# subcommand: (module, one line of help). The runners, then the tools they use or that read their
# reports, then the studies (bench/studies/: measurements behind one code choice).
SUBCOMMANDS = {
    "run": ("bench.run", "ceiling, baseline and the project under load; writes report.json/.md/.png"),
    "ceiling": ("bench.ceiling", "the model alone, in-process: audio s/s by batch size, the first chunk's time"),
    "realtime": (
        "bench.realtime",
        "WebSocket sessions fed like an LLM writes: first audio vs HTTP TTFB, playback gaps",
    ),
    "gpu": ("bench.gpu", "the one-command GPU check: gpu tests, ceiling, Serve 2x0.5 vs 1x1 GPU (~8 min)"),
    "fidelity": (
        "bench.fidelity",
        "batch invariance: rows alone vs batched vs ChatTTS's own decode, int8 and float32, deep and full size",
    ),
    "abuse": (
        "bench.abuse",
        "a polite client's first audio alone and under eight attackers (costly requests, idle sockets, slow bodies, "
        "flush floods, dot jobs, silence dialogues, public-page keys, unkeyed slow bodies)",
    ),
    "batch": (
        "bench.batch",
        "bulk synthesis (chattts-serve batch) against the service on one corpus; 1 vs 2 acoustic actors",
    ),
    "baseline": ("bench.baseline", "the 'before' server (one Chat.infer at a time), for `run` or by hand"),
    "cache-hit": ("bench.cache_hit", "latency and throughput of the response cache against a running app"),
    "gpu-ceiling": ("bench.gpu_steps", "(the GPU check's ceiling step, in its own process)"),
    "compare": ("bench.compare", "key numbers of several `run` reports side by side (markdown)"),
    "report": ("bench.report", "render any subcommand's report again from its JSON (report.md and its plot)"),
    "step": ("bench.studies.step", "study: the decode step, GPT forward vs the rest, batch 1/8/16, int8 vs float32"),
    "vocoder": (
        "bench.studies.vocoder",
        "study: the Vocoder stage alone, audio s/s per core, today's path vs the optimised one",
    ),
    "dialogue": (
        "bench.studies.dialogue",
        "study: a ten-turn, two-voice dialogue, /v1/audio/dialogue vs one turn at a time",
    ),
    "jobs": ("bench.studies.jobs", "study: an interactive client's first audio alone and beside a background job"),
    "memory": ("bench.studies.memory", "study: where the model stages' memory goes, RSS per load and decode step, KV"),
    "fairness": (
        "bench.studies.fairness",
        "study: a polite client's first chunk beside a client with 200 queued segments",
    ),
    "autoscale": (
        "bench.studies.autoscale",
        "study: step load on a local multi-node cluster, replicas and latency per second",
    ),
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
