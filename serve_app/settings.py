"""The Ingress stage's settings (``args.ingress`` in the config; live via its ``user_config``).

Light on purpose: ``AppArgs`` validates it when the app is built, so a typo in the config file is
refused at ``serve run``, not inside a replica.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field

from .http.security import SecuritySettings

DEFAULT_MAX_INPUT_CHARS = 4096


class IngressSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_input_chars: int = Field(default=DEFAULT_MAX_INPUT_CHARS, ge=1)
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    warmup: bool = True
    security: SecuritySettings = SecuritySettings()
    request_timeout_s: float = Field(default=300.0, gt=0, description="A request ends (504 before audio, cut after) past this.")
    # Degradation switches (off by default): answer 429 "busy" / skip refine_text past these
    # numbers of segment rows waiting in the acoustic queue.
    busy_queue_rows: Optional[int] = Field(default=None, ge=1)
    skip_refine_queue_rows: Optional[int] = Field(default=None, ge=0)
    log_text: bool = Field(default=False, description="Log request text (DEBUG only); off: no user text in logs.")
