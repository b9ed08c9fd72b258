"""Pydantic configuration of the engine: weights, device, decoding and vocoding knobs.

Every knob the serving layer or the CLI can set lives here, so one model validates a
deployment's args and the CLI's flags alike.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

WeightsSource = Literal["auto", "huggingface", "local", "random", "random-tiny"]
Device = Literal["auto", "cpu", "cuda", "mps"]
DType = Literal["float32", "float16", "bfloat16"]

# Environment override of the configured weights source (tests and demos switch without editing config).
WEIGHTS_ENV = "CHATTTS_WEIGHTS"
WEIGHTS_PATH_ENV = "CHATTTS_WEIGHTS_PATH"
CACHE_ENV = "CHATTTS_SERVE_CACHE"


def default_cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "chattts-serve"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WeightsConfig(_Strict):
    source: WeightsSource = "auto"
    path: Optional[str] = Field(
        default=None, description="Asset directory (ChatTTS layout) for source=local."
    )
    cache_dir: Optional[str] = Field(
        default=None, description="Where random weights are built (default ~/.cache/chattts-serve)."
    )
    seed: int = Field(default=0, description="Seed of random weights (part of the cache key).")
    hub_timeout_s: float = Field(
        default=10.0, gt=0, description="source=auto: give up on the hub after this long."
    )

    def resolved(self) -> "WeightsConfig":
        """Apply the CHATTTS_WEIGHTS / CHATTTS_WEIGHTS_PATH overrides."""
        update = {}
        env = os.environ.get(WEIGHTS_ENV)
        if env:
            update["source"] = env
        env_path = os.environ.get(WEIGHTS_PATH_ENV)
        if env_path:
            update["path"] = env_path
        if not update:
            return self
        return WeightsConfig.model_validate({**self.model_dump(), **update})

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else default_cache_dir()


class ModelConfig(_Strict):
    weights: WeightsConfig = WeightsConfig()
    device: Device = "auto"
    dtype: DType = Field(
        default="float32",
        description="GPT dtype; float16/bfloat16 only make sense on a GPU.",
    )
    torch_threads: Optional[int] = Field(
        default=None, ge=1, description="torch.set_num_threads for this process (None: torch default)."
    )
    cpu_dual_layout: bool = Field(
        default=True,
        description="On CPU in float32, keep a transposed copy of each GPT linear weight for steps "
        "of 4+ rows (engine/linear.py: ~20% faster batch-8 steps, one more copy of those weights).",
    )


class AcousticConfig(_Strict):
    """Decode-loop knobs (DESIGN.md section 7)."""

    max_rows: int = Field(default=16, ge=1, description="Rows decoded together at most.")
    token_budget: int = Field(
        default=16384,
        ge=64,
        description="Sum over running rows of prompt + max new tokens (bounds KV memory).",
    )
    first_chunk_tokens: int = Field(
        default=12, ge=1, description="Tokens in a row's first chunk (first audio sooner)."
    )
    chunk_tokens: int = Field(default=24, ge=1, description="Tokens per chunk after the first.")
    continuous: bool = Field(
        default=True,
        description="Admit new rows between steps (iteration-level batching); "
        "False runs each batch to its end (window batching, for comparison).",
    )
    max_queued_rows: int = Field(default=256, ge=1, description="Rows waiting for a slot at most.")
    repetition_penalty: float = Field(default=1.05, gt=0)


class VocoderConfig(_Strict):
    """Sliding-window decode (DESIGN.md section 6)."""

    left_context_tokens: int = Field(default=16, ge=0)
    # >= 1: the centred ISTFT of a window lacks the last half token (256 samples) of its end.
    hold_back_tokens: int = Field(default=4, ge=1)
    min_window_tokens: int = Field(
        default=8, ge=1, description="Decode once at least this many new tokens are ready."
    )


class SegmentLimits(_Strict):
    """How long a segment's generation may run."""

    max_chars: int = Field(default=120, ge=8, description="Segment length cut by the splitter.")
    max_seconds: Optional[float] = Field(
        default=None,
        gt=0,
        description="Expected speech per segment at most (None: characters only). Shorter segments "
        "are more rows decoded in parallel: lower latency for long inputs, bigger batches.",
    )
    tokens_per_second: float = Field(default=46.875, gt=0, description="24000 / 512.")
    cap_factor: float = Field(
        default=3.0, gt=1, description="max_new_token = cap_factor * expected + cap_slack."
    )
    cap_slack: int = Field(default=64, ge=0)
    max_new_token: int = Field(default=2048, ge=16, description="Hard ceiling for any segment.")

    @model_validator(mode="after")
    def _check(self) -> "SegmentLimits":
        if self.cap_slack > self.max_new_token:
            raise ValueError("cap_slack must not exceed max_new_token")
        return self


class EngineConfig(_Strict):
    model: ModelConfig = ModelConfig()
    acoustic: AcousticConfig = AcousticConfig()
    vocoder: VocoderConfig = VocoderConfig()
    segments: SegmentLimits = SegmentLimits()
