"""One row of the running batch: a text segment's decode state between steps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from ..config import AcousticConfig
from ..pacing import TOKEN_SECONDS
from ..types import SegmentRequest
from .streams import HiddenChunk, RowStream


@dataclass
class Row:
    req: SegmentRequest
    stream: RowStream
    prompt_len: int = 0
    n_generated: int = 0  # tokens sampled so far (incl. the one waiting to be fed)
    pending: list = field(default_factory=list)  # hidden states not yet sent
    chunks_sent: int = 0
    tokens_sent: int = 0
    finish_reason: Optional[str] = None  # "stop" | "length" | "cancelled" | "error"
    after: Optional[RowStream] = None  # admitted only once this stream has started
    parked_at: Optional[float] = None  # when the deadline rule last set it aside (decode/deadline.py)

    @property
    def budget(self) -> int:
        return self.prompt_len + self.req.max_new_tokens

    def chunk_size(self, cfg: AcousticConfig) -> int:
        if self.chunks_sent == 0:
            return self.req.first_chunk_tokens or cfg.first_chunk_tokens
        return self.req.chunk_tokens or cfg.chunk_tokens

    def accept(self, stop: bool, hidden: torch.Tensor) -> None:
        """Record a sampled token (its codes and history live in the batch's ``SamplingState``):
        ``stop`` when any codebook said end-of-speech, ``hidden`` the state that produced it.

        ChatTTS keeps the hidden state that produced token i as frame i, and drops the one that
        produced end-of-speech."""
        self.n_generated += 1
        if stop:
            self.finish_reason = "stop"
            return
        self.pending.append(hidden)
        if self.n_generated >= self.req.max_new_tokens:
            self.finish_reason = "length"

    def chunk_ready(self, cfg: AcousticConfig, now: float = 0.0, step_s: Optional[float] = None) -> bool:
        """Send the pending tokens now? When a full chunk is pending and the row goes on (a
        finishing row sends its final chunk), or earlier when a listener would otherwise run dry.

        The listener (``cfg.listener_margin_s``): started playing when the first chunk left, has
        heard ``tokens_sent - listener_lag_tokens`` tokens' worth since. With steps of ``step_s``
        (the engine's recent pace), the full chunk is ready at ``now + (size - pending) *
        step_s``; if that is within the margin of the listener's audio running out, what is
        pending goes now (at least ``min_early_chunk_tokens``). Slower than real time, no
        schedule avoids the gap, so chunks keep their size."""
        if self.finish_reason is not None:
            return False
        pending, size = len(self.pending), self.chunk_size(cfg)
        if pending >= size:
            return True
        margin = cfg.listener_margin_s
        started = self.stream.first_chunk_at
        if margin is None or started is None or step_s is None or step_s >= TOKEN_SECONDS:
            return False
        if pending < cfg.min_early_chunk_tokens:
            return False
        runs_dry_at = started + max(0, self.tokens_sent - cfg.listener_lag_tokens) * TOKEN_SECONDS
        return now + (size - pending) * step_s + margin > runs_dry_at

    def take_chunk(self, final: bool, hidden_size: int) -> Optional[HiddenChunk]:
        """The pending hidden states as the next chunk (None: nothing to send)."""
        if not self.pending and not final:
            return None
        hidden = torch.stack(self.pending) if self.pending else torch.zeros(0, hidden_size)
        chunk = HiddenChunk(
            hidden=hidden,
            index=self.chunks_sent,
            start_token=self.tokens_sent,
            final=final,
            finish_reason=self.finish_reason if final else None,
        )
        self.tokens_sent += len(self.pending)
        self.pending = []
        self.chunks_sent += 1
        return chunk
