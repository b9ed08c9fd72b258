"""``python -m bench dialogue``: a ten-turn, two-voice dialogue through ``POST /v1/audio/dialogue``
against the same turns sent one after another through ``POST /v1/audio/speech``.

The dialogue (``TURNS``: two voices taking turns, Chinese, English and one mixed turn, ~30 s of
speech) is spoken two ways, in one run, the ways alternating over ``--rounds`` rounds (dialogue
first in even rounds, sequential first in odd ones):

* **dialogue**: one ``POST /v1/audio/dialogue`` with all ten turns (pcm, streamed): the Ingress
  plans every turn's segments as one script and they all enter the decode loop together, one row
  each, spoken in turn order with ``pause_s`` of silence between turns;
* **sequential**: what a client without the dialogue API does: ten ``POST /v1/audio/speech``, one
  per turn in its voice, each sent when the previous answer's last byte came.

Each way is timed from sending its first request to the last byte of its last answer. Every
request sends ``Cache-Control: no-store`` and a fixed seed: turn ``k``'s request gets the seed
the dialogue gives that turn's first segment (``segment_seed(seed, segments before k)``), so
every segment decodes with the same seed both ways. With random weights each segment's length is
fixed by its text (bench/lib/corpus.py): the two ways' audio must match to the sample, the
dialogue's being longer by exactly its pauses. The ratio **sequential / dialogue** (p50 over the
rounds; target >= 2.5 on the 2-core box) is what batching the turns gives; the Acoustic engine's
counters (``Acoustic.stats()`` before and after each way) say how many rows each step decoded.

    python -m bench dialogue                                  # tiny weights: checks the tooling
    python -m bench dialogue --weights random --out bench/results/dialogue-<date>
    python -m bench dialogue --url http://127.0.0.1:8000      # a running app (no engine counters)
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import httpx

from ..lib.corpus import BYTES_PER_AUDIO_SECOND, SAMPLE_RATE, plan_corpus, planned_samples
from ..lib.harness import Harness, logger
from ..lib.report import Col, Doc, Figure, Kind, Panel, Series, bars, failed, fmt, line
from ..lib.stats import median, ratio

TARGET_RATIO = 2.5
NO_STORE = {"Cache-Control": "no-store"}
WAYS = ("dialogue", "sequential")

# A support call: two voices taking turns, ~30 s of speech (29.99 s planned, one segment a turn).
TURNS: tuple[dict[str, str], ...] = (
    {"voice": "alloy", "input": "Hi, thanks for calling. How can I help you today?"},
    {"voice": "echo", "input": "你好，我上周买的耳机有一边没声音了。"},
    {"voice": "alloy", "input": "Sorry to hear that. Do you have the order number?"},
    {"voice": "echo", "input": "有的，订单号是一二三四五六。"},
    {"voice": "alloy", "input": "Thanks. It was shipped last Monday, right?"},
    {"voice": "echo", "input": "对，星期三收到的，昨天右边就不响了。"},
    {"voice": "alloy", "input": "没问题，我们免费给您换一副新的 headphones。"},
    {"voice": "echo", "input": "Great. Do I send the old pair back first?"},
    {"voice": "alloy", "input": "No need. Put them in the box we send you."},
    {"voice": "echo", "input": "太好了，谢谢你，再见！"},
)

# Counters of Acoustic.stats() summed over a way's requests.
COUNTERS = (
    "steps",
    "row_steps",
    "admissions",
    "rows_admitted",
    "rows_finished",
    "rows_cancelled",
    "rows_failed",
    "rows_parked",
    "rows_resumed",
    "prefill_seconds",
    "decode_seconds",
)

log = logger("dialogue")


# ------------------------------------------------------------------------------ pure helpers


def pause_samples(pause_s: float) -> int:
    """Samples of one pause between turns (the pipeline's ``_silence``)."""
    return int(round(pause_s * SAMPLE_RATE))


def turn_seeds(seed: int, segments_per_turn: Sequence[int]) -> list[int]:
    """The seed of each turn's own ``/v1/audio/speech`` request such that its segments decode with
    the seeds the dialogue gives them: the dialogue seeds segment ``i`` of the whole script with
    ``segment_seed(seed, i)``, a single request its segment ``j`` with ``segment_seed(its seed, j)``,
    and ``segment_seed`` is linear in the index."""
    from serve_app.engine.planner import segment_seed

    seeds, before = [], 0
    for n in segments_per_turn:
        seeds.append(segment_seed(seed, before))
        before += n
    return seeds


def segments_per_turn(segments: list[dict], turns: int) -> list[int]:
    """Segments of each turn, from a timed dialogue answer's ``segments`` (each names its turn)."""
    counts = [0] * turns
    for s in segments:
        counts[s["turn"]] += 1
    return counts


def planned(turns: Sequence[dict[str, str]] = TURNS) -> list[dict[str, Any]]:
    """Each turn's segments and audio as the project's planner cuts it (random weights: exact)."""
    out = []
    for turn, (_, tokens, _texts) in zip(turns, plan_corpus(tuple(t["input"] for t in turns))):
        out.append(
            {
                "voice": turn["voice"],
                "input": turn["input"],
                "segments": len(tokens),
                "tokens": tokens,
                "audio_s": round(planned_samples(tokens) / SAMPLE_RATE, 3),
            }
        )
    return out


def expected_samples(plan: list[dict[str, Any]], pause_s: float) -> dict[str, int]:
    """Samples each way must give: every turn's speech; the dialogue adds a pause between turns."""
    speech = sum(planned_samples(p["tokens"]) for p in plan)
    return {"sequential": speech, "dialogue": speech + (len(plan) - 1) * pause_samples(pause_s)}


def as_dialogue(turn_pcm: Sequence[bytes], pause_s: float) -> bytes:
    """The turns' own answers (s16le) joined as the dialogue places them: a pause between turns."""
    return (b"\x00\x00" * pause_samples(pause_s)).join(turn_pcm)


def counter_delta(before: Optional[dict], after: Optional[dict]) -> Optional[dict]:
    """The engine's counters over an interval (None without stats)."""
    if not before or not after:
        return None
    return {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS}


def add_counters(a: Optional[dict], b: Optional[dict]) -> Optional[dict]:
    if a is None or b is None:
        return a if b is None else b
    return {k: a.get(k, 0) + b.get(k, 0) for k in COUNTERS}


def engine_summary(d: Optional[dict]) -> dict[str, Any]:
    """Rows per step, time per step and the engine's busy time from summed counters."""
    if not d:
        return {}
    steps = d["steps"]
    return {
        "mean_rows_per_step": round(d["row_steps"] / steps, 3) if steps else None,
        "ms_per_decode_step": round(1000 * d["decode_seconds"] / steps, 2) if steps else None,
        "steps": steps,
        "row_steps": d["row_steps"],
        "rows_admitted": d["rows_admitted"],
        "admissions": d["admissions"],
        "rows_finished": d["rows_finished"],
        "rows_cancelled": d["rows_cancelled"],
        "rows_failed": d["rows_failed"],
        "rows_parked": d["rows_parked"],  # left the batch while the request's reader was behind (max_stream_chunks)
        "prefill_s": round(d["prefill_seconds"], 3),
        "decode_s": round(d["decode_seconds"], 3),
    }


def summarize(
    rounds: list[dict[str, Any]], pause_s: float, expected: Optional[dict[str, int]] = None
) -> dict[str, Any]:
    """Both ways over the rounds: wall time p50 and per round, first audio, audio seconds, the
    engine's rows per step; the ratio sequential / dialogue (p50s, and per round); whether the
    audio matched (same length everywhere, the dialogue = the turns with pauses)."""
    out: dict[str, Any] = {}
    for way in WAYS:
        runs = [r[way] for r in rounds if way in r]
        walls = [x["wall_s"] for x in runs]
        counters = None
        for x in runs:
            counters = add_counters(counters, x.get("counters"))
        samples = sorted({x["samples"] for x in runs})
        out[way] = {
            "wall_s_p50": round(median(walls), 3) if walls else None,
            "wall_s": [round(w, 3) for w in walls],
            "first_audio_s_p50": round(median(x["first_audio_s"] for x in runs), 3) if runs else None,
            "audio_s": round(samples[0] / SAMPLE_RATE, 3)
            if len(samples) == 1
            else [round(s / SAMPLE_RATE, 3) for s in samples],
            "samples": samples[0] if len(samples) == 1 else samples,
            "engine": engine_summary(counters),
            "engine_per_round": [engine_summary(x.get("counters")) for x in runs],
        }
        if expected is not None:
            out[way]["expected_samples"] = expected[way]
    d, s = out["dialogue"], out["sequential"]
    out["ratio_p50"] = ratio(s["wall_s_p50"], d["wall_s_p50"], 3)
    out["ratio_per_round"] = [
        ratio(r["sequential"]["wall_s"], r["dialogue"]["wall_s"], 3)
        for r in rounds
        if "sequential" in r and "dialogue" in r
    ]
    d_samples = [r["dialogue"]["samples"] for r in rounds if "dialogue" in r]
    s_samples = [r["sequential"]["samples"] for r in rounds if "sequential" in r]
    n_pauses = len(TURNS) - 1
    speech = {x - n_pauses * pause_samples(pause_s) for x in d_samples}
    out["audio_match"] = bool(
        d_samples
        and s_samples
        and len(speech) == 1
        and set(s_samples) == speech
        and (
            expected is None
            or (set(d_samples) == {expected["dialogue"]} and set(s_samples) == {expected["sequential"]})
        )
    )
    identical = [r["identical_pcm"] for r in rounds if r.get("identical_pcm") is not None]
    out["identical_pcm_rounds"] = f"{sum(identical)} of {len(identical)}" if identical else None
    hashes = [r["sha1"] for r in rounds if r.get("sha1")]
    if hashes:  # 1 each: every round gave the same audio
        out["distinct_pcm_over_rounds"] = {k: len({h[k] for h in hashes}) for k in hashes[0]}
    return out


# ------------------------------------------------------------------------------ the client


def stream(client: httpx.Client, path: str, body: dict, t0: float) -> dict[str, Any]:
    """One streamed request: its bytes, and every chunk as (seconds after ``t0``, bytes)."""
    chunks: list[tuple[float, int]] = []
    data = bytearray()
    with client.stream("POST", path, json=body, headers=NO_STORE) as r:
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"{path}: {r.status_code} {r.text[:300]}")
        cache = r.headers.get("x-cache")
        for chunk in r.iter_raw():
            if chunk:
                chunks.append((time.perf_counter() - t0, len(chunk)))
                data += chunk
    return {"pcm": bytes(data), "chunks": chunks, "x_cache": cache, "end": time.perf_counter() - t0}


def dialogue_body(seed: int, pause_s: float) -> dict[str, Any]:
    return {
        "model": "chattts",
        "turns": [dict(t) for t in TURNS],
        "pause_s": pause_s,
        "seed": seed,
        "response_format": "pcm",
    }


def turn_body(turn: dict[str, str], seed: int) -> dict[str, Any]:
    return {"model": "chattts", "input": turn["input"], "voice": turn["voice"], "seed": seed, "response_format": "pcm"}


def timeline(chunks: list[tuple[float, int]], every_s: float = 0.25) -> list[list[float]]:
    """(seconds, audio seconds received so far), at most one point per ``every_s`` and the last."""
    pts: list[list[float]] = []
    total = 0
    for i, (t, n) in enumerate(chunks):
        total += n
        if not pts or t - pts[-1][0] >= every_s or i == len(chunks) - 1:
            pts.append([round(t, 3), round(total / BYTES_PER_AUDIO_SECOND, 3)])
    return pts


def run_dialogue(client: httpx.Client, seed: int, pause_s: float) -> tuple[dict[str, Any], bytes]:
    t0 = time.perf_counter()
    r = stream(client, "/v1/audio/dialogue", dialogue_body(seed, pause_s), t0)
    return {
        "wall_s": r["end"],
        "first_audio_s": r["chunks"][0][0] if r["chunks"] else None,
        "samples": len(r["pcm"]) // 2,
        "x_cache": [r["x_cache"]],
        "timeline": timeline(r["chunks"]),
    }, r["pcm"]


def run_sequential(client: httpx.Client, seeds: list[int]) -> tuple[dict[str, Any], list[bytes]]:
    t0 = time.perf_counter()
    chunks: list[tuple[float, int]] = []
    pcm, turn_s, caches = [], [], []
    for turn, seed in zip(TURNS, seeds):
        start = time.perf_counter() - t0
        r = stream(client, "/v1/audio/speech", turn_body(turn, seed), t0)
        chunks += r["chunks"]
        pcm.append(r["pcm"])
        turn_s.append(round(r["end"] - start, 3))
        caches.append(r["x_cache"])
    return {
        "wall_s": time.perf_counter() - t0,
        "first_audio_s": chunks[0][0] if chunks else None,
        "samples": sum(len(p) for p in pcm) // 2,
        "turn_wall_s": turn_s,
        "x_cache": caches,
        "timeline": timeline(chunks),
    }, pcm


# ------------------------------------------------------------------------------ report


def _engine(key: str) -> Callable[[tuple], Any]:
    return lambda x: x[1]["engine"].get(key)


WAYS_COLUMNS = [
    Col("way", 0),
    Col("to the last byte p50 (s)", lambda x: x[1]["wall_s_p50"]),
    Col("each round (s)", lambda x: ", ".join(fmt(v) for v in x[1]["wall_s"])),
    Col("first audio p50 (s)", lambda x: x[1]["first_audio_s_p50"]),
    Col("audio (s)", lambda x: str(x[1]["audio_s"])),
    Col("rows per step", _engine("mean_rows_per_step")),
    Col("decode step (ms)", _engine("ms_per_decode_step")),
    Col(
        "engine decode / prefill (s, all rounds)",
        lambda x: f"{fmt(x[1]['engine'].get('decode_s'))} / {fmt(x[1]['engine'].get('prefill_s'))}",
    ),
    Col("decode steps (all rounds)", _engine("steps")),
    Col("rows parked (all rounds)", _engine("rows_parked")),
]
TURNS = [
    Col("turn", 0),
    Col("voice", lambda x: x[1]["voice"]),
    Col("text", lambda x: x[1]["input"]),
    Col("segments", lambda x: x[1]["segments"]),
    Col("planned audio (s)", lambda x: str(x[1]["audio_s"])),
    Col("sequential: seconds to its last byte, p50", 2),
]


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Dialogue benchmark, {m['started']}", m["command"])
    doc.add(
        f"weights: {m['weights']}, git {m['git']}, {m['cpus']} CPUs, rounds: {m['rounds']}, seed {m['seed']}, "
        f"pause between turns {m['pause_s']} s, load average at start {m['loadavg_start']}, at end "
        f"{m.get('loadavg_end', '–')}, wall {m.get('wall_s', '–')} s",
        "",
    )
    if report.get("error"):
        doc.add(failed(report, " (the tables hold what was measured before)."), "")
    s = report.get("summary")
    if s:
        met = s["ratio_p50"] is not None and s["ratio_p50"] >= TARGET_RATIO
        head = (
            f"**sequential / dialogue (p50): {fmt(s['ratio_p50'])}** (target >= {TARGET_RATIO}: "
            f"{'met' if met else 'missed'}); per round {', '.join(fmt(x) for x in s['ratio_per_round'])}. "
            f"Audio lengths matched: {s['audio_match']} (samples identical in {s['identical_pcm_rounds'] or '–'} rounds; "
            f"distinct audio over the rounds: {s.get('distinct_pcm_over_rounds', '–')})."
        )
        ways = [("dialogue (one request)", s["dialogue"]), ("sequential (10 requests)", s["sequential"])]
        doc.table(WAYS_COLUMNS, ways, before=(head, ""))
        doc.add("", "The dialogue's audio includes its 9 pauses; the speech in it is the sequential audio.")
    if report.get("turns"):
        per_turn = [r["sequential"]["turn_wall_s"] for r in report.get("rounds", []) if "sequential" in r]
        rows = [(i, t, median(x[i] for x in per_turn) if per_turn else None) for i, t in enumerate(report["turns"])]
        doc.table(TURNS, rows)
    if report.get("warnings"):
        doc.add("", "Warnings:", *[f"- {w}" for w in report["warnings"]])
    return doc


COLORS = {"dialogue": "tab:blue", "sequential": "tab:orange"}


def to_figure(report: dict) -> Figure:
    rounds = report.get("rounds") or []
    if not rounds:
        raise ValueError("no rounds measured")
    received = Panel("audio received (every round)", "seconds since the first request", "audio seconds")
    top = 0.0
    for i, r in enumerate(rounds):
        for way in WAYS:
            if way in r:
                pts = r[way]["timeline"]
                top = max(top, pts[-1][0])
                xs, ys = [0] + [p[0] for p in pts], [0] + [p[1] for p in pts]
                received.add(line(xs, ys, way if i == 0 else None, "", color=COLORS[way], alpha=0.8, lw=1.2))
    received.add(line([0, top], [0, top], "real time", "", color="gray", ls="--", lw=0.8))
    s = report.get("summary") or {}
    walls = Panel(
        f"to the last byte (sequential / dialogue p50 {fmt(s.get('ratio_p50'))}x)", ylabel="seconds", grid="y"
    )
    walls.xticks = (list(range(len(rounds))), [f"round {i}" for i in range(len(rounds))])
    for k, way in enumerate(WAYS):
        xs = [i + (k - 0.5) * 0.38 for i in range(len(rounds))]
        walls.add(bars(xs, [r.get(way, {}).get("wall_s", 0) for r in rounds], way, width=0.38, color=COLORS[way]))
    for i, q in enumerate(s.get("ratio_per_round", [])):
        if q is not None:
            top_i = max(rounds[i].get(w, {}).get("wall_s", 0) for w in WAYS)
            walls.add(Series("text", i, top_i * 1.02, f"{q:.2f}x", kw={"ha": "center", "fontsize": 8}))
    return Figure([received, walls], shape=(1, 2), size=(11, 4))


KIND = Kind("dialogue.json", to_doc, to_figure, indent=1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", help="a running app (default: start config/serve.yaml locally with --weights)")
    p.add_argument(
        "--weights",
        default="random-tiny",
        choices=["random", "random-tiny"],
        help="random-tiny: a quick check of the tooling; random: full size, the real figure",
    )
    p.add_argument("--config", help="Serve config file (default config/serve.yaml)")
    p.add_argument("--ray-cpus", type=float)
    p.add_argument("--rounds", type=int, default=3, help="rounds, each both ways (their order alternating)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--pause-s", type=float, default=0.4, help="silence between the dialogue's turns")
    p.add_argument("--timeout-s", type=float, default=600.0, help="per request")
    p.add_argument(
        "--out", help="report directory (default bench/results/dialogue-<date>/): dialogue.json, report.md, report.png"
    )


def main(a: "argparse.Namespace | Sequence[str] | None" = None) -> int:
    if not isinstance(a, argparse.Namespace):
        p = argparse.ArgumentParser(prog="python -m bench dialogue", description=__doc__.strip().split("\n\n")[0])
        add_arguments(p)
        argv = list(sys.argv[1:] if a is None else a)
        a = p.parse_args(argv)
        a.argv = ["dialogue", *argv]
    from ..lib.procs import REPO_ROOT, free_port
    from ..lib.serve import ServeRunner, apply_overrides, load_config

    out = Path(a.out) if a.out else REPO_ROOT / "bench" / "results" / f"dialogue-{time.strftime('%Y-%m-%d')}"
    runner = None
    url = a.url
    harness = Harness(
        out,
        KIND.write,
        a.argv,
        weights=a.weights if not a.url else "as served",
        rounds=a.rounds,
        seed=a.seed,
        pause_s=a.pause_s,
        target_ratio=TARGET_RATIO,
    )
    report = harness.report
    plan = planned()
    report["turns"] = plan
    report["rounds"] = []
    with harness:
        try:
            if url is None:
                runner = ServeRunner(
                    apply_overrides(load_config(a.config), weights=a.weights, port=free_port()), a.ray_cpus
                )
                log(f"starting config/serve.yaml with {a.weights} weights")
                harness.meta["serve_start_s"] = round(runner.start(), 1)
                url = runner.base_url
            stats = runner.acoustic_stats if runner else (lambda: None)
            with httpx.Client(base_url=url, timeout=a.timeout_s, trust_env=False) as client:
                # Unmeasured: the dialogue once with its timing (how many segments each turn has,
                # so the sequential requests get the same seeds) and a first speech request.
                t = time.perf_counter()
                r = client.post(
                    "/v1/audio/dialogue/with-timestamps", json=dialogue_body(a.seed, a.pause_s), headers=NO_STORE
                )
                if r.status_code != 200:
                    raise RuntimeError(f"dialogue/with-timestamps: {r.status_code} {r.text[:300]}")
                counts = segments_per_turn(r.json()["segments"], len(TURNS))
                harness.meta["warmup_dialogue_s"] = round(time.perf_counter() - t, 2)
                if counts != [p["segments"] for p in plan]:
                    harness.warn(
                        f"the served planner cut the turns into {counts} segments, the local one into "
                        f"{[p['segments'] for p in plan]}: the audio is not known in advance"
                    )
                    expected = None
                else:
                    expected = expected_samples(plan, a.pause_s)
                seeds = turn_seeds(a.seed, counts)
                report["segments_per_turn"], report["turn_seeds"] = counts, seeds
                stream(client, "/v1/audio/speech", turn_body(TURNS[0], seeds[0]), time.perf_counter())
                log(f"warm-up done: dialogue {harness.meta['warmup_dialogue_s']} s, segments per turn {counts}")
                for i in range(a.rounds):
                    rnd: dict[str, Any] = {"round": i, "order": list(WAYS if i % 2 == 0 else WAYS[::-1])}
                    pcm: dict[str, Any] = {}
                    for way in rnd["order"]:
                        if runner:
                            runner.wait_idle()
                        before = stats()
                        if way == "dialogue":
                            res, pcm[way] = run_dialogue(client, a.seed, a.pause_s)
                        else:
                            res, pcm[way] = run_sequential(client, seeds)
                        res["counters"] = counter_delta(before, stats())
                        res["engine"] = engine_summary(res["counters"])
                        rnd[way] = res
                        if any(c == "hit" for c in res["x_cache"]):
                            harness.warn(f"round {i} {way}: an answer came from the cache (X-Cache: hit)")
                        log(
                            f"round {i} {way}: {res['wall_s']:.2f} s to the last byte, {res['samples'] / SAMPLE_RATE:.2f} s "
                            f"of audio, {res['engine'].get('mean_rows_per_step', '–')} rows per step"
                        )
                    joined = as_dialogue(pcm["sequential"], a.pause_s)
                    rnd["identical_pcm"] = pcm["dialogue"] == joined
                    # Whether the audio is the same from round to round too (each way's samples).
                    rnd["sha1"] = {
                        "dialogue": hashlib.sha1(pcm["dialogue"]).hexdigest()[:12],
                        "sequential_joined": hashlib.sha1(joined).hexdigest()[:12],
                    }
                    report["rounds"].append(rnd)
                    report["summary"] = summarize(report["rounds"], a.pause_s, expected)
                    harness.write()
            if report["rounds"] and not report["summary"]["audio_match"]:
                harness.warn(
                    "the two ways' audio lengths differ (or differ from the planned lengths): see rounds[].samples"
                )
        finally:
            if runner:
                runner.stop()
    print(KIND.markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
