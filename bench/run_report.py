"""The report of ``python -m bench run``: report.json (everything), report.md (tables) and
report.png (plots); the ratios against the targets. Also used by ``report`` (and its ``--compare``)."""

from __future__ import annotations

from pathlib import Path

from .lib import first_audio
from .lib.report import (
    Col,
    Doc,
    Figure,
    Kind,
    Panel,
    Series,
    by_clients,
    failed,
    line,
    load_columns,
    points,
    seconds_panel,
    target,
)
from .lib.report import fmt as _f
from .lib.report import get as _get
from .lib.stats import ratio as _ratio

TARGETS = {
    # name: (op, threshold, what)
    "serve_vs_baseline_c8": (">=", 3.5, "throughput at 8 clients, project / baseline"),
    "serve_vs_ceiling_c8": (">=", 0.90, "throughput at 8 clients / raw batch-8 ceiling"),
    "ttfb_vs_first_chunk": ("<=", 1.3, "TTFB p50 at 1 client / raw time to the first chunk's audio"),
    "p99_vs_baseline_c8": ("<=", 0.5, "latency p99 at 8 clients, project / baseline"),
    "continuous_vs_window_mean_latency_70": (">=", 1.5, "mean latency at 70% load, window / continuous batching"),
}
# First audio's figures (ms), checked where a run measured them (earlier reports have none).
SERVICE_SHARE = (
    "the service's own share of first audio at 1 client, ms p50: TTFB - the model's hops of the same request"
)
FIRST_AUDIO_TARGETS = {"first_audio_service_ms_c1": ("<=", 60.0, SERVICE_SHARE)}


def load_key(load: float) -> str:
    return f"{load:.2f}"


def compute_ratios(report: dict) -> dict:
    serve_c = _get(report, "serve", "closed")
    base_c = _get(report, "baseline", "closed")
    ceiling = _get(report, "ceiling", "ceiling")
    first = _get(report, "ceiling", "first_chunk", "raw_s")
    cont = _get(report, "serve", "open", "continuous")
    win = _get(report, "serve", "open", "window")
    r = {
        "serve_vs_baseline_c8": _ratio(_get(serve_c, 8, "audio_s_per_s"), _get(base_c, 8, "audio_s_per_s")),
        "serve_vs_ceiling_c8": _ratio(_get(serve_c, 8, "audio_s_per_s"), _get(ceiling, 8)),
        "ttfb_vs_first_chunk": _ratio(_get(serve_c, 1, "ttfb_s", "p50"), first),
        "p99_vs_baseline_c8": _ratio(_get(serve_c, 8, "latency_s", "p99"), _get(base_c, 8, "latency_s", "p99")),
        "continuous_vs_window_mean_latency_70": _ratio(
            _get(win, load_key(0.7), "latency_s", "mean"), _get(cont, load_key(0.7), "latency_s", "mean")
        ),
    }
    if _get(serve_c, 1, "first_audio") or _get(report, "serve", "first_audio_ab"):
        r["first_audio_service_ms_c1"] = _service_ms(report, 1)
        r["ttfb_minus_first_chunk_ms_c1"] = _minus_ms(_get(serve_c, 1, "ttfb_s", "p50"), first)
        r["first_audio_service_ms_c1_closed"] = _get(serve_c, 1, "first_audio", "hops_ms", "service", "p50")
    v = _service_ms(report, 8)
    if v is not None:
        r["first_audio_service_ms_c8"] = v
    # Extras (not targets): the same comparisons at the other points that were measured.
    for load in (0.5, 0.9):
        v = _ratio(_get(win, load_key(load), "latency_s", "mean"), _get(cont, load_key(load), "latency_s", "mean"))
        if v is not None:
            r[f"continuous_vs_window_mean_latency_{int(load * 100)}"] = v
    v = _ratio(_get(win, load_key(0.7), "ttfb_s", "mean"), _get(cont, load_key(0.7), "ttfb_s", "mean"))
    if v is not None:
        r["continuous_vs_window_mean_ttfb_70"] = v
    hit = _get(report, "serve", "cache_hit")
    if hit:
        r["cache_hit_p50_ms"] = hit.get("hit_p50_ms")
        r["cache_hit_req_per_s"] = hit.get("hit_req_per_s")
    r["serve_vs_baseline_c1"] = _ratio(_get(serve_c, 1, "audio_s_per_s"), _get(base_c, 1, "audio_s_per_s"))
    r["ceiling_b8_vs_b1"] = _ratio(_get(ceiling, 8), _get(ceiling, 1))
    # Against the engine's decode alone: the bound for a replica whose Vocoder runs on other cores.
    decode_b8 = _get(report, "ceiling", "methods", "engine", "8", "decode_audio_s_per_s")
    r["serve_vs_decode_ceiling_c8"] = _ratio(_get(serve_c, 8, "audio_s_per_s"), decode_b8)
    r["baseline_c8_vs_ceiling_b1"] = _ratio(_get(base_c, 8, "audio_s_per_s"), _get(ceiling, 1))
    return {k: v for k, v in r.items() if v is not None or k in TARGETS or k in FIRST_AUDIO_TARGETS}


def _service_ms(report: dict, c: int) -> object:
    """The service's share of first audio (p50, ms) at ``c`` clients: TTFB - the model's own hops
    (queue and prefill, first chunk, first vocoder window) of the same requests. At 1 client the
    before/after's shipped side when measured (its one-row requests give 4-6x the closed loop's
    completions, taken in alternation with the other side), else the closed loop's."""
    v = _get(report, "serve", "first_audio_ab", "after", "hops_ms", "service", "p50") if c == 1 else None
    return v if v is not None else _get(report, "serve", "closed", c, "first_audio", "hops_ms", "service", "p50")


def _minus_ms(a: object, b: object) -> object:
    return None if a is None or b is None else round((a - b) * 1000.0, 1)


def check_targets(ratios: dict) -> dict:
    out = {}
    checked = {**TARGETS, **{k: t for k, t in FIRST_AUDIO_TARGETS.items() if k in ratios}}
    for name, (op, threshold, what) in checked.items():
        out[name] = {**target(ratios.get(name), op, threshold), "what": what}
    return out


# ------------------------------------------------------------------ markdown

CLOSED = [Col("system", 0), *load_columns(), Col("peak RSS MiB", (2, "rss", "peak_total_mib"), nd=0)]
OPEN = [
    Col("batching", 0),
    Col("load", lambda x: f"{int(float(x[1]) * 100)}%"),
    Col("rate req/s", (2, "rate_rps"), nd=3),
    Col("sent", lambda x: str(x[2].get("sent"))),
    Col("done", lambda x: str(x[2].get("completed"))),
    Col("errors", lambda x: str(x[2].get("errors"))),
    Col("cut", lambda x: str(x[2].get("cut"))),
    Col("lat mean", (2, "latency_s", "mean")),
    Col("lat p50", (2, "latency_s", "p50")),
    Col("lat p95", (2, "latency_s", "p95")),
    Col("lat p99", (2, "latency_s", "p99")),
    Col("TTFB mean", (2, "ttfb_s", "mean")),
    Col("TTFB p95", (2, "ttfb_s", "p95")),
    Col("mean batch", (2, "engine", "mean_rows_per_step")),
]
TARGET_COLUMNS = [
    Col("ratio", lambda x: f"`{x[0]}`"),
    Col("value", lambda x: x[1]["value"], nd=3),
    Col("target", lambda x: x[1]["target"]),
    Col("met", lambda x: {True: "yes", False: "**no**", None: "not measured"}[x[1]["met"]]),
    Col("meaning", lambda x: x[1]["what"]),
]


def _levels(system: str, levels: dict) -> list[tuple]:
    return [(system, c, levels[c]) for c in sorted(levels, key=int)]


def to_doc(report: dict) -> Doc:
    meta = report.get("meta", {})
    doc = Doc(f"chattts-serve benchmark ({'quick' if meta.get('quick') else 'full'} run)", end="")
    doc.add(
        f"- date: {meta.get('started')} → {meta.get('finished')} (wall {_f(meta.get('wall_s'), 0)} s)",
        f"- machine: {meta.get('cpus')} CPUs, {meta.get('mem_gib')} GiB RAM, {meta.get('platform')}; "
        f"load average at start {meta.get('loadavg_start')}, at end {meta.get('loadavg_end')}",
        f"- weights: {meta.get('weights')}; git {meta.get('git')}; command `{meta.get('command')}`",
        f"- project's HTTP front door: {(meta.get('plan') or {}).get('front_door', 'proxy')}",
    )
    if report.get("error"):
        doc.add("", failed(report, " (the tables hold what was measured before)."))
    if report.get("warnings"):
        doc.add("", *[f"- warning: {w}" for w in report["warnings"]])
    doc.table(TARGET_COLUMNS, (report.get("targets") or {}).items(), before=("", "## Targets", ""))
    extras = {k: v for k, v in (report.get("ratios") or {}).items() if k not in (report.get("targets") or TARGETS)}
    if extras:
        doc.add("", "Other ratios: " + ", ".join(f"`{k}` = {_f(v, 3)}" for k, v in extras.items()))

    section = first_audio.markdown(report)
    if section:
        doc.add("", *section[:-1])
    ceil = report.get("ceiling")
    if ceil:
        methods = ceil.get("methods", {})
        cols = [Col("batch", lambda n: n)]
        cols += [Col(name, lambda n, m=m: _get(m, n, "audio_s_per_s"), nd=3) for name, m in methods.items()]
        cols.append(Col("ceiling", lambda n: ceil["ceiling"][n], nd=3))
        if _get(methods, "engine", "8", "decode_audio_s_per_s"):
            cols.append(
                Col("engine's decode alone", lambda n: _get(methods, "engine", n, "decode_audio_s_per_s"), nd=3)
            )
        pinned = _get(report, "serve", "pinned")
        head = (
            f"{ceil.get('tokens_per_row')} tokens per row, torch threads {ceil.get('torch_threads')}"
            + (f", on CPUs {pinned['acoustic_cpus']}" if pinned else "")
            + "; audio seconds per wall second:"
        )
        rows = sorted(ceil.get("ceiling", {}), key=int)
        doc.table(cols, rows, before=("", "## Ceiling (raw in-process, no serving)", "", head, ""))
        fc = ceil.get("first_chunk")
        if fc:
            doc.add(
                "",
                f"First chunk alone ({fc.get('tokens')} tokens to audio): engine {_f(fc.get('engine_s'), 3)} s, "
                f"Chat.infer {_f(fc.get('chat_infer_s'), 3)} s → raw {_f(fc.get('raw_s'), 3)} s",
            )

    closed = _levels("baseline", _get(report, "baseline", "closed") or {})
    closed += _levels("serve", _get(report, "serve", "closed") or {})
    doc.table(CLOSED, closed, before=("", "## Closed loop (N clients back to back)", ""))

    open_ = _get(report, "serve", "open") or {}
    if open_:
        cap = _get(report, "serve", "capacity") or {}
        head = (
            f"Capacity: {_f(cap.get('audio_s_per_s'), 3)} audio s/s = {_f(cap.get('requests_per_s'), 3)} req/s "
            f"(best closed-loop throughput / {_f(cap.get('mean_audio_s_per_request'), 2)} s mean audio per request)."
        )
        rows = [
            (mode, load, open_[mode][load]) for mode in ("continuous", "window") for load in sorted(open_.get(mode, {}))
        ]
        doc.table(
            OPEN, rows, before=("", "## Open loop (Poisson arrivals), continuous vs window batching", "", head, "")
        )

    rss = {k: _get(report, k, "rss_peak") for k in ("baseline", "serve")}
    if any(rss.values()):
        doc.add("", "## Peak RSS (MiB)", "")
        for k, v in rss.items():
            if v:
                parts = ", ".join(f"{p} {m:.0f}" for p, m in v.get("peak_by_process_mib", {}).items())
                doc.add(f"- {k}: total {v.get('peak_total_mib', 0):.0f} ({parts})")
    env = _get(report, "serve", "replica_env")
    if env:
        doc.add(
            "",
            "Serve replicas: "
            + "; ".join(
                f"{g}: num_cpus {lst[0]['num_cpus']}, OMP threads {[e['omp_threads_effective'] for e in lst]}"
                for g, lst in env.items()
                if lst
            ),
        )
    busy = _get(report, "serve", "closed", "8", "replica_threads")
    if busy:
        doc.add(
            "",
            "CPU use at 8 clients (cores used, threads busier than 25% of a core; busiest threads' "
            "share of the phase on a CPU / waiting for one): "
            + "; ".join(
                f"{g}: "
                + ", ".join(
                    f"{x['cpu_cores_used']:.2f} cores / {x['threads_over_25pct']} threads" + _thread_shares(x)
                    for x in lst
                )
                for g, lst in busy.items()
            ),
        )
    pinned = _get(report, "serve", "pinned")
    if pinned:
        doc.add(
            "",
            f"Pinned (`--pin-acoustic`): the Acoustic replica on CPUs {pinned['acoustic_cpus']}, every other "
            f"process (Vocoder, Ingress, proxy, Ray, the load generator) on {pinned['rest_cpus']}.",
        )
    machine = _get(report, "serve", "closed", "8", "machine_cores")
    if machine and machine.get("cores"):
        doc.add(
            "",
            "Where the machine's cores went at 8 clients (every process, cores used): "
            + ", ".join(f"{k} {v:.2f}" for k, v in machine["cores"].items())
            + f"; idle {machine['idle']:.2f}",
        )
    for phase, procs in (_get(report, "serve", "profile") or {}).items():
        doc.add("", f"## Profile (py-spy, closed loop {phase}): share of busy samples", "")
        for name, prof in procs.items():
            if "stages_pct" not in prof:
                doc.add(f"- {name}: {prof.get('error', 'no samples')}")
                continue
            stages = ", ".join(f"{k} {v}%" for k, v in prof["stages_pct"].items())
            top = ", ".join(f"`{k}` {v}%" for k, v in prof["top_self_pct"][:6])
            doc.add(f"- {name} ({prof['samples']} samples): {stages}. Top self time: {top}")
    ov = _get(report, "serve", "overrides")
    if ov:
        doc.add("", "Config overrides: " + ", ".join(f"`{k}={v}`" for k, v in ov.items()))
    doc.add(
        "",
        "Definitions: see bench/README.md. Throughput = seconds of audio received per wall second; "
        "TTFB = time to the first audio byte; mean batch = decode rows per engine step during the phase.",
        "",
    )
    return doc


def _thread_shares(x: dict) -> str:
    on, wait = x.get("top_thread_shares", [])[:2], x.get("top_thread_runqueue", [])[:2]
    if not on or not wait or None in wait:  # not sampled (older reports, no schedstat)
        return ""
    return " (" + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in zip(on, wait)) + ")"


# ------------------------------------------------------------------ plot

COLORS = {"serve": "tab:blue", "baseline": "tab:red", "ceiling": "tab:green", "window": "tab:orange"}


def to_figure(report: dict) -> Figure:
    serve_c = _get(report, "serve", "closed") or {}
    base_c = _get(report, "baseline", "closed") or {}
    ceiling = _get(report, "ceiling", "ceiling") or {}
    systems = (("serve", serve_c), ("baseline", base_c))

    throughput = Panel("Throughput", "concurrent clients / batch size", "audio seconds per wall second", log2x=True)
    throughput.ylim = (0, None)
    for name, closed in systems:
        throughput.add(points(by_clients(closed, "audio_s_per_s"), f"{name} (N clients)", color=COLORS[name]))
    cpts = sorted((int(k), v) for k, v in ceiling.items() if v is not None)
    throughput.add(points(cpts, "ceiling (raw batch N)", "s--", color=COLORS["ceiling"]))

    panels = [throughput]
    for key, label, qs, title in (
        ("latency_s", "latency", ("p50", "p99"), "Latency (whole response)"),
        ("ttfb_s", "TTFB", ("p50", "p95"), "Time to first audio byte"),
    ):
        series = [
            points(by_clients(closed, key, q), f"{name} {label} {q}", style, color=COLORS[name])
            for name, closed in systems
            for q, style in zip(qs, ("o-", "^:"))
        ]
        fc = _get(report, "ceiling", "first_chunk", "raw_s")
        if key == "ttfb_s" and fc:
            series.append(
                Series("hline", y=fc, label="raw first chunk alone", kw={"color": COLORS["ceiling"], "ls": "--"})
            )
        panels.append(seconds_panel(title, series))

    open_ = _get(report, "serve", "open") or {}
    loop = Panel(
        "Open loop (Poisson): continuous vs window batching", "offered load, % of measured capacity", "seconds"
    )
    loop.xlim = (0, 100)
    for mode, color in (("continuous", COLORS["serve"]), ("window", COLORS["window"])):
        pts = sorted(
            (float(k) * 100, _get(v, "latency_s", "mean"), _get(v, "latency_s", "p95"), _get(v, "ttfb_s", "mean"))
            for k, v in (open_.get(mode) or {}).items()
        )
        pts = [p for p in pts if p[1] is not None]
        if pts:
            xs = [p[0] for p in pts]
            loop.add(
                line(xs, [p[1] for p in pts], f"{mode}: latency mean", "o-", color=color),
                line(xs, [p[2] for p in pts], f"{mode}: latency p95", "^:", color=color),
                line(xs, [p[3] for p in pts], f"{mode}: TTFB mean", "x--", color=color, alpha=0.6),
            )
    panels.append(loop)

    meta = report.get("meta", {})
    r = report.get("ratios", {})
    sub = ", ".join(f"{k}={v:.2f}" for k, v in r.items() if k in TARGETS and v is not None)
    title = (
        f"chattts-serve bench ({'quick' if meta.get('quick') else 'full'}, {meta.get('started', '')}, "
        f"{meta.get('cpus')} CPUs, {meta.get('weights')} weights)\n{sub}"
    )
    return Figure(panels, shape=(2, 2), size=(13, 9.5), title=title)


KIND = Kind("report.json", to_doc, to_figure)


def write_all(report: dict, out: Path) -> None:
    """Ratios and targets computed from the report, then report.json, .md and .png."""
    report["ratios"] = compute_ratios(report)
    report["targets"] = check_targets(report["ratios"])
    KIND.write(report, out)
