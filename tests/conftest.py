"""Shared pytest fixtures.

Sections: engine fixtures (ChatTTS with ``random-tiny`` weights, no Ray) below; Ray Serve fixtures
go in their own section after them.
"""

from __future__ import annotations

import pytest

# =============================================================================================
# Engine fixtures: one random-tiny build and one loaded model per session, through the real
# loading path (serve_app.engine.weights.load_model), no mocks.
# =============================================================================================


@pytest.fixture(scope="session", autouse=True)
def chattts_cache_dir(tmp_path_factory: pytest.TempPathFactory):
    """CHATTTS_SERVE_CACHE points at one temporary directory for the whole session, so every test
    and every subprocess (CLI, Serve replicas) shares one random-weights build. Weights overrides
    from the caller's shell are removed so they cannot change what the tests load."""
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

    One torch thread: the tiny model gains nothing from two on this 2-core box, and two threads
    collapse (~20x slower) as soon as another process competes for the cores."""
    from serve_app.engine.config import ModelConfig
    from serve_app.engine.weights import load_model

    return load_model(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1))


@pytest.fixture(scope="session")
def tiny_planner(tiny_model):
    """Text -> segment requests against the tiny model's speaker statistics (warmed up)."""
    from serve_app.engine.pipeline import Planner

    planner = Planner(tiny_model.chat.speaker)
    planner.warmup()
    return planner


# Ray Serve fixtures (one Ray, one Serve, one chattts app per session) for the end-to-end tests.
from serve_fixtures import *  # noqa: E402,F401,F403
