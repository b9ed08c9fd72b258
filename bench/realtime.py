"""``python -m bench realtime``: speaking while an LLM is still writing, over the WebSocket
(bench/README.md, "realtime").

Each session replays an assistant's reply as an LLM streams it (``--tokens-per-s`` tokens: a word
or word piece, one or two Chinese characters) into ``WS /v1/audio/speech/stream``. Per level, rounds
alternate: the replies' first sentences alone over HTTP (their TTFB), the sessions (first audio
after the sentence's last token, target <= 1.2x that TTFB; playback gaps, target 0 at 1 session),
and the whole replies over HTTP (the control: gaps the decode speed causes whatever the protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import httpx

from .lib.corpus import BYTES_PER_AUDIO_SECOND, SAMPLE_RATE, SAMPLES_PER_TOKEN
from .lib.harness import Harness, ints
from .lib.report import TARGETS, Col, Doc, Kind, failed, target
from .lib.serve import add_app_arguments
from .lib.stats import median, nearest_rank

TOKENS_PER_S = 30.0
TARGET_RATIO = 1.2
# A row plays in real time only if its decode steps take at most this long: one token per step,
# 512 samples a token at 24 kHz.
REAL_TIME_STEP_MS = 1000 * SAMPLES_PER_TOKEN / SAMPLE_RATE

# Assistant replies, first sentence first. English and Chinese, as a chat assistant answers.
REPLIES = (
    "Sure, here is a quick summary of the plan. We start with the data you sent yesterday and clean "
    "it up. Then we train a small model and check how it does on the test set. If the numbers look "
    "good, we ship it on Friday.",
    "That is a great question. The short answer is that the cache keeps the last few thousand "
    "results in memory. When it fills up, the oldest entries are dropped first. You can also turn it "
    "off per request with a header.",
    "好的，我来帮你安排一下明天的行程。上午九点我们先去博物馆，大概参观两个小时。中午在附近的餐厅吃饭，"
    "下午可以去公园散散步。晚上如果还有精力，可以去看一场电影。",
    "I found three flights that match your dates. The earliest leaves at seven in the morning and "
    "lands just before noon. The second one is in the afternoon and costs a little less. The last "
    "one is a late night flight with a short stop on the way.",
    "这个问题其实不难。首先要把数据按时间排好序，然后每隔一分钟取一次平均值。最后把结果画成一张图，"
    "就能很清楚地看出变化的趋势了。",
    "Thanks for waiting. I checked your account and everything looks fine. The payment went through "
    "this morning, and the receipt should be in your inbox within the hour.",
)

_TOKEN_RE = re.compile(r"[\u4e00-\u9fff]{1,2}|\s*[A-Za-z]{1,6}|\s*\d+|\s*[^\sA-Za-z\d\u4e00-\u9fff]|\s+")


def llm_tokens(text: str) -> list[str]:
    """The text as an LLM streams it: words and word pieces with their leading space, one or two
    Chinese characters, punctuation on its own. Joined, they give the text back."""
    tokens = _TOKEN_RE.findall(text)
    assert "".join(tokens) == text
    return tokens


def first_sentence(text: str) -> tuple[str, int]:
    """The reply's first sentence (as the segmenter ends it) and the index of the token that
    completes it."""
    from serve_app.engine.text.segment import split_sentences

    sentence = split_sentences(text)[0]
    end, pos = len(sentence.rstrip()), 0
    for i, tok in enumerate(llm_tokens(text)):
        pos += len(tok)
        if pos >= end:
            return sentence.strip(), i
    raise ValueError("no sentence end")


def playback_gaps(frames: list[tuple[float, float]]) -> tuple[float, int]:
    """(seconds a real-time player waited for audio, times it ran dry) for frames given as
    (arrival time, audio seconds), the player starting with the first frame."""
    if not frames:
        return 0.0, 0
    waited, dry = 0.0, 0
    play_end = frames[0][0]
    for t, seconds in frames:
        if t > play_end + 1e-3:  # the buffer ran out before this frame came (1 ms: timer noise)
            waited += t - play_end
            dry += 1
            play_end = t
        play_end += seconds
    return waited, dry


def buffer_needed(frames: list[tuple[float, float]]) -> float:
    """The smallest start-up delay after the first frame that plays the session without a gap:
    frame i must have come by the time the audio before it has played."""
    if not frames:
        return 0.0
    t0, played, need = frames[0][0], 0.0, 0.0
    for t, seconds in frames:
        need = max(need, t - t0 - played)
        played += seconds
    return need


# ---------------------------------------------------------------------------------------- clients


async def ws_session(url: str, reply: str, seed: int, tokens_per_s: float) -> dict[str, Any]:
    """One reply written at ``tokens_per_s`` into a session; the timings of its audio."""
    from serve_app.client import AsyncSpeechClient

    tokens = llm_tokens(reply)
    _, end_token = first_sentence(reply)
    sent_end: Optional[float] = None
    frames: list[tuple[float, float]] = []
    first_segment_audio: Optional[float] = None
    async with AsyncSpeechClient(url) as client, client.session(voice="alloy", seed=seed, response_format="pcm") as s:
        items = s.receive()
        created = await items.__anext__()
        assert created["type"] == "session.created", created
        t0 = time.perf_counter()

        async def write() -> None:
            nonlocal sent_end
            for i, tok in enumerate(tokens):
                await asyncio.sleep(max(0.0, t0 + i / tokens_per_s - time.perf_counter()))
                await s.append(tok)
                if i == end_token:
                    sent_end = time.perf_counter()
            await s.close()

        writer = asyncio.ensure_future(write())
        segment = None
        async for item in items:
            now = time.perf_counter()
            if isinstance(item, bytes):
                frames.append((now, len(item) / BYTES_PER_AUDIO_SECOND))
                if segment == 0 and first_segment_audio is None:
                    first_segment_audio = now
            elif item["type"] == "segment.start":
                segment = item["index"]
        await writer
    done = time.perf_counter()
    waited, dry = playback_gaps(frames)
    buffer = buffer_needed(frames)
    audio_s = sum(sec for _, sec in frames)
    return {
        "first_audio_after_sentence_s": first_segment_audio - sent_end,
        "write_s": len(tokens) / tokens_per_s,
        "audio_s": audio_s,
        "wall_s": done - t0,
        "gap_s": waited,
        "gaps": dry,
        "buffer_needed_s": buffer,
    }


async def http_frames(client: httpx.AsyncClient, text: str, seed: int) -> tuple[float, list[tuple[float, float]]]:
    """One streamed HTTP request (pcm, no cache): time to the first audio byte, and every chunk
    as (arrival time, audio seconds)."""
    body = {"model": "chattts", "input": text, "voice": "alloy", "seed": seed, "response_format": "pcm"}
    t0 = time.perf_counter()
    frames = []
    async with client.stream("POST", "/v1/audio/speech", json=body, headers={"Cache-Control": "no-store"}) as r:
        r.raise_for_status()
        async for chunk in r.aiter_raw():
            frames.append((time.perf_counter(), len(chunk) / BYTES_PER_AUDIO_SECOND))
    return frames[0][0] - t0, frames


async def measure_level(url: str, sessions: int, rounds: int, tokens_per_s: float, seed: int) -> dict[str, Any]:
    """Each round, at the same concurrency: HTTP requests of the replies' first sentences (TTFB),
    WebSocket sessions of the whole replies (each its own reply and seed), and, as the control
    for playback gaps, HTTP requests of the whole replies (all the text known at once)."""
    ws: list[dict] = []
    http: list[float] = []
    whole_gaps: list[float] = []
    async with httpx.AsyncClient(base_url=url, timeout=600, trust_env=False) as client:
        for r in range(rounds):
            picks = [(r * sessions + i) % len(REPLIES) for i in range(sessions)]
            seeds = [seed + 1000 * r + i for i in range(sessions)]
            firsts = await asyncio.gather(
                *(http_frames(client, first_sentence(REPLIES[p])[0], s) for p, s in zip(picks, seeds))
            )
            http += [ttfb for ttfb, _ in firsts]
            ws += await asyncio.gather(*(ws_session(url, REPLIES[p], s, tokens_per_s) for p, s in zip(picks, seeds)))
            wholes = await asyncio.gather(*(http_frames(client, REPLIES[p], s) for p, s in zip(picks, seeds)))
            whole_gaps += [playback_gaps(frames)[0] for _, frames in wholes]
    latency = [x["first_audio_after_sentence_s"] for x in ws]
    gaps = [x["gap_s"] for x in ws]
    buffers = [x["buffer_needed_s"] for x in ws]
    ws_p50, http_p50 = median(latency), median(http)
    return {
        "sessions": sessions,
        "rounds": rounds,
        "ws_first_audio_s": {
            "p50": round(ws_p50, 4),
            "p90": round(nearest_rank(latency, 0.9), 4),
            "max": round(max(latency), 4),
        },
        "http_ttfb_s": {
            "p50": round(http_p50, 4),
            "p90": round(nearest_rank(http, 0.9), 4),
            "max": round(max(http), 4),
        },
        "ratio_p50": round(ws_p50 / http_p50, 3),
        "gap_s": {"p50": round(median(gaps), 3), "max": round(max(gaps), 3), "total": round(sum(gaps), 3)},
        "sessions_with_gaps": sum(1 for x in ws if x["gaps"]),
        "http_whole_reply_gap_s": {"p50": round(median(whole_gaps), 3), "max": round(max(whole_gaps), 3)},
        "buffer_needed_s": {"p50": round(median(buffers), 3), "max": round(max(buffers), 3)},
        "audio_s_per_session": round(median(x["audio_s"] for x in ws), 2),
        "write_s_per_session": round(median(x["write_s"] for x in ws), 2),
        "wall_s_per_session": round(median(x["wall_s"] for x in ws), 2),
        "raw": {"ws": ws, "http_ttfb_s": http},
    }


# ---------------------------------------------------------------------------------------- report


def targets(levels: dict[str, dict]) -> dict[str, dict]:
    out = {f"ws_first_audio/http_ttfb c{n}": target(lv["ratio_p50"], "<=", TARGET_RATIO) for n, lv in levels.items()}
    if "1" in levels:
        out["playback gaps c1 (s)"] = target(levels["1"]["gap_s"]["total"], "<=", 0)
    return out


def _pair(key: str, nd: int = 2, scale: float = 1.0, hi: str = "max") -> Callable[[tuple], str]:
    """``p50 / <hi>`` of one of a level's distributions, as the table shows it."""
    return lambda x: f"{scale * x[1][key]['p50']:.{nd}f} / {scale * x[1][key][hi]:.{nd}f}"


COLUMNS = [
    Col("sessions", 0),
    Col("WS first audio after sentence p50 / p90 (ms)", _pair("ws_first_audio_s", 0, 1000, "p90")),
    Col("HTTP TTFB of the sentence p50 / p90 (ms)", _pair("http_ttfb_s", 0, 1000, "p90")),
    Col("ratio p50", lambda x: f"{x[1]['ratio_p50']:.2f}"),
    Col("playback gaps per session p50 / max (s)", _pair("gap_s")),
    Col("sessions with gaps", lambda x: f"{x[1]['sessions_with_gaps']} of {x[1]['sessions'] * x[1]['rounds']}"),
    Col("start-up buffer for no gap p50 / max (s)", _pair("buffer_needed_s")),
    Col("control: gaps of the whole reply over HTTP p50 / max (s)", _pair("http_whole_reply_gap_s")),
    Col(
        "audio / writing / wall per session (s)",
        lambda x: f"{x[1]['audio_s_per_session']} / {x[1]['write_s_per_session']} / {x[1]['wall_s_per_session']}",
    ),
    Col(
        f"decode step (ms; real time needs <= {REAL_TIME_STEP_MS:.1f})",
        lambda x: str(x[1].get("ms_per_decode_step", "–")),
    ),
    Col("mean rows per step", lambda x: str(x[1].get("engine", {}).get("mean_rows_per_step", "–"))),
]


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Realtime (WebSocket) benchmark, {m['started']}", m["command"])
    doc.add(
        f"weights: {m['weights']}, LLM: {m['tokens_per_s']} tokens/s, load average at start {m['loadavg_start']}",
        "",
    )
    if report.get("error"):
        doc.add(failed(report, " (the tables hold what was measured before)."), "")
    doc.table(COLUMNS, report.get("levels", {}).items(), before=())
    doc.table(TARGETS, report.get("targets", {}).items())
    return doc


KIND = Kind("realtime.json", to_doc, indent=1)


# ---------------------------------------------------------------------------------------- command


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_app_arguments(p, url="a running app (default: start config/serve.yaml locally with --weights)")
    p.add_argument("--levels", type=ints, default=[1, 8], help="concurrent sessions, comma list")
    rounds = "rounds per level (HTTP first sentences, WebSocket, HTTP whole replies); one, or one per level"
    p.add_argument("--rounds", type=ints, default=[3], help=rounds + " (e.g. 12,3: single sessions are noisy)")
    p.add_argument("--tokens-per-s", type=float, default=TOKENS_PER_S)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="write realtime.json and report.md here")


def main(a: argparse.Namespace) -> int:
    from .lib.serve import ServeRunner, engine_delta

    levels = a.levels
    rounds = a.rounds * len(levels) if len(a.rounds) == 1 else a.rounds
    if len(rounds) != len(levels):
        raise SystemExit("--rounds: one number, or one per level")
    runner, url = None, a.url
    weights = a.weights if not url else "as served"
    harness = Harness(Path(a.out) if a.out else None, KIND.write, a.argv, weights=weights, tokens_per_s=a.tokens_per_s)
    report = harness.report
    with harness:
        report["levels"] = {}
        try:
            if url is None:
                # The bench is one client opening every session at once: let it hold as many
                # sockets before session.start as the largest level (the shipped limit is 4).
                unstarted = {"applications.chattts.args.ingress.websocket.max_unstarted_per_client": max(4, *levels)}
                runner = ServeRunner.from_args(a, unstarted)
                harness.meta["serve_start_s"] = round(runner.start(), 1)
                url = runner.base_url
            # One unmeasured round first: the first socket, session and request of each kind after
            # start-up pay one-off costs.
            asyncio.run(measure_level(url, 1, 1, a.tokens_per_s, a.seed + 10**6))
            for n, level_rounds in zip(levels, rounds):
                before = runner.acoustic_stats() if runner else None
                level = asyncio.run(measure_level(url, n, level_rounds, a.tokens_per_s, a.seed))
                if runner:
                    level["engine"] = engine_delta(before, runner.acoustic_stats())
                    steps = level["engine"].get("steps")
                    level["ms_per_decode_step"] = (
                        round(1000 * level["engine"]["decode_s"] / steps, 1) if steps else None
                    )
                report["levels"][str(n)] = level
                print(
                    f"c{n}: WS first audio p50 {1000 * level['ws_first_audio_s']['p50']:.0f} ms, HTTP TTFB p50 "
                    f"{1000 * level['http_ttfb_s']['p50']:.0f} ms (ratio {level['ratio_p50']:.2f}); playback gaps p50 "
                    f"{level['gap_s']['p50']:.2f} s, max {level['gap_s']['max']:.2f} s",
                    file=sys.stderr,
                )
        finally:
            if runner:
                runner.stop()
        report["targets"] = targets(report["levels"])
    print(KIND.markdown(report))
    return 0
