"""The GPU check's report: report.json (everything), report.md (tables) and report.png (plots),
written after every step and rendered again by ``python -m bench report``.

Apart from the run (``gpu.py``, ``gpu_steps.py``): it reads only the report's JSON."""

from __future__ import annotations

import json
from pathlib import Path

from .lib.render import by_clients, log2_panel, pyplot, render_files, save, seconds_vs_clients, write_files
from .lib.render import fmt as _f
from .lib.render import get as _get


def write_report(report: dict, out: Path) -> None:
    """report.json, .md and .png from a snapshot (steps go on mutating theirs)."""
    write_files(json.loads(json.dumps(report, default=str)), out, "report.json", to_markdown, to_png)


def render(report: dict, out: Path) -> None:
    render_files(report, out, to_markdown, to_png)


# ------------------------------------------------------------------ report


def to_markdown(report: dict) -> str:
    meta = report.get("meta", {})
    plan = report.get("plan", {})
    lines = [
        f"# chattts-serve GPU check{' (dry run: CPU, tiny weights)' if meta.get('dry_run') else ''}",
        "",
        f"- date: {meta.get('started')} → {meta.get('finished')} (wall {_f(meta.get('wall_s'), 0)} s, "
        f"deadline {_f(plan.get('deadline_s'), 0)} s)",
        f"- machine: {meta.get('cpus')} CPUs, GPU: {meta.get('host_gpu') or 'none'}; git {meta.get('git')}",
        f"- command `{meta.get('command')}`; weights {plan.get('weights')}, {plan.get('device')} {plan.get('dtype')}",
        "",
        "## Steps",
        "",
        "| step | status | wall s | budget s | error |",
        "|---|---|---|---|---|",
    ]
    for name, s in report.get("steps", {}).items():
        err = (s.get("error") or "").splitlines()
        lines.append(
            f"| {name} | {s.get('status')} | {_f(s.get('wall_s'), 1)} | {_f(s.get('budget_s'), 0)} | "
            f"{err[0][:200] if err else ''} |"
        )
    lines += [f"- warning: {w}" for w in report.get("warnings", [])]

    tests = report.get("tests")
    if tests:
        sm = tests.get("summary", {})
        lines += [
            "",
            "## Tests (`pytest -m gpu`)",
            "",
            f"`{tests.get('command')}`: {sm.get('passed')} passed, {sm.get('failed')} failed, "
            f"{sm.get('errors')} errors, {sm.get('skipped')} skipped",
            "",
            "| test | outcome | s | recorded | message |",
            "|---|---|---|---|---|",
        ]
        for c in tests.get("cases", []):
            props = ", ".join(f"{k}={v}" for k, v in (c.get("properties") or {}).items())
            msg = (c.get("message") or "").splitlines()
            lines.append(
                f"| `{c['name']}` | {c['outcome']} | {_f(c.get('time_s'), 1)} | {props} | {msg[0][:160] if msg else ''} |"
            )

    fid = report.get("fidelity")
    if fid:
        lines += [
            "",
            "## Batch invariance (`python -m bench fidelity`)",
            "",
            "| size | device | precision | path | rows | tokens equal | bit-identical | min frame cosine |",
            "|---|---|---|---|---:|---:|---:|---:|",
        ]
        lines += [
            f"| {x['size']} | {x.get('device')} | {x['precision']} | {x['path']} | {x['rows']} | {x['tokens_equal']} | "
            f"{x['bit_identical']} | {_f(x['min_cosine'], 6)} |"
            for x in fid.get("results", [])
        ]
    ceil = report.get("ceiling")
    if ceil:
        lines += [
            "",
            "## Ceiling (the engine alone, no serving)",
            "",
            f"{ceil.get('weights')} weights on {ceil.get('device')} {ceil.get('dtype')} ({ceil.get('gpu_name') or 'CPU'}), "
            f"{ceil.get('tokens_per_row')} tokens per row, loaded in {_f(ceil.get('load_s'), 1)} s, weights on the GPU "
            f"{_f(ceil.get('weights_gpu_mib'), 0)} MiB",
            "",
            "| batch | audio s/s | step ms | steps | mean rows | prefill s | wall s | peak GPU MiB |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for n in sorted(ceil.get("batches", {}), key=int):
            b = ceil["batches"][n]
            lines.append(
                f"| {n} | {_f(b.get('audio_s_per_s'), 3)} | {_f(b.get('step_ms'), 2)} | {b.get('steps')} | "
                f"{_f(b.get('mean_rows'), 1)} | {_f(b.get('prefill_s'), 3)} | {_f(b.get('wall_s'), 2)} | "
                f"{_f(b.get('peak_gpu_mib'), 0)} |"
            )
        fc = ceil.get("first_chunk")
        if fc:
            lines += [
                "",
                f"First chunk at batch 1 ({fc.get('tokens')} tokens to audio): engine {_f(fc.get('engine_s'), 3)} s, "
                f"Chat.infer {_f(fc.get('chat_infer_s'), 3)} s → raw {_f(fc.get('raw_s'), 3)} s",
            ]

    serve = report.get("serve") or {}
    if serve:
        lines += [
            "",
            "## Serve (config/serve.gpu.yaml, closed loop)",
            "",
            "| variant | clients | audio s/s | req/s | TTFB p50 | TTFB p99 | lat p50 | lat p99 | done | errors | cut | "
            "mean batch | GPU mem peak MiB | GPU util % |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for name, v in serve.items():
            for c in sorted(v.get("closed", {}), key=int):
                s = v["closed"][c]
                lines.append(
                    f"| {name} | {c} | {_f(s.get('audio_s_per_s'), 3)} | {_f(s.get('requests_per_s'), 3)} | "
                    f"{_f(_get(s, 'ttfb_s', 'p50'))} | {_f(_get(s, 'ttfb_s', 'p99'))} | {_f(_get(s, 'latency_s', 'p50'))} | "
                    f"{_f(_get(s, 'latency_s', 'p99'))} | {s.get('completed')} | {s.get('errors')} | {s.get('cut')} | "
                    f"{_f(_get(s, 'engine', 'mean_rows_per_step'))} | {_f(_get(s, 'gpu', 'mem_used_peak_mib'), 0)} | "
                    f"{_f(_get(s, 'gpu', 'util_mean_pct'), 0)} |"
                )
        for name, v in serve.items():
            lines.append(
                f"\n{name}: Serve start {_f(v.get('start_s'), 1)} s; overrides: "
                + ", ".join(f"`{k}={val}`" for k, val in (v.get("overrides") or {}).items())
            )
    lines += [
        "",
        "Throughput = seconds of audio received per wall second; TTFB = time to the first audio byte; "
        'mean batch = decode rows per engine step (one replica only). See bench/README.md, "GPU check".',
        "",
    ]
    return "\n".join(lines)


def to_png(report: dict, path: Path) -> None:
    serve = report.get("serve") or {}
    ceil = report.get("ceiling") or {}
    batches = ceil.get("batches") or {}
    fig, axes = pyplot().subplots(2, 2, figsize=(13, 9.5))
    styles = {"serve_2x0.5": ("tab:blue", "o-"), "serve_1x1": ("tab:orange", "s-")}

    ax = axes[0][0]
    for name, v in serve.items():
        pts = by_clients(v.get("closed", {}), "audio_s_per_s")
        if pts:
            ax.plot(
                *zip(*pts),
                styles.get(name, ("gray", "o-"))[1],
                color=styles.get(name, ("gray",))[0],
                label=f"{name} (N clients)",
            )
    cpts = [(int(n), b.get("audio_s_per_s")) for n, b in sorted(batches.items(), key=lambda x: int(x[0]))]
    if cpts:
        ax.plot(*zip(*cpts), "^--", color="tab:green", label="ceiling (engine, batch N)")
    log2_panel(
        ax,
        "Throughput",
        "concurrent clients / batch size",
        "audio seconds per wall second",
        [p[1] for p in cpts] + [y for v in serve.values() for _, y in by_clients(v.get("closed", {}), "audio_s_per_s")],
    )

    for ax, key, title in (
        (axes[0][1], "ttfb_s", "Time to first audio byte"),
        (axes[1][0], "latency_s", "Latency (whole response)"),
    ):
        for name, v in serve.items():
            color = styles.get(name, ("gray",))[0]
            for q, style in (("p50", "o-"), ("p99", "^:")):
                pts = by_clients(v.get("closed", {}), key, q)
                if pts:
                    ax.plot(*zip(*pts), style, color=color, label=f"{name} {q}")
        if key == "ttfb_s" and _get(ceil, "first_chunk", "raw_s"):
            ax.axhline(ceil["first_chunk"]["raw_s"], color="tab:green", ls="--", label="raw first chunk, batch 1")
        seconds_vs_clients(ax, title)

    ax = axes[1][1]
    pts = [
        (int(n), b.get("step_ms"), b.get("peak_gpu_mib")) for n, b in sorted(batches.items(), key=lambda x: int(x[0]))
    ]
    if pts:
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", color="tab:green", label="decode step ms")
        mem = [(p[0], p[2]) for p in pts if p[2] is not None]
        if mem:
            ax2 = ax.twinx()
            ax2.plot(*zip(*mem), "s:", color="tab:purple", label="peak GPU MiB")
            ax2.set_ylabel("peak GPU memory, MiB")
            ax2.set_ylim(bottom=0)
            ax2.legend(fontsize=8, loc="lower right")
    log2_panel(
        ax, "Ceiling: decode step time and peak GPU memory", "batch size", "ms per decode step", [p[1] for p in pts]
    )

    meta, plan = report.get("meta", {}), report.get("plan", {})
    fig.suptitle(
        f"chattts-serve GPU check{' (dry run)' if meta.get('dry_run') else ''}, {meta.get('started', '')}, "
        f"{meta.get('host_gpu') or 'no GPU'}, {plan.get('weights')} weights, {plan.get('device')} {plan.get('dtype')}",
        fontsize=10,
    )
    save(fig, path)
