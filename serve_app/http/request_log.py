"""One record per request (HTTP, handle or WebSocket session): the metrics at its milestones and
one JSON log line at its end. No user text unless ``ingress.log_text`` (then at DEBUG only)."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

from .. import metrics
from ..protocol import SpeechRequest

log = logging.getLogger("ray.serve")


def voice_label(voice: str) -> str:
    """A voice as logs show it: a speaker string is long (and the user's), so only its start."""
    return voice if len(voice) <= 32 else f"speaker:{voice[:8]}"


@dataclass
class RequestRecord:
    request_id: str
    voice: str
    chars: int
    format: str
    stream_format: str
    client: str  # the way in: http, handle, warmup
    caller: str = ""  # who: an API key's id or ip:<address> (what limits and fair admission count)
    text: Optional[str] = None  # only with log_text, and then at DEBUG
    cache: str = "bypass"
    status: str = "pending"
    ttfb_s: Optional[float] = None
    total_s: Optional[float] = None
    segments: int = 0
    audio_s: float = 0.0
    batch_rows: int = 0
    # A listener playing the answer at 1x from its first audio (engine/playback.py), as the Vocoder
    # inferred it: the silence heard (s), how close it came to silence (s).
    stall_s: Optional[float] = None
    min_slack_s: Optional[float] = None
    # Where the first audio's time went, hop by hop (ms; docs/architecture.md, "First audio, hop by hop"): each
    # measured inside the process it runs in, so the figures hold across nodes.
    first_audio: dict = field(default_factory=dict)
    t0: float = field(default_factory=time.perf_counter, repr=False)

    @classmethod
    def start(cls, req: SpeechRequest, request_id: str, client: str, log_text: bool = False) -> "RequestRecord":
        return cls(
            request_id,
            voice_label(req.voice),
            len(req.input),
            req.response_format,
            req.stream_format,
            client,
            text=req.input if log_text else None,
        )

    def hop(self, name: str, seconds: float) -> None:
        self.first_audio[name] = round(seconds * 1000.0, 2)

    def since_arrival(self, t_in: Optional[float]) -> None:
        """The Ingress's HTTP stack before this record (the guard middleware's ``t_in``: body read
        and parsed, the route's validation): ``ingress_http``."""
        if t_in is not None:
            self.hop("ingress_http", self.t0 - t_in)

    def since_start(self) -> float:
        return time.perf_counter() - self.t0

    def first_byte(self) -> None:
        self.ttfb_s = time.perf_counter() - self.t0
        metrics.observe("tts_ttfb_seconds", self.ttfb_s, format=self.format)

    def finish(self, status: str) -> None:
        if self.status != "pending":
            return
        self.status = status
        self.total_s = time.perf_counter() - self.t0
        metrics.inc("tts_requests_total", status=status, format=self.format)
        if status == "200":
            metrics.observe("tts_request_duration_seconds", self.total_s, format=self.format)
        if self.stall_s is not None:
            metrics.observe("tts_stream_stall_seconds", self.stall_s, door=self.client)
        if self.min_slack_s is not None:
            metrics.observe("tts_stream_slack_seconds", max(0.0, self.min_slack_s), door=self.client)
        line = {k: v for k, v in asdict(self).items() if k not in ("t0", "text")}
        log.info(json.dumps({"event": "speech", **line}, ensure_ascii=False))
        if self.text is not None:
            log.debug(
                json.dumps(
                    {"event": "speech_text", "request_id": self.request_id, "text": self.text}, ensure_ascii=False
                )
            )
