"""Helpers shared by the engine tests (test_engine.py, test_gpu.py): segment requests that random
weights decode for an exact length, draining a row's stream, and the streamed-vs-one-shot vocoder
comparison."""

from __future__ import annotations

import numpy as np
import torch

from serve_app.engine.acoustic import AcousticEngine, HiddenChunk, RowStream, SegmentRequest
from serve_app.engine.config import AcousticConfig, VocoderConfig
from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.vocoder import Vocoder

SR = 24000
HIDDEN = 768


def fixed_chunks(**cfg) -> AcousticConfig:
    """Decode-loop settings with fixed chunk sizes (no early chunk for a listener): the chunk
    schedule these tests check is then the same on every run, whatever the machine's pace."""
    return AcousticConfig(**{"listener_margin_s": None, **cfg})


def seg(spk: str | None, n: int, seed: int = 1, text: str = "你好，欢迎使用语音合成服务。", **kw) -> SegmentRequest:
    """A segment that random weights decode for exactly n tokens."""
    kw.setdefault("max_new_tokens", n)
    return SegmentRequest(text=text, spk_emb=spk, seed=seed, target_tokens=n, **kw)


def drain(stream: RowStream) -> tuple[list[HiddenChunk], torch.Tensor]:
    chunks = list(stream)
    hidden = torch.cat([c.hidden for c in chunks]) if chunks else torch.zeros(0, HIDDEN)
    return chunks, hidden


def decode_alone(engine: AcousticEngine, req: SegmentRequest) -> torch.Tensor:
    stream = engine.submit(req)
    engine.run_until_idle()
    return drain(stream)[1]


def snr_db(ref: np.ndarray, y: np.ndarray) -> float:
    err = np.sum((ref.astype(np.float64) - y) ** 2)
    return float(10 * np.log10(np.sum(ref.astype(np.float64) ** 2) / max(err, 1e-30)))


def stream_decode(vocoder: Vocoder, chunks: list[HiddenChunk], cfg: VocoderConfig | None = None) -> np.ndarray:
    vs = vocoder.stream(cfg)
    parts = [vs.push(c.hidden) for c in chunks]
    parts.append(vs.finish())
    return np.concatenate(parts)


def streamed_vs_one_shot(vocoder: Vocoder, chunks: list[HiddenChunk]) -> dict:
    """Sliding-window decode of a row's chunks against one decode of all its hidden states: SNR
    over the whole utterance and the worst absolute error within half a token of a chunk edge."""
    ref = vocoder.decode(torch.cat([c.hidden for c in chunks]))
    y = stream_decode(vocoder, chunks)
    assert len(y) == len(ref)
    edges = np.cumsum([c.hidden.shape[0] for c in chunks])[:-1] * SAMPLES_PER_TOKEN
    half = SAMPLES_PER_TOKEN // 2
    worst_edge = max((float(np.abs(ref[e - half : e + half] - y[e - half : e + half]).max()) for e in edges), default=0.0)
    return {"snr_db": snr_db(ref, y), "worst_edge": worst_edge, "peak": float(np.abs(ref).max()), "samples": len(ref)}
