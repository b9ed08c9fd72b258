"""The application builder: ``deployments.app:build_app`` is the config's ``import_path``.

``args`` (validated by ``AppConfig``) select the weights, device, dtype, limits and engine knobs;
per-deployment resources, replicas and autoscaling come from the config's ``deployments``.
"""

from __future__ import annotations

import logging
from typing import Optional

from ray.serve import Application

from serve_app.engine.config import ModelConfig, acoustic_heard_through
from serve_app.settings import AppConfig

log = logging.getLogger("ray.serve")

APP_NAME = "chattts"


def _pin_weights_source(model: ModelConfig) -> ModelConfig:
    """Resolve ``auto`` (and the CHATTTS_WEIGHTS override) once, here, so every replica loads the
    same kind of weights without each one probing the hub. Random weights are built here too
    (replicas on other nodes rebuild the identical tree from the same seed)."""
    from serve_app.engine.weights.sources import resolve_weights

    resolved = resolve_weights(model.weights)
    weights = model.weights.model_copy(update={"source": resolved.source})
    if resolved.source in ("local",):
        weights = weights.model_copy(update={"path": str(resolved.root)})
    return model.model_copy(update={"weights": weights})


def build_app(args: Optional[dict] = None) -> Application:
    from deployments.acoustic import Acoustic
    from deployments.ingress import Ingress
    from deployments.normalizer import TextNormalizer
    from deployments.vocoder import Vocoder

    a = AppConfig.model_validate(args or {})
    model = _pin_weights_source(a.model)
    vocoder_model = model.model_copy(update={"device": a.vocoder_device, "dtype": "float32"})
    acoustic = Acoustic.bind(
        model=model.model_dump(), acoustic=acoustic_heard_through(a.acoustic, a.vocoder).model_dump()
    )
    vocoder = Vocoder.bind(
        acoustic,
        model=vocoder_model.model_dump(),
        vocoder=a.vocoder.model_dump(),
        flow=a.flow.model_dump(),
        capacity_headroom=a.acoustic.capacity_headroom,
        capacity_wait_s=a.acoustic.capacity_wait_s,
    )
    normalizer = TextNormalizer.bind(limits=a.segments.model_dump())
    # The Ingress validates the whole of args once, with the weights source pinned here.
    return Ingress.bind(normalizer, vocoder, acoustic, config=a.model_copy(update={"model": model}).model_dump())
