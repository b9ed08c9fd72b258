"""``args.ingress``: what the Ingress bounds and switches (bodies, sockets, deadlines, degradation)."""

from __future__ import annotations

from typing import Optional

from pydantic import Field

from ..engine.config import DEFAULT_MAX_INPUT_CHARS
from ..engine.strict import StrictModel
from .front import SecurityConfig
from .units import KiB


class WebSocketConfig(StrictModel):
    """What a WebSocket session may cost while it waits or talks (``args.ingress.websocket``)."""

    first_message_s: float = Field(
        default=5.0, gt=0, description="The session.start message must arrive this soon after the handshake."
    )
    max_unstarted_per_client: int = Field(
        default=4,
        ge=1,
        description="Sockets of one client (key id from the handshake, else "
        "address) not yet started, per Ingress replica; more are refused at the handshake.",
    )
    idle_s: float = Field(
        default=60.0, gt=0, description="A session with nothing to speak and no message for this long is closed."
    )
    max_pending_cuts: int = Field(
        default=4,
        ge=1,
        description="Text cuts of one session being planned at once; a flush past it waits "
        "(text.flush floods cost one TextNormalizer call per cut, not per message).",
    )


class IngressConfig(StrictModel):
    """``args.ingress``; every field also changes live through the Ingress's ``user_config``."""

    max_input_chars: int = Field(default=DEFAULT_MAX_INPUT_CHARS, ge=1)
    max_body_bytes: int = Field(default=64 * KiB, ge=1024)
    body_timeout_s: float = Field(
        default=30.0, gt=0, description="A request body (any route) must arrive within this (408)."
    )
    websocket: WebSocketConfig = WebSocketConfig()
    warmup: bool = True
    security: SecurityConfig = SecurityConfig()
    request_timeout_s: float = Field(
        default=300.0, gt=0, description="A request ends (504 before audio, cut after) past this."
    )
    # Degradation switches (off by default): answer 429 "busy" / skip refine_text past these
    # numbers of segment rows waiting in the acoustic queue.
    busy_queue_rows: Optional[int] = Field(default=None, ge=1)
    skip_refine_queue_rows: Optional[int] = Field(default=None, ge=0)
    log_text: bool = Field(default=False, description="Log request text (DEBUG only); off: no user text in logs.")
