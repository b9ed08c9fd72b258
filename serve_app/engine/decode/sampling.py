"""Per-row sampling of the next token from the GPT's hidden states.

ChatTTS's own pieces: the code heads (``Embed.head_code``) and ``gen_logits`` (repetition
penalty, top-p, top-k). Each row has its own temperature, top-p, top-k, penalty and minimum
length (end-of-speech is masked before it), and draws from its private ``torch.Generator`` on
CPU, so a row's tokens are the same alone or in any batch.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as P

from .batch import NUM_VQ
from .row import REPETITION_WINDOW, Row


class Sampler:
    def __init__(self, embed: Any, eos: int):
        self.heads = embed.head_code
        self.eos = eos
        self._warpers: dict[tuple, tuple] = {}

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, hidden) -> (B, 4, V) float32 logits."""
        with P.cached():  # the heads are weight-normed: compute each weight once per call
            logits = torch.stack([self.heads[q](hidden) for q in range(NUM_VQ)], 1)
        return logits.float()

    def warpers(self, top_p: float, top_k: int, penalty: float) -> tuple:
        key = (top_p, top_k, penalty)
        if key not in self._warpers:
            from ChatTTS.model import gen_logits

            self._warpers[key] = gen_logits(num_code=self.eos, top_P=top_p, top_K=top_k, repetition_penalty=penalty)
        return self._warpers[key]

    def probs(self, row: Row, logits: torch.Tensor) -> torch.Tensor:
        """One row's next-token distribution (4, V) from its logits (4, V)."""
        lg = logits / row.req.temperature
        warpers, processors = self.warpers(row.req.top_p, row.req.top_k, row.req.repetition_penalty)
        if row.history:
            hist = torch.stack(row.history[-REPETITION_WINDOW:], 1).to(lg.device)  # (4, n)
            for proc in processors:
                lg = proc(hist, lg)
        for warp in warpers:
            lg = warp(None, lg)
        if row.n_generated < row.req.min_new_tokens:
            lg[:, self.eos] = -torch.inf
        return F.softmax(lg, dim=-1)

    @staticmethod
    def draw(row: Row, probs: torch.Tensor) -> Optional[torch.Tensor]:
        """A token (4,) from ``probs`` (4, V) on CPU with the row's generator; None when the
        probabilities are not finite (degenerate parameters or numerics)."""
        if not bool(torch.isfinite(probs).all()):
            return None
        return torch.multinomial(probs, 1, generator=row.generator).squeeze(1)
