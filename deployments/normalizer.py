"""TextNormalizer stage (CPU): normalise, split into segments, resolve the voice."""

from __future__ import annotations

import logging
import time

from ray import serve

from serve_app import metrics
from serve_app.engine.config import SegmentLimits
from serve_app.engine.pipeline import EmptyInputError, Plan, Planner, SynthesisOptions
from serve_app.engine.voices import VoiceError
from serve_app.protocol import APIError, SpeechRequest

log = logging.getLogger("ray.serve")


def chattts_speaker():
    """ChatTTS's speaker statistics: all the planner needs (no model weights)."""
    from ChatTTS.config import Config
    from ChatTTS.model import Speaker

    cfg = Config()
    return Speaker(cfg.gpt.hidden_size, cfg.spk_stat)


def options_from(req: SpeechRequest) -> SynthesisOptions:
    return SynthesisOptions(
        voice=req.voice,
        seed=req.seed,
        speed=req.speed,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        prompt=req.prompt,
        normalize=req.normalize,
        lang=req.lang,
        priority=req.priority,
    )


# Normalising is ~1 ms of CPU per request: one replica keeps up with many; scale out only when
# requests really queue (target 8 ongoing) so it never steals cores from the model stages.
@serve.deployment(
    ray_actor_options={"num_cpus": 0.1},
    max_ongoing_requests=64,
    autoscaling_config={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8},
)
class TextNormalizer:
    def __init__(self, limits: dict | None = None):
        t0 = time.perf_counter()
        self.planner = Planner(chattts_speaker(), SegmentLimits.model_validate(limits or {}))
        self.planner.warmup()  # numba JIT of ChatTTS's normaliser: seconds, so not on a request
        log.info("TextNormalizer ready in %.1fs", time.perf_counter() - t0)

    def plan(self, request: SpeechRequest) -> Plan:
        t0 = time.perf_counter()
        try:
            plan = self.planner.plan(request.input, options_from(request))
            metrics.observe("tts_stage_seconds", time.perf_counter() - t0, stage="normalise")
            return plan
        except VoiceError as exc:
            raise APIError(404 if "unknown voice" in str(exc) else 400, str(exc), param="voice", code="voice_not_found") from None
        except EmptyInputError as exc:
            raise APIError(400, str(exc), param="input", code="empty_input") from None

    def replan(self, request: SpeechRequest, texts: list[str]) -> Plan:
        """Segments from refined texts (refine_text); the texts are ChatTTS's own output."""
        try:
            return self.planner.plan_texts(texts, options_from(request))
        except EmptyInputError as exc:
            raise APIError(400, str(exc), param="input", code="empty_input") from None

    def check_health(self) -> None:
        pass
