"""The GPU check's report: report.json (everything), report.md (tables) and report.png (plots),
written after every step and rendered again by ``python -m bench report``.

Apart from the run (``gpu.py``, ``gpu_steps.py``): it reads only the report's JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from . import fidelity
from .lib.report import Col, Doc, Figure, Kind, Panel, Series, by_clients, log2_panel, points, seconds_panel
from .lib.report import fmt as _f
from .lib.report import get as _get


def _first_line(text: Optional[str], n: int) -> str:
    lines = (text or "").splitlines()
    return lines[0][:n] if lines else ""


STEPS = [
    Col("step", 0),
    Col("status", lambda x: str(x[1].get("status"))),
    Col("wall s", (1, "wall_s"), nd=1),
    Col("budget s", (1, "budget_s"), nd=0),
    Col("error", lambda x: _first_line(x[1].get("error"), 200)),
]
TESTS = [
    Col("test", lambda c: f"`{c['name']}`"),
    Col("outcome", "outcome"),
    Col("s", "time_s", nd=1),
    Col("recorded", lambda c: ", ".join(f"{k}={v}" for k, v in (c.get("properties") or {}).items())),
    Col("message", lambda c: _first_line(c.get("message"), 160)),
]
FIDELITY = [
    Col("size", "size"),
    Col("device", lambda x: str(x.get("device"))),
    *fidelity.COLUMNS[2:],
]
CEILING = [
    Col("batch", 0),
    Col("audio s/s", (1, "audio_s_per_s"), nd=3),
    Col("step ms", (1, "step_ms")),
    Col("steps", lambda x: str(x[1].get("steps"))),
    Col("mean rows", (1, "mean_rows"), nd=1),
    Col("prefill s", (1, "prefill_s"), nd=3),
    Col("wall s", (1, "wall_s")),
    Col("peak GPU MiB", (1, "peak_gpu_mib"), nd=0),
]
SERVE = [
    Col("variant", 0),
    Col("clients", 1),
    Col("audio s/s", (2, "audio_s_per_s"), nd=3),
    Col("req/s", (2, "requests_per_s"), nd=3),
    Col("TTFB p50", (2, "ttfb_s", "p50")),
    Col("TTFB p99", (2, "ttfb_s", "p99")),
    Col("lat p50", (2, "latency_s", "p50")),
    Col("lat p99", (2, "latency_s", "p99")),
    Col("done", lambda x: str(x[2].get("completed"))),
    Col("errors", lambda x: str(x[2].get("errors"))),
    Col("cut", lambda x: str(x[2].get("cut"))),
    Col("mean batch", (2, "engine", "mean_rows_per_step")),
    Col("GPU mem peak MiB", (2, "gpu", "mem_used_peak_mib"), nd=0),
    Col("GPU util %", (2, "gpu", "util_mean_pct"), nd=0),
]


def to_doc(report: dict) -> Doc:
    meta = report.get("meta", {})
    plan = report.get("plan", {})
    doc = Doc(f"chattts-serve GPU check{' (dry run: CPU, tiny weights)' if meta.get('dry_run') else ''}", end="")
    doc.add(
        f"- date: {meta.get('started')} → {meta.get('finished')} (wall {_f(meta.get('wall_s'), 0)} s, "
        f"deadline {_f(plan.get('deadline_s'), 0)} s)",
        f"- machine: {meta.get('cpus')} CPUs, GPU: {meta.get('host_gpu') or 'none'}; git {meta.get('git')}",
        f"- command `{meta.get('command')}`; weights {plan.get('weights')}, {plan.get('device')} {plan.get('dtype')}",
    )
    doc.table(STEPS, report.get("steps", {}).items(), before=("", "## Steps", ""))
    doc.add(*[f"- warning: {w}" for w in report.get("warnings", [])])

    tests = report.get("tests")
    if tests:
        sm = tests.get("summary", {})
        summary = (
            f"`{tests.get('command')}`: {sm.get('passed')} passed, {sm.get('failed')} failed, "
            f"{sm.get('errors')} errors, {sm.get('skipped')} skipped"
        )
        doc.table(TESTS, tests.get("cases", []), before=("", "## Tests (`pytest -m gpu`)", "", summary, ""))

    fid = report.get("fidelity")
    if fid:
        head = "## Batch invariance (`python -m bench fidelity`)"
        doc.table(FIDELITY, fid.get("results", []), before=("", head, ""))
    ceil = report.get("ceiling")
    if ceil:
        about = (
            f"{ceil.get('weights')} weights on {ceil.get('device')} {ceil.get('dtype')} ({ceil.get('gpu_name') or 'CPU'}), "
            f"{ceil.get('tokens_per_row')} tokens per row, loaded in {_f(ceil.get('load_s'), 1)} s, weights on the GPU "
            f"{_f(ceil.get('weights_gpu_mib'), 0)} MiB"
        )
        rows = [(n, ceil["batches"][n]) for n in sorted(ceil.get("batches", {}), key=int)]
        doc.table(CEILING, rows, before=("", "## Ceiling (the engine alone, no serving)", "", about, ""))
        fc = ceil.get("first_chunk")
        if fc:
            doc.add(
                "",
                f"First chunk at batch 1 ({fc.get('tokens')} tokens to audio): engine {_f(fc.get('engine_s'), 3)} s, "
                f"Chat.infer {_f(fc.get('chat_infer_s'), 3)} s → raw {_f(fc.get('raw_s'), 3)} s",
            )

    serve = report.get("serve") or {}
    if serve:
        rows = [(name, c, v["closed"][c]) for name, v in serve.items() for c in sorted(v.get("closed", {}), key=int)]
        doc.table(SERVE, rows, before=("", "## Serve (config/serve.gpu.yaml, closed loop)", ""))
        for name, v in serve.items():
            doc.add(
                f"\n{name}: Serve start {_f(v.get('start_s'), 1)} s; overrides: "
                + ", ".join(f"`{k}={val}`" for k, val in (v.get("overrides") or {}).items())
            )
    doc.add(
        "",
        "Throughput = seconds of audio received per wall second; TTFB = time to the first audio byte; "
        'mean batch = decode rows per engine step (one replica only). See bench/README.md, "GPU check".',
        "",
    )
    return doc


STYLES = {"serve_2x0.5": ("tab:blue", "o-"), "serve_1x1": ("tab:orange", "s-")}


def to_figure(report: dict) -> Figure:
    serve = report.get("serve") or {}
    ceil = report.get("ceiling") or {}
    batches = sorted((ceil.get("batches") or {}).items(), key=lambda x: int(x[0]))

    def color(name: str) -> str:
        return STYLES.get(name, ("gray", "o-"))[0]

    series = [
        points(
            by_clients(v.get("closed", {}), "audio_s_per_s"),
            f"{name} (N clients)",
            STYLES.get(name, ("", "o-"))[1],
            color=color(name),
        )
        for name, v in serve.items()
    ]
    cpts = [(int(n), b.get("audio_s_per_s")) for n, b in batches]
    series.append(points(cpts, "ceiling (engine, batch N)", "^--", color="tab:green"))
    panels = [log2_panel("Throughput", "concurrent clients / batch size", "audio seconds per wall second", series)]
    # (order of the original layout: TTFB top right, latency bottom left)
    for key, title in (("ttfb_s", "Time to first audio byte"), ("latency_s", "Latency (whole response)")):
        lines = [
            points(by_clients(v.get("closed", {}), key, q), f"{name} {q}", style, color=color(name))
            for name, v in serve.items()
            for q, style in (("p50", "o-"), ("p99", "^:"))
        ]
        if key == "ttfb_s" and _get(ceil, "first_chunk", "raw_s"):
            raw = ceil["first_chunk"]["raw_s"]
            lines.append(
                Series("hline", y=raw, label="raw first chunk, batch 1", kw={"color": "tab:green", "ls": "--"})
            )
        panels.append(seconds_panel(title, lines))
    pts = [(int(n), b.get("step_ms"), b.get("peak_gpu_mib")) for n, b in batches]
    step = log2_panel(
        "Ceiling: decode step time and peak GPU memory",
        "batch size",
        "ms per decode step",
        [points([p[:2] for p in pts], "decode step ms", color="tab:green")],
    )
    mem = [(p[0], p[2]) for p in pts if p[2] is not None]
    if mem:
        step.twin = Panel(ylabel="peak GPU memory, MiB", ylim=(0, None), grid=None, not_measured=False)
        step.twin.legend = {"fontsize": 8, "loc": "lower right"}
        step.twin.add(points(mem, "peak GPU MiB", "s:", color="tab:purple"))
    panels.append(step)
    meta, plan = report.get("meta", {}), report.get("plan", {})
    title = (
        f"chattts-serve GPU check{' (dry run)' if meta.get('dry_run') else ''}, {meta.get('started', '')}, "
        f"{meta.get('host_gpu') or 'no GPU'}, {plan.get('weights')} weights, {plan.get('device')} {plan.get('dtype')}"
    )
    return Figure(panels, shape=(2, 2), size=(13, 9.5), title=title)


KIND = Kind("report.json", to_doc, to_figure)


def write_report(report: dict, out: Path) -> None:
    """report.json, .md and .png from a snapshot (steps go on mutating theirs)."""
    KIND.write(json.loads(json.dumps(report, default=str)), out)
