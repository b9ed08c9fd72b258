"""The request texts (bench/corpus.txt: Chinese and English of mixed lengths; one-segment texts) and
the audio they must produce: with random weights a segment decodes exactly its planned tokens, and
``n`` tokens are ``512 * n - 256`` samples at 24 kHz (docs/architecture.md)."""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional

from serve_app.engine.audio import SAMPLE_RATE
from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.text.chars import SAYABLE_CJK_RE

CORPUS_PATH = Path(__file__).resolve().parents[1] / "corpus.txt"

BYTES_PER_AUDIO_SECOND = 2 * SAMPLE_RATE  # 16-bit mono

# One segment each (under segments.max_seconds), so a stream is one engine row.
ONE_ROW_TEXTS = (
    "今天天气很好，我们一起去公园散步吧。",
    "请在下一个路口向左转，然后直走两百米。",
    "会议改到明天下午三点，请大家准时参加。",
    "这本书讲的是一个小镇上发生的故事。",
    "The quick brown fox jumps over the lazy dog.",
    "Please remember to bring your umbrella today.",
)


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
    from serve_app.engine.config import SegmentConfig
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions

    planner = Planner(SegmentConfig.model_validate(segments or {}))
    out = []
    for text in texts or load_corpus():
        plan = planner.plan(text, SynthesisOptions())
        out.append((text, [s.target_tokens for s in plan.segments], plan.texts))
    return out


def planned_samples(tokens: list[int]) -> int:
    """Samples of audio a request of segments of ``tokens`` tokens each decodes to."""
    return sum(SAMPLES_PER_TOKEN * t - SAMPLES_PER_TOKEN // 2 for t in tokens)


def expected_audio_s(planned) -> dict[str, float]:
    """Text -> seconds of audio, for ``plan_corpus`` output."""
    return {text: planned_samples(toks) / SAMPLE_RATE for text, toks, _ in planned}


def expected_pcm_bytes(texts: tuple[str, ...], segments: Optional[dict] = None) -> dict[str, int]:
    """Text -> bytes of s16le audio it must produce (random weights)."""
    return {text: 2 * planned_samples(tokens) for text, tokens, _ in plan_corpus(texts, segments)}


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
        "mean_audio_s_per_request": sum(per_req) / n * SAMPLES_PER_TOKEN / SAMPLE_RATE,
        "min_audio_s": min(per_req) * SAMPLES_PER_TOKEN / SAMPLE_RATE,
        "max_audio_s": max(per_req) * SAMPLES_PER_TOKEN / SAMPLE_RATE,
        "mean_tokens_per_segment": sum(segs) / len(segs),
    }
