"""The engine without Ray: one random-tiny model for the session (fixtures, a pytest plugin that
tests/conftest.py registers), segment requests random weights decode for an exact length, the
audio length a plan gives, draining a row's stream, the streamed-vs-one-shot vocoder comparison.

Random weights never emit end-of-speech, so a segment decodes exactly its target tokens, and
``n`` tokens decode (one shot) to ``512 * n - 256`` samples: durations are checked to the sample.
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest
import torch

from bench.lib.reference import TokenLog, chattts_tokens  # noqa: F401  (re-exported for the tests)
from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import AcousticConfig, VocoderConfig
from serve_app.engine.decode.streams import HiddenChunk, RowStream
from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.types import SegmentRequest, SynthesisOptions
from serve_app.engine.vocoder import VocoderEngine
from support.audio import snr_db

HIDDEN = 768
# Near-greedy sampling: ChatTTS's top-k keeps at least 3 candidates, so ``top_k=1`` would not be greedy.
GREEDY = 1e-5
TEXT = "你好，欢迎使用语音合成服务。"


# =============================================================================================
# Fixtures: one random-tiny build and one loaded model per session, through the real loading
# path (serve_app.engine.weights.loading.load_model), no mocks.
# =============================================================================================


@pytest.fixture(scope="session", autouse=True)
def chattts_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """CHATTTS_SERVE_CACHE points at one temporary directory for the whole session, so every test
    and every subprocess (CLI, Serve replicas, cluster nodes) shares one random-weights build.
    Weights overrides from the caller's shell are removed so they cannot change what the tests load."""
    from serve_app.engine.config import CACHE_ENV, WEIGHTS_ENV, WEIGHTS_PATH_ENV

    path = tmp_path_factory.mktemp("chattts-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(CACHE_ENV, str(path))
    mp.delenv(WEIGHTS_ENV, raising=False)
    mp.delenv(WEIGHTS_PATH_ENV, raising=False)
    yield path
    mp.undo()


@pytest.fixture(scope="session")
def tiny_weights_config(chattts_cache_dir):
    from serve_app.engine.config import WeightsConfig

    return WeightsConfig(source="random-tiny", cache_dir=str(chattts_cache_dir))


@pytest.fixture(scope="session")
def tiny_model(tiny_weights_config):
    """ChatTTS ``Chat`` with random-tiny weights (built on first use), loaded once per session.

    One torch thread: the tiny model gains nothing from two, and two threads wait on each other at
    every op as soon as another process competes for the cores (bench/README.md, "Measurements
    behind code choices"). Float32 GPT layers: the engine tests check the decode loop on the
    transformers modules as loaded (and time chunk schedules against its pace); int8, the CPU
    default, has its own tests (test_quant.py) and is what the Serve tests run."""
    from serve_app.engine.config import ModelConfig
    from serve_app.engine.weights.loading import load_model

    return load_model(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1, quantize="none"))


@pytest.fixture(scope="session")
def tiny_planner(tiny_model):
    """Text -> segment requests (warmed up); the engine samples the voice's speaker."""
    from serve_app.engine.planner import Planner

    planner = Planner()
    planner.warmup()
    return planner


@pytest.fixture
def make_engine(tiny_model):
    """Factory of engines on the session model; stops their threads at teardown."""
    engines: list[AcousticEngine] = []

    def make(clock=None, **cfg) -> AcousticEngine:
        """An engine with these decode settings (fixed chunk sizes unless given), on ``clock`` if
        given (the time its scheduler and playback clocks read: tests advance it by hand)."""
        engine = AcousticEngine(tiny_model, fixed_chunks(**cfg), **({"clock": clock} if clock else {}))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


@pytest.fixture(scope="session")
def spk(tiny_model) -> str:
    """The default voice's speaker string (``alloy``), as the Acoustic stage samples it."""
    from serve_app.engine.voices import OPENAI_VOICES, speaker_from_seed

    return speaker_from_seed(tiny_model.chat.speaker, OPENAI_VOICES["alloy"])


# =============================================================================================
# Helpers
# =============================================================================================


def fixed_chunks(**cfg) -> AcousticConfig:
    """Decode-loop settings with fixed chunk sizes (no early chunk for a listener): the chunk
    schedule these tests check is then the same on every run, whatever the machine's pace."""
    return AcousticConfig(**{"listener_margin_s": None, **cfg})


def seg(spk: str | None, n: int, seed: int = 1, text: str = TEXT, **kw) -> SegmentRequest:
    """A segment that random weights decode for exactly n tokens."""
    kw.setdefault("max_new_tokens", n)
    return SegmentRequest(text=text, spk_emb=spk, seed=seed, target_tokens=n, **kw)


def expected_samples(plan) -> int:
    """Samples of a whole answer for ``plan`` (random weights): each segment decodes its target
    tokens (capped at its maximum), ``512 * T - 256`` samples each (the centred ISTFT lacks half
    a token at the end)."""
    return sum(
        min(r.target_tokens, r.max_new_tokens) * SAMPLES_PER_TOKEN - SAMPLES_PER_TOKEN // 2 for r in plan.segments
    )


def drain(stream: RowStream) -> tuple[list[HiddenChunk], torch.Tensor]:
    chunks = list(stream)
    hidden = torch.cat([c.hidden for c in chunks]) if chunks else torch.zeros(0, HIDDEN)
    return chunks, hidden


def decode_alone(engine: AcousticEngine, req: SegmentRequest) -> torch.Tensor:
    stream = engine.submit(req)
    engine.run_until_idle()
    return drain(stream)[1]


def stream_decode(vocoder: VocoderEngine, chunks: list[HiddenChunk], cfg: VocoderConfig | None = None) -> np.ndarray:
    vs = vocoder.stream(cfg)
    parts = [vs.push(c.hidden) for c in chunks]
    parts.append(vs.finish())
    return np.concatenate(parts)


def streamed_vs_one_shot(vocoder: VocoderEngine, chunks: list[HiddenChunk]) -> dict:
    """Sliding-window decode of a row's chunks against one decode of all its hidden states: SNR
    over the whole utterance and the worst absolute error within half a token of a chunk edge."""
    ref = vocoder.decode(torch.cat([c.hidden for c in chunks]))
    y = stream_decode(vocoder, chunks)
    assert len(y) == len(ref)
    edges = np.cumsum([c.hidden.shape[0] for c in chunks])[:-1] * SAMPLES_PER_TOKEN
    half = SAMPLES_PER_TOKEN // 2
    worst_edge = max(
        (float(np.abs(ref[e - half : e + half] - y[e - half : e + half]).max()) for e in edges), default=0.0
    )
    return {"snr_db": snr_db(ref, y), "worst_edge": worst_edge, "peak": float(np.abs(ref).max()), "samples": len(ref)}


async def synthesize(
    pipeline: Any, text: str, response_format: str = "wav", options: SynthesisOptions = SynthesisOptions()
) -> bytes:
    """A whole file of ``text`` through a pipeline (``plan`` then ``speak``), as a test wants it."""
    plan = await pipeline.plan(text, options)
    return (await pipeline.speak(plan, response_format))[0]


def synthesize_sync(
    pipeline: Any, text: str, response_format: str = "wav", options: SynthesisOptions = SynthesisOptions()
) -> bytes:
    """``synthesize`` from a test with no running event loop (its own loop, for the call)."""
    return asyncio.run(synthesize(pipeline, text, response_format, options))
