"""A polite client's first chunk alone and beside a client with 200 queued segments, in the engine
alone (in-process, decode thread running), for each admission setting.

What fair admission buys (docs/architecture.md, "The decode loop"): the polite client's row gets a
reserved slot at the next step, and while another client is present a client holds at most
``max_running_rows_per_client`` rows, so the polite client's steps are not slowed by sixteen of the
heavy client's rows. Two ways the clients meet: the polite client present when the heavy one comes
(the usual case), and the heavy one filling an idle engine first (nothing running is stopped, so
the first polite request meets all of its rows).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Optional

from ..lib.harness import Harness
from ..lib.report import Col, Doc, Kind

POLITE_TEXT = "你好，欢迎使用语音合成服务。"
HEAVY_TEXT = "语音合成服务需要在异常输入面前保持稳定。"
# (name, AcousticConfig changes, ways the clients meet: True = the polite client was there first)
SETTINGS = (
    ("defaults", {}, (True, False)),
    ("cap 4", {"max_running_rows_per_client": 4}, (True,)),
    ("no running cap", {"max_running_rows_per_client": None}, (True,)),
    ("no reserve, no cap", {"reserved_rows": 0, "max_running_rows_per_client": None}, (True,)),
)
TARGET_RATIO = 1.5


def _segment(spk: str, tokens: int, seed: int, text: str, client: str):
    from serve_app.engine.types import SegmentRequest

    return SegmentRequest(text=text, spk_emb=spk, seed=seed, max_new_tokens=tokens, target_tokens=tokens, client=client)


def _first_chunk_s(engine, spk: str, seed: int) -> float:
    """One polite one-segment request: seconds from its submission to its first chunk."""
    stream = engine.submit(_segment(spk, 60, seed, POLITE_TEXT, "polite"))
    next(iter(stream))
    took = stream.first_chunk_at - stream.submitted_at
    stream.cancel()
    return took


def _wait(cond, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.005)


def measure(model, spk: str, repeats: int, polite_first: bool, **changes) -> dict:
    """Medians of ``repeats`` polite requests alone and beside the heavy client (each sent once
    the heavy client holds every slot it may, so none reuses a slot the previous one left)."""
    from serve_app.engine.acoustic import AcousticEngine
    from serve_app.engine.config import AcousticConfig
    from serve_app.engine.decode.scheduler import PRESENCE_SECONDS

    engine = AcousticEngine(model, AcousticConfig(listener_margin_s=None, **changes))
    engine.start()
    heavy_rows = lambda: sum(1 for r in list(engine.batch.rows) if r.req.client == "heavy")  # noqa: E731
    try:
        _first_chunk_s(engine, spk, 0)  # warm
        alone: Optional[float] = None
        if polite_first:
            alone = statistics.median(_first_chunk_s(engine, spk, i) for i in range(repeats))
        else:
            time.sleep(PRESENCE_SECONDS + 0.5)  # the polite client is forgotten
        streams = engine.submit_all([_segment(spk, 190, i, HEAVY_TEXT, "heavy") for i in range(200)])  # ~4 s each
        cap = engine.cfg.max_running_rows_per_client
        full = engine.cfg.max_rows if (cap is None or not polite_first) else min(cap, engine.cfg.max_rows)
        beside, rows = [], 0
        for i in range(repeats if polite_first else 1):  # heavy first: only the first request meets it unbounded
            _wait(lambda: heavy_rows() >= full and engine.running_rows == heavy_rows())
            rows = heavy_rows()
            beside.append(_first_chunk_s(engine, spk, 100 + i))
        for st in streams:
            st.cancel()
        if alone is None:
            _wait(lambda: engine.running_rows == 0)
            alone = statistics.median(_first_chunk_s(engine, spk, i) for i in range(repeats))
    finally:
        engine.stop()
    beside_s = statistics.median(beside)
    return {
        "alone_ms": round(1000 * alone, 1),
        "beside_ms": round(1000 * beside_s, 1),
        "ratio": round(beside_s / alone, 2),
        "heavy_rows_running": rows,
    }


COLUMNS = [
    Col("setting", "setting"),
    Col("clients met", "met"),
    Col("polite alone ms", "alone_ms", nd=1),
    Col("beside the heavy client ms", "beside_ms", nd=1),
    Col("ratio", lambda r: str(r["ratio"])),
    Col("heavy rows running", "heavy_rows_running"),
]


def to_doc(report: dict) -> Doc:
    m = report["meta"]
    doc = Doc(f"Fair admission in the engine, {m['started']}", m["command"])
    doc.add(f"weights: {m['weights']}, max_rows {m['max_rows']}; load average at start {m.get('loadavg_start')}")
    doc.table(COLUMNS, report.get("results", []))
    if "error" in report:
        doc.add("", f"**The run failed:** `{report['error']}`")
    return doc


KIND = Kind("fairness.json", to_doc, indent=1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default="random-tiny", choices=["random", "random-tiny"])
    p.add_argument("--repeats", type=int, default=15, help="polite requests per condition (medians)")
    p.add_argument("--out", help="write fairness.json and report.md here")


def main(a: argparse.Namespace) -> int:
    from serve_app.engine.config import AcousticConfig, ModelConfig, WeightsConfig
    from serve_app.engine.threads import on_new_thread
    from serve_app.engine.voices import OPENAI_VOICES, speaker_from_seed
    from serve_app.engine.weights.loading import load_model

    harness = Harness(
        Path(a.out) if a.out else None, KIND.write, a.argv, weights=a.weights, max_rows=AcousticConfig().max_rows
    )
    report = harness.report
    with harness:
        model = on_new_thread(load_model, ModelConfig(weights=WeightsConfig(source=a.weights), device="cpu"))
        spk = speaker_from_seed(model.chat.speaker, OPENAI_VOICES["alloy"])
        report["results"] = []
        for name, changes, ways in SETTINGS:
            for polite_first in ways:
                r = measure(model, spk, a.repeats, polite_first, **changes)
                report["results"].append(
                    {
                        "setting": name,
                        "met": "polite present" if polite_first else "heavy first",
                        **r,
                        "changes": changes,
                    }
                )
                harness.write()
        default = report["results"][0]
        report["target"] = {
            "ratio_defaults_polite_present": default["ratio"],
            "target": TARGET_RATIO,
            "met": default["ratio"] <= TARGET_RATIO,
        }
    print(KIND.markdown(report))
    return 0
