"""The config's ``args`` as a whole (``AppConfig``), how a config's layers merge, and the Acoustic
stage's live ``user_config`` (``AcousticUserConfig``)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..engine.config import AcousticConfig, ModelConfig, SegmentConfig, VocoderConfig
from ..engine.strict import StrictModel
from .front import FlowConfig
from .ingress import IngressConfig
from .jobs import JobsConfig
from .stores import CacheConfig, LexiconStoreConfig, VoiceStoreConfig


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in key by key at every level (lists and values replace;
    new dicts, the inputs untouched): a config's args over the defaults, a user_config over args."""
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


# Decode-loop knobs a running engine takes from its next step; the others (CUDA graphs, and what
# the app derives from the vocoder) are read when the engine is built.
LIVE_ACOUSTIC_FIELDS = (
    "max_rows",
    "token_budget",
    "first_chunk_tokens",
    "chunk_tokens",
    "listener_margin_s",
    "continuous",
    "max_queued_rows",
    "max_queued_rows_per_client",
    "reserved_rows",
    "max_running_rows_per_client",
    "scheduling",
    "prebuffer_s",
    "park_ahead_s",
    "resume_ahead_s",
    "capacity_headroom",
    "background_rows",
    "background_wait_s",
    "capacity_wait_s",
    "refine_max_chars",
    "refine_max_texts",
    "refine_wait_s",
)


class AcousticUserConfig(BaseModel):
    """The Acoustic stage's ``user_config``: what changes without restarting its replicas.

    The ``@serve.batch`` admission window, plus any of ``LIVE_ACOUSTIC_FIELDS`` of
    ``AcousticConfig`` (validated with its ranges when applied: ``engine_config``)."""

    model_config = ConfigDict(extra="allow")

    max_batch_size: int = Field(default=8, ge=1, le=64, description="Requests submitted together at most.")
    # Rows join the running batch at the next step anyway (continuous batching): the window only
    # groups prefills, and every request's first audio waits for it.
    batch_wait_timeout_s: float = Field(default=0.01, ge=0.0, le=2.0)
    # A request that finds the engine idle (no row running or waiting, none in the window) is
    # submitted at once: no other request's prefill to group it with, and its first audio does
    # not wait the window (deployments/acoustic.py).
    admit_idle_at_once: bool = True

    @model_validator(mode="after")
    def _only_live_fields(self) -> "AcousticUserConfig":
        unknown = sorted(set(self.model_extra or {}) - set(LIVE_ACOUSTIC_FIELDS))
        if unknown:
            raise ValueError(
                f"not a live Acoustic setting: {', '.join(unknown)} (live: max_batch_size, "
                f"batch_wait_timeout_s, admit_idle_at_once, {', '.join(LIVE_ACOUSTIC_FIELDS)})"
            )
        return self

    def engine_changes(self) -> dict[str, Any]:
        """The engine fields this user_config names, as given (null included: it switches a knob
        such as listener_margin_s or max_running_rows_per_client off)."""
        return dict(self.model_extra or {})

    def engine_config(self, current: AcousticConfig) -> AcousticConfig:
        """``current`` with this config's engine fields, validated as ``AcousticConfig``."""
        return AcousticConfig.model_validate({**current.model_dump(), **self.engine_changes()})


class AppConfig(StrictModel):
    """The config's ``args``: the engine's knobs and the serving layer's settings."""

    model: ModelConfig = ModelConfig()
    acoustic: AcousticConfig = AcousticConfig()
    vocoder: VocoderConfig = VocoderConfig()
    segments: SegmentConfig = SegmentConfig()
    ingress: IngressConfig = IngressConfig()
    cache: CacheConfig = CacheConfig()
    voices: VoiceStoreConfig = VoiceStoreConfig()
    lexicons: LexiconStoreConfig = LexiconStoreConfig()
    flow: FlowConfig = FlowConfig()
    jobs: JobsConfig = JobsConfig()
    # Vocoder replicas never need the GPU or its dtype: CPU float32.
    vocoder_device: str = "cpu"
