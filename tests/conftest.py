"""Shared pytest fixtures.

Engine fixtures (ChatTTS with ``random-tiny`` weights, no Ray) are here; the Ray Serve fixtures
(one Ray, one Serve, one chattts app per session) are the ``serve_fixtures`` plugin.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["serve_fixtures"]

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

    One torch thread: the tiny model gains nothing from two, and two threads wait on each other at
    every op as soon as another process competes for the cores (bench/README.md, "Measurements
    behind code choices")."""
    from serve_app.engine.config import ModelConfig
    from serve_app.engine.weights import load_model

    return load_model(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1))


@pytest.fixture(scope="session")
def tiny_planner(tiny_model):
    """Text -> segment requests (warmed up); the engine samples the voice's speaker."""
    from serve_app.engine.planner import Planner

    planner = Planner()
    planner.warmup()
    return planner
