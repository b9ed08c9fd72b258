"""TextNormalizer stage (CPU, no torch): normalise, split into segments, resolve the voice.

Its errors (unknown voice, nothing to speak) are the engine's typed errors; the Ingress maps
them to HTTP statuses (``serve_app.errors.to_api_error``).
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from ray import serve

from deployments.backends import install
from serve_app import metrics
from serve_app.engine.config import SegmentConfig
from serve_app.engine.planner import Planner
from serve_app.engine.types import Plan, ScriptPart, SynthesisOptions, Voice

log = logging.getLogger("ray.serve")


# Replicas, resources and autoscaling come from the config file (config/serve.yaml).
@serve.deployment
class TextNormalizer:
    def __init__(self, limits: dict | None = None):
        install()  # this process records metrics and reaches boards through Ray (backends.py: why here)
        t0 = time.perf_counter()
        self.planner = Planner(SegmentConfig.model_validate(limits or {}))
        self.planner.warmup()  # first use of every rule table, before the first request
        log.info("TextNormalizer ready in %.1fs", time.perf_counter() - t0)

    def plan(self, text: str, options: SynthesisOptions, voice: Optional[Voice] = None, client: str = "") -> Plan:
        """``voice``: resolved by the Ingress (custom voices live in its store); else from ``options``.
        ``client``: who asked (the caller's key id, or ``ip:<addr>``); the Acoustic stage shares its
        queue and slots between clients. A plan past ``segments.max_segments`` or
        ``max_request_seconds`` raises ``RequestTooLarge``."""
        t0 = time.perf_counter()
        plan = self.planner.plan(text, options, voice, client=client)
        took = time.perf_counter() - t0
        metrics.observe("tts_stage_seconds", took, stage="normalise")
        plan.planned_ms = round(took * 1000.0, 2)
        return plan

    def replan(
        self, texts: list[str], options: SynthesisOptions, voice: Optional[Voice] = None, client: str = ""
    ) -> Plan:
        """Segments from refined texts (refine_text); the texts are ChatTTS's own output."""
        return self.planner.plan_texts(texts, options, voice, client=client)

    def plan_script(self, parts: list[ScriptPart], options: SynthesisOptions, client: str = "") -> Plan:
        """A script of several parts (SSML pieces, dialogue turns: their voices already resolved)."""
        t0 = time.perf_counter()
        plan = self.planner.plan_script(parts, options, client=client)
        took = time.perf_counter() - t0
        metrics.observe("tts_stage_seconds", took, stage="normalise")
        plan.planned_ms = round(took * 1000.0, 2)
        return plan
