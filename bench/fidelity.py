"""``python -m bench fidelity``: batch invariance (bench/README.md, "fidelity"). Does a row decode
the same speech alone, in a batch, and as ChatTTS does?

Per weights size and precision, in this process, near-greedy (temperature 1e-5, fixed seeds):
``--rows`` rows of different prompt lengths join a running batch ``--stagger`` steps apart, each
also decoded alone on a fresh engine and by ChatTTS's own ``Chat._infer_code`` on the same model
(bench/lib/reference.py): rows whose tokens are equal, whose hidden states are bit-identical, the
smallest frame cosine. Exit 1 unless every row's tokens are equal everywhere and alone vs batched
is bit-identical. (A committed report's ``step_cost`` was measured by the ``step`` study.)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from .lib.harness import command_line, git_revision, logger, now
from .lib.procs import REPO_ROOT
from .lib.report import Col, Doc, Figure, Kind, Panel, bars

_log = logger("fidelity")
GREEDY = 1e-5
TEXTS = (
    "你好。",
    "hello world, this is a test of batching.",
    "今天天气很好，我们出去走走吧，顺便买点东西回来。",
    "一二三四五六七八九十，百千万亿，数字读出来。",
    "The quick brown fox jumps over the lazy dog near the river bank today.",
    "短句。",
    "Batching changes the speed of a step, never its speech.",
    "长长的句子，短短的句子，都在同一个批次里解码。",
)
# precision -> (model.quantize, model.dtype): int8 and float32 on CPU; bfloat16 / float16 where the
# device is a GPU (python -m bench gpu runs them there).
PRECISIONS = {
    "int8": ("int8", "float32"),
    "float32": ("none", "float32"),
    "bfloat16": ("none", "bfloat16"),
    "float16": ("none", "float16"),
}


# ---------------------------------------------------------------------------------- measuring


def _cosine_min(a: Any, b: Any) -> float:
    import torch

    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return float("nan")
    return float(torch.nn.functional.cosine_similarity(a[:n].float(), b[:n].float(), dim=-1).min())


def measure(
    weights: str, precision: str, rows: int, tokens: int, stagger: int, chattts: bool, device: str = "cpu"
) -> list[dict]:
    """The table's rows for one model: alone vs batched, and ChatTTS against both."""
    import torch

    from serve_app.engine.acoustic import AcousticConfig, AcousticEngine, SegmentRequest
    from serve_app.engine.config import ModelConfig, WeightsConfig
    from serve_app.engine.voices import OPENAI_VOICES, speaker_from_seed
    from serve_app.engine.weights.loading import load_model

    from .lib.reference import TokenLog, chattts_tokens

    torch.set_grad_enabled(False)
    quantize, dtype = PRECISIONS[precision]
    model = load_model(
        ModelConfig(weights=WeightsConfig(source=weights), device=device, dtype=dtype, quantize=quantize)
    )
    voices = list(OPENAI_VOICES.values())
    reqs = [
        SegmentRequest(
            text=TEXTS[i % len(TEXTS)],
            spk_emb=speaker_from_seed(model.chat.speaker, voices[i % len(voices)]),
            seed=1000 + i,
            temperature=GREEDY,
            max_new_tokens=tokens + 7 * i,
            min_new_tokens=tokens + 7 * i,
            target_tokens=tokens + 7 * i,
        )
        for i in range(rows)
    ]

    def engine() -> tuple[Any, Any]:
        eng = AcousticEngine(model, AcousticConfig(max_rows=max(16, rows), listener_margin_s=None))
        return eng, TokenLog(eng)

    def drained(stream: Any) -> Any:
        chunks = list(stream)
        return torch.cat([c.hidden for c in chunks])

    alone = []
    for r in reqs:
        eng, log = engine()
        stream = eng.submit(r)
        eng.run_until_idle()
        alone.append((log.tokens(stream), drained(stream)))
    eng, log = engine()
    streams = []
    for r in reqs:
        streams.append(eng.submit(r))
        for _ in range(stagger):
            eng.step()
    eng.run_until_idle()
    batched = [(log.tokens(s), drained(s)) for s in streams]
    _log(f"{weights} {precision} on {device}: {rows} rows, up to {eng.stats.max_rows} at once")

    def row(path: str, pairs: list[tuple[tuple, tuple]]) -> dict:
        return {
            "size": weights,
            "precision": precision,
            "device": device,
            "path": path,
            "rows": len(pairs),
            "tokens_equal": sum(bool(torch.equal(a[0], b[0])) for a, b in pairs),
            "bit_identical": sum(bool(torch.equal(a[1], b[1])) for a, b in pairs),
            "min_cosine": min(_cosine_min(a[1], b[1]) for a, b in pairs),
        }

    out = [row("alone vs batched", list(zip(alone, batched)))]
    if chattts:
        ref = [chattts_tokens(model.chat, r) for r in reqs]
        out.append(row("ChatTTS vs alone", list(zip(ref, alone))))
        out.append(row("ChatTTS vs batched", list(zip(ref, batched))))
    for r in out:
        _log(
            f"  {r['path']}: tokens equal {r['tokens_equal']}/{r['rows']}, bit-identical {r['bit_identical']}, "
            f"min cosine {r['min_cosine']:.6f}"
        )
    return out


# ---------------------------------------------------------------------------------- report


COLUMNS = [
    Col("size", "size"),
    Col("device", "device"),
    Col("precision", "precision"),
    Col("path", "path"),
    Col("rows", "rows", right=True),
    Col("tokens equal", "tokens_equal", right=True),
    Col("bit-identical", "bit_identical", right=True),
    Col("min frame cosine", "min_cosine", nd=6, right=True),
]
COST_COLUMNS = [
    Col("variant", "variant"),
    Col("batch", "batch", right=True),
    Col("before ms", "before_ms", right=True),
    Col("after ms", "after_ms", right=True),
    Col("cost", lambda x: f"{100 * x['cost']:+.1f} %", right=True),
]


def to_doc(r: dict) -> Doc:
    doc = Doc(f"Batch invariance ({r['revision']}, {r['started']})", r["command"], end="")
    doc.add(
        f"Near-greedy (temperature {GREEDY}), {r['rows']} rows joining a running batch {r['stagger']} steps apart, "
        f"{r['tokens']}+ tokens each. Target: every row's tokens equal alone and batched, and equal to ChatTTS's "
        "own decode; alone vs batched bit-identical.",
    )
    doc.table(COLUMNS, r["results"]).add("")
    cost = r.get("step_cost")
    if cost:
        head = (
            f"## Step cost against {cost['against']} (full size, ms per decode step, median of "
            f"{cost['pairs']} alternating pairs)"
        )
        doc.table(COST_COLUMNS, cost["rows"], before=(head, "")).add("")
    return doc


def to_figure(r: dict) -> Figure:
    res = r["results"]
    labels = [f"{x['size']}\n{x['precision']}\n{x['path']}" for x in res]
    panel = Panel("Batch invariance", ylabel="share of rows", ylim=(0, 1.05), grid=None, tick_size=6)
    panel.legend = {"fontsize": 7}
    panel.add(
        bars(labels, [x["tokens_equal"] / x["rows"] for x in res], "rows with equal tokens"),
        bars(labels, [x["bit_identical"] / x["rows"] for x in res], "bit-identical hidden states", width=0.4),
    )
    return Figure([panel], size=(max(6, 0.9 * len(res)), 3.6))


KIND = Kind("report.json", to_doc, to_figure)


# ---------------------------------------------------------------------------------- main


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", type=Path, default=None, help="report directory (default bench/results/fidelity-<time>)")
    ap.add_argument("--sizes", default="random-deep,random", help="weights sources, comma-separated")
    ap.add_argument("--precisions", default="int8,float32", help=f"comma-separated, of {', '.join(PRECISIONS)}")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (bfloat16 / float16 want cuda)")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=40, help="tokens of the first row (each next one 7 more)")
    ap.add_argument("--stagger", type=int, default=3, help="steps between two rows' arrivals")
    ap.add_argument("--no-chattts", action="store_true", help="skip the comparison with ChatTTS's own decode")


def main(a: argparse.Namespace) -> int:
    out = a.out or REPO_ROOT / "bench" / "results" / f"fidelity-{time.strftime('%Y-%m-%d-%H%M')}"
    out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {
        "started": now(),
        "revision": git_revision(),
        "command": command_line(a.argv, out),
        "rows": a.rows,
        "tokens": a.tokens,
        "stagger": a.stagger,
        "results": [],
    }
    for size in [s for s in a.sizes.split(",") if s]:
        for p in [p for p in a.precisions.split(",") if p]:
            report["results"] += measure(size, p, a.rows, a.tokens, a.stagger, not a.no_chattts, a.device)
    report["passed"] = all(x["tokens_equal"] == x["rows"] for x in report["results"]) and all(
        x["bit_identical"] == x["rows"] for x in report["results"] if x["path"] == "alone vs batched"
    )
    KIND.write(report, out)
    print(KIND.markdown(report))
    return 0 if report["passed"] else 1
