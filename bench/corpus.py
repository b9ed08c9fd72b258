"""The request texts: a fixed corpus of Chinese and English sentences of mixed lengths."""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

from serve_app.engine.text.chars import SAYABLE_CJK_RE

CORPUS_PATH = Path(__file__).with_name("corpus.txt")


@lru_cache(maxsize=None)
def load_corpus(path: Optional[str] = None) -> tuple[str, ...]:
    p = Path(path) if path else CORPUS_PATH
    lines = [ln.strip() for ln in p.read_text(encoding="utf-8").splitlines()]
    texts = tuple(ln for ln in lines if ln and not ln.startswith("#"))
    if not texts:
        raise ValueError(f"corpus {p} has no texts")
    return texts


def text_stream(seed: int = 0, texts: Optional[tuple[str, ...]] = None) -> Iterator[str]:
    """An endless, reproducible sequence: the corpus reshuffled (seeded) on every pass."""
    texts = texts or load_corpus()
    rng = random.Random(seed)
    while True:
        order = list(texts)
        rng.shuffle(order)
        yield from order


def lang_of(text: str) -> str:
    cjk = len(SAYABLE_CJK_RE.findall(text))
    return "zh" if cjk * 3 >= len(text.strip()) else ("mixed" if cjk else "en")


def plan_corpus(texts: Optional[tuple[str, ...]] = None, segments: Optional[dict] = None):
    """Plan every text with the project's own Planner (segments and target tokens).

    Returns ``[(text, [target_tokens per segment], [segment texts])]``. Needs no model
    weights and no torch.
    """
    from serve_app.engine.config import SegmentLimits
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions

    planner = Planner(SegmentLimits.model_validate(segments or {}))
    out = []
    for text in texts or load_corpus():
        plan = planner.plan(text, SynthesisOptions())
        out.append((text, [s.target_tokens for s in plan.segments], plan.texts))
    return out


def corpus_summary(planned) -> dict:
    """Tokens and audio seconds per request of the corpus (random weights: exact)."""
    per_req = [sum(toks) for _, toks, _ in planned]
    segs = [t for _, toks, _ in planned for t in toks]
    n = len(per_req)
    return {
        "requests": n,
        "segments": len(segs),
        "zh": sum(1 for t, _, _ in planned if lang_of(t) == "zh"),
        "en": sum(1 for t, _, _ in planned if lang_of(t) == "en"),
        "mixed": sum(1 for t, _, _ in planned if lang_of(t) == "mixed"),
        "mean_tokens_per_request": sum(per_req) / n,
        "mean_audio_s_per_request": sum(per_req) / n * 512 / 24000,
        "min_audio_s": min(per_req) * 512 / 24000,
        "max_audio_s": max(per_req) * 512 / 24000,
        "mean_tokens_per_segment": sum(segs) / len(segs),
    }
