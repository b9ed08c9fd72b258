"""Where a streamed request's first audio goes, hop by hop: the client's TTFB joined with the
Ingress's request log line of the same request (the bench sends its own ``X-Request-Id``, which
Serve keeps as the request's id).

Each hop is a duration measured inside the process it runs in (docs/architecture.md, "First audio, hop by hop",
names them); a handle call's own cost (scheduling, serialization, the object store, the
replica's queue) is the call as the caller timed it minus the callee's own time, so no two
processes' clocks are ever subtracted.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Iterable, Optional

from .report import Col, Table
from .stats import median, percentiles

# Shown in this order; every figure in ms. "model" is the engine's own share (prefill and first
# chunk decode, the first vocoder window): what the ceiling's first chunk measures in-process.
HOPS = (
    ("proxy", "Serve's proxy, its hooks and the HTTP exchange: client TTFB - Ingress TTFB"),
    ("client_http", "of which client <-> proxy (HTTP parse, socket, the client): TTFB - the proxy's Server-Timing"),
    ("proxy_ingress", "of which the proxy: hooks, the call to the Ingress and back (Server-Timing - Ingress)"),
    ("ingress_http", "of which the Ingress's HTTP stack before the request's record (body, validation)"),
    ("ingress_checks", "Ingress: checks, voice, script, cache key, stream slot"),
    ("plan_handle", "TextNormalizer call's own cost: call - normalizer"),
    ("normalizer", "TextNormalizer: the plan itself"),
    ("vocoder_handle", "Ingress -> Vocoder stream call's own cost, to its first item: call - Vocoder's share"),
    ("acoustic_handle", "Vocoder -> Acoustic stream call's own cost, to its first chunk: call - Acoustic's share"),
    ("admit_window", "Acoustic: @serve.batch admission window and submit"),
    ("queue_prefill", "engine: queue and prefill (submitted -> admitted)"),
    ("first_chunk", "engine: the first chunk's decode steps (admitted -> first chunk)"),
    ("acoustic_handover", "Acoustic: decode thread -> the stream's event loop"),
    ("acoustic_other", "Acoustic: the rest (the window's hand-back, a multi-segment request's ordering)"),
    ("vocoder_feed", "Vocoder: first window's decode and encode (with the torch-thread hand-over)"),
    ("vocoder_other", "Vocoder: the rest up to its first yield (credit wait, wire decode)"),
    ("ingress_answer", "Ingress: first item -> the response's first body byte"),
)


def read_ingress_log(session_dir: Optional[str]) -> dict[str, dict]:
    """request_id -> the Ingress's ``speech`` log line, from every Ingress replica's log."""
    out: dict[str, dict] = {}
    if not session_dir:
        return out
    for path in sorted(Path(session_dir, "logs", "serve").glob("replica_*Ingress*.log")):
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            i = line.find('{"event": "speech"')
            if i < 0:
                continue
            try:
                item = json.loads(line[i:])
            except ValueError:
                continue
            out[item.get("request_id", "")] = item
    return out


def proxy_ms(server_timing: Optional[str]) -> Optional[float]:
    """The proxy's ``proxy;dur=<ms>`` from a Server-Timing header."""
    for part in (server_timing or "").split(","):
        name, _, rest = part.strip().partition(";")
        if name == "proxy" and rest.startswith("dur="):
            try:
                return float(rest[4:])
            except ValueError:
                return None
    return None


def hops_of(ttfb_s: float, line: dict, proxy: Optional[float] = None) -> Optional[dict]:
    """One request's hops (ms) from its client TTFB and its Ingress log line; None if the line
    lacks the Vocoder's part (an old server, a cache hit)."""
    f = line.get("first_audio") or {}
    need = ("ingress_checks", "plan_call", "vocoder_call", "ingress_opened", "vocoder_total", "acoustic_call")
    if line.get("ttfb_s") is None or any(k not in f for k in need):
        return None
    ingress_ttfb = line["ttfb_s"] * 1000.0
    h = {
        "proxy": ttfb_s * 1000.0 - ingress_ttfb,
        "ingress_checks": f["ingress_checks"],
        "plan_handle": f["plan_call"] - f.get("normalizer", 0.0),
        "normalizer": f.get("normalizer", 0.0),
        "vocoder_handle": f["vocoder_call"] - f["vocoder_total"],
        "acoustic_handle": f["acoustic_call"] - f.get("acoustic_total", 0.0),
        "admit_window": f.get("admit_window", 0.0),
        "queue_prefill": f.get("queue_prefill", 0.0),
        "first_chunk": f.get("first_chunk", 0.0),
        "acoustic_handover": f.get("acoustic_handover", 0.0),
        "acoustic_other": f.get("acoustic_total", 0.0)
        - sum(f.get(k, 0.0) for k in ("admit_window", "queue_prefill", "first_chunk", "acoustic_handover")),
        "vocoder_feed": f.get("vocoder_feed", 0.0),
        "vocoder_other": f["vocoder_total"] - f["acoustic_call"] - f.get("vocoder_feed", 0.0),
        "ingress_answer": ingress_ttfb - f["ingress_opened"],
    }
    if proxy is not None:
        h["client_http"] = ttfb_s * 1000.0 - proxy
        h["proxy_ingress"] = proxy - ingress_ttfb - f.get("ingress_http", 0.0)
    if "ingress_http" in f:
        h["ingress_http"] = f["ingress_http"]
    # Whatever the Ingress's hops do not cover between its start and the first item (rounding, the
    # wait_for around the open): kept so the hops add up to the client's TTFB.
    covered = f["ingress_checks"] + f["plan_call"] + f["vocoder_call"]
    h["ingress_other"] = f["ingress_opened"] - covered
    h["model"] = h["queue_prefill"] + h["first_chunk"] + h["vocoder_feed"]
    h["ttfb"] = ttfb_s * 1000.0
    h["service"] = h["ttfb"] - h["model"]
    return h


def breakdown(records: Iterable, lines: dict[str, dict]) -> dict:
    """Per hop p50/p95/mean over a phase's completed requests (ms), the requests joined, and the
    service's own share (TTFB - the model's hops, per request)."""
    rows = []
    for r in records:
        ttfb = getattr(r, "ttfb", None)
        line = lines.get(getattr(r, "request_id", None) or "")
        if ttfb is None or line is None:
            continue
        h = hops_of(ttfb, line, proxy_ms(getattr(r, "server_timing", None)))
        if h is not None:
            rows.append(h)
    if not rows:
        return {"joined": 0}
    names = [n for n, _ in HOPS] + ["ingress_other", "model", "service", "ttfb"]
    out: dict = {"joined": len(rows), "hops_ms": {}}
    for n in names:
        p = percentiles([row[n] for row in rows if n in row])
        out["hops_ms"][n] = {k: round(p[k], 2) for k in ("p50", "p95", "mean") if p.get(k) is not None}
    return out


# ---------------------------------------------------------------------- before/after in one run

# What the A/B toggles live (the Acoustic user_config, no restart): "before" is the admission
# window for every request, "after" submits a request that finds the engine idle at once.
AB_SETTINGS = {"before": {"admit_idle_at_once": False}, "after": {"admit_idle_at_once": True}}


def ab_pairs(serve, target, pairs: int, per_half: int, texts: tuple[str, ...], pause_s: float = 0.3) -> dict:
    """Alternating halves at 1 client (ABBA order: drift cancels), each ``per_half`` one-row
    requests read to their end, the Acoustic user_config switched live between halves. Per half
    its hops; per pair the after/before ratio of the TTFB and service-share p50s; over all halves
    of each side the breakdown."""
    import asyncio

    from . import loadgen

    halves: list[dict] = []
    records: dict[str, list] = {"before": [], "after": []}
    for i in range(pairs):
        order = ("before", "after") if i % 2 == 0 else ("after", "before")
        pair: dict = {}
        for side in order:
            _switch(serve, AB_SETTINGS[side])
            run = asyncio.run(
                loadgen.closed_loop(target, 1, 600.0, iter(texts * (per_half // len(texts) + 1)), max_requests=per_half)
            )
            time.sleep(pause_s + 0.5)
            lines = read_ingress_log(serve.session_dir)
            b = breakdown(run.records, lines)
            records[side].extend(run.records)
            pair[side] = {
                "ttfb_p50_ms": _hop(b, "ttfb"),
                "service_p50_ms": _hop(b, "service"),
                "joined": b.get("joined", 0),
            }
        halves.append(pair)
    _switch(serve, AB_SETTINGS["after"])  # the shipped default back
    lines = read_ingress_log(serve.session_dir)
    out: dict = {"settings": AB_SETTINGS, "pairs": halves, "per_half": per_half}
    for side in ("before", "after"):
        out[side] = breakdown(records[side], lines)
    for fig in ("ttfb_p50_ms", "service_p50_ms"):
        ratios = [p["after"][fig] / p["before"][fig] for p in halves if p["after"].get(fig) and p["before"].get(fig)]
        out[f"{fig.replace('_ms', '')}_after_over_before"] = ratios and round(median(ratios), 4) or None
    return out


def _switch(serve, settings: dict) -> None:
    """Apply ``settings`` to the Acoustic user_config (the replica reports them), then let it idle."""
    serve.reconfigure_acoustic(**settings)
    serve.wait_idle(60)


def _hop(b: dict, name: str) -> Optional[float]:
    return (b.get("hops_ms") or {}).get(name, {}).get("p50")


def ab_line(ab: dict) -> str:
    """One progress line of the before/after."""

    def side(name: str) -> str:
        return f"{name} TTFB p50 {_hop(ab[name], 'ttfb')} ms, service {_hop(ab[name], 'service')} ms"

    return (
        f"first audio: {side('before')}; {side('after')}; per pair after/before "
        f"TTFB {ab.get('ttfb_p50_after_over_before')}, service {ab.get('service_p50_after_over_before')}"
    )


def markdown(report: dict) -> list[str]:
    """report.md's section: the hops at each closed-loop level and the before/after."""
    serve = report.get("serve") or {}
    levels = {c: s.get("first_audio") for c, s in (serve.get("closed") or {}).items() if s.get("first_audio")}
    ab = serve.get("first_audio_ab")
    if not levels and not ab:
        return []
    cols = [(f"c{c}", b) for c, b in levels.items()]
    if ab:
        cols += [("A/B before", ab.get("before") or {}), ("A/B after", ab.get("after") or {})]
    extra = (
        ("ingress_other", "Ingress: the rest between its start and the first item"),
        ("model", "**the model**: queue+prefill + first chunk + first vocoder window"),
        ("service", "**the service's own share**: TTFB - the model"),
        ("ttfb", "client TTFB"),
    )
    # not measured by a run of an earlier revision: left out
    rows = [(name, what) for name, what in (*HOPS, *extra) if any(_hop(b, name) is not None for _, b in cols)]
    columns = [Col("hop", 0)] + [Col(name, lambda x, b=b: str(_hop(b, x[0]))) for name, b in cols] + [Col("what", 1)]
    out = [
        "## First audio, hop by hop (ms, p50 per hop over the requests joined with the Ingress's log)",
        "",
        *Table(columns, rows).lines(),
    ]
    out.append("| requests joined | " + " | ".join(str(b.get("joined")) for _, b in cols) + " | |")
    if ab:
        out += [
            "",
            f"Before/after in one run ({len(ab.get('pairs') or [])} ABBA pairs of {ab.get('per_half')} one-row "
            f"requests at 1 client, switched live: {ab.get('settings')}): per-pair after/before of the p50s, "
            f"TTFB {ab.get('ttfb_p50_after_over_before')}, service share {ab.get('service_p50_after_over_before')}.",
        ]
    return out + [""]
