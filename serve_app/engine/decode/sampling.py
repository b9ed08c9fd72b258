"""Sampling the next token of every row at once, from the GPT's hidden states.

ChatTTS's sampling (``Chat._infer_code`` with ``gen_logits``): the code heads (``Embed.head_code``,
weight-normed linears), temperature, its repetition penalty over the last 16 tokens
(``CustomRepetitionPenaltyLogitsProcessorRepeat``), then transformers' top-p and top-k warpers
(each keeping at least 3 tokens), end-of-speech masked before a row's minimum length, softmax,
one draw per codebook. Here all of it is one batched pass over tensors that hold every row's
parameters and recent tokens (``SamplingState``, kept aligned with the batch's rows), so a step
costs the same handful of tensor ops at any batch size and no Python runs per row.

Every row still has its own seed: the uniform number behind a draw is a hash of (the row's seed,
the token's index in the row, the codebook), computed in the batch, so a row's tokens are the
same alone or in any batch, on any device, whatever else drew before. The draw is inverse-CDF
sampling over the kept tokens, best first.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch
import torch.nn.utils.parametrize as P
from torch import nn

from ..linear import DualLayoutLinear
from ..types import SegmentRequest

NUM_VQ = 4  # ChatTTS's codebooks: a token is 4 codes
REPETITION_WINDOW = 16  # ChatTTS's past_window for its repetition penalty
MIN_TOKENS_TO_KEEP = 3  # gen_logits' top-p and top-k warpers keep at least this many candidates

_M32 = 0xFFFFFFFF
# Odd multipliers below 2**31: products of 32-bit values stay inside int64 (no overflow).
_MUL1, _MUL2 = 0x7FEB352D, 0x5BD1E995


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (xorshift-multiply rounds) of int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = (x * _MUL1) & _M32
    x = x ^ (x >> 15)
    x = (x * _MUL2) & _M32
    return x ^ (x >> 16)


def seed_keys(seed: torch.Tensor) -> torch.Tensor:
    """Each row's seed hashed once (B,): the key its draws are derived from."""
    return _mix32(_mix32((seed & _M32) ^ 0x9E3779B9) ^ ((seed >> 32) & _M32))


def uniforms(seed: torch.Tensor, index: torch.Tensor, keyed: bool = False) -> torch.Tensor:
    """Uniform numbers in [0, 1), (B, 4): one per row and codebook, a pure function of the row's
    ``seed`` (B,) (or its ``seed_keys`` with ``keyed``) and its token ``index`` (B,):
    counter-based, like Philox, so no generator state is carried and rows never share one."""
    q = torch.arange(NUM_VQ, device=seed.device)
    key = seed if keyed else seed_keys(seed)
    h = _mix32(key.unsqueeze(1) ^ ((index.unsqueeze(1) * NUM_VQ + q) & _M32))
    return (h >> 8).float() * (1.0 / (1 << 24))


class SamplingState:
    """Every running row's sampling parameters and recent tokens as (B, ...) tensors on the
    batch's device, in the batch's row order (``BatchState`` appends and selects with its rows)."""

    FIELDS = ("temperature", "top_p", "penalty", "top_k", "min_new", "seed", "generated", "history", "last")

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        z = torch.zeros(0, device=self.device)
        self.temperature = self.top_p = self.penalty = z
        lz = torch.zeros(0, dtype=torch.long, device=self.device)
        self.top_k = self.min_new = self.seed = self.generated = lz
        # The last REPETITION_WINDOW tokens, a ring written at generated % window; unwritten
        # slots hold code 0 with weight 0 (``filled``).
        self.history = torch.zeros(0, NUM_VQ, REPETITION_WINDOW, dtype=torch.long, device=self.device)
        self.last = torch.zeros(0, NUM_VQ, dtype=torch.long, device=self.device)  # next step's input codes

    def __len__(self) -> int:
        return int(self.seed.shape[0])

    def append(self, reqs: Sequence[SegmentRequest], saved: Optional[Sequence[Optional[dict]]] = None) -> None:
        """Rows at the end: new ones (their first token still to be drawn), or, where ``saved``
        has an entry, rows coming back with the state ``take`` kept."""

        def col(values: list, dtype: torch.dtype) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=self.device)

        n = len(reqs)
        f, i = torch.float32, torch.long
        new = {
            "temperature": col([r.temperature for r in reqs], f),
            "top_p": col([r.top_p for r in reqs], f),
            "penalty": col([r.repetition_penalty for r in reqs], f),
            "top_k": col([r.top_k for r in reqs], i),
            "min_new": col([r.min_new_tokens for r in reqs], i),
            "seed": seed_keys(col([int(r.seed) for r in reqs], i)),  # hashed once: the draws' key
            "generated": self.generated.new_zeros(n),
            "history": self.history.new_zeros(n, NUM_VQ, REPETITION_WINDOW),
            "last": self.last.new_zeros(n, NUM_VQ),
        }
        for j, kept in enumerate(saved or []):
            if kept is not None:
                for name in self.FIELDS:
                    new[name][j] = kept[name][0]
        merged = {name: torch.cat([getattr(self, name), value]) for name, value in new.items()}
        for name, value in merged.items():  # all built first: a failure leaves the state as it was
            setattr(self, name, value)

    def take(self, i: int) -> dict:
        """A copy of row ``i``'s state (for ``append(..., saved=)``: a parked row)."""
        return {name: getattr(self, name)[i : i + 1].clone() for name in self.FIELDS}

    def select(self, idx: torch.Tensor) -> None:
        """Keep the rows at ``idx`` (a long tensor), in that order."""
        for name in self.FIELDS:
            setattr(self, name, getattr(self, name).index_select(0, idx))

    def record(self, tokens: torch.Tensor, start: int = 0) -> None:
        """Rows ``start:`` drew ``tokens`` (n, 4): their next input, their history, their count."""
        rows = slice(start, start + tokens.shape[0])
        self.last[rows] = tokens
        slot = (self.generated[rows] % REPETITION_WINDOW).view(-1, 1, 1).expand(-1, NUM_VQ, 1)
        self.history[rows] = self.history[rows].scatter(2, slot, tokens.unsqueeze(2))
        self.generated[rows] += 1


class Sampler:
    """The heads and the batched sampling pass. The heads' weight norm is computed once here
    (the weights do not change while serving): it cost more than a tiny GPT's whole forward
    when recomputed every step."""

    def __init__(self, embed: Any, eos: int):
        self.eos = eos
        heads = embed.head_code
        with torch.no_grad(), P.cached():
            weight = torch.cat([heads[q].weight for q in range(NUM_VQ)]).detach().clone()  # (4V, hidden)
        head = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
        head.weight = nn.Parameter(weight, requires_grad=False)
        # On CPU in float32 a few-row product is faster with an (in, out) copy (linear.py).
        self.head = DualLayoutLinear(head) if weight.device.type == "cpu" and weight.dtype == torch.float32 else head
        self.vocab = weight.shape[0] // NUM_VQ

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(B, hidden) -> (B, 4, V) float32 logits: the four heads as one matmul."""
        w = self.head.weight
        return self.head(hidden.to(w.device, w.dtype)).view(hidden.shape[0], NUM_VQ, self.vocab).float()

    def sample(self, state: SamplingState, hidden: torch.Tensor, start: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw the next token of rows ``start:`` of ``state`` from their hidden states (n, hidden):
        ``(tokens (n, 4), ok (n,))`` on the state's device; ``ok`` is False where the
        probabilities were not finite (that row fails; the others go on). Records the tokens."""
        rows = slice(start, start + hidden.shape[0])
        logits = self.logits(hidden.to(state.device))
        tokens, ok = self.draw(
            logits,
            temperature=state.temperature[rows],
            top_p=state.top_p[rows],
            top_k=state.top_k[rows],
            penalty=state.penalty[rows],
            history=state.history[rows],
            filled=torch.clamp(state.generated[rows], max=REPETITION_WINDOW),
            eos_masked=state.generated[rows] < state.min_new[rows],
            u=uniforms(state.seed[rows], state.generated[rows], keyed=True),
        )
        state.record(tokens, start)
        return tokens, ok

    def draw(
        self,
        logits: torch.Tensor,
        *,
        temperature: torch.Tensor,
        top_p: torch.Tensor,
        top_k: torch.Tensor,
        penalty: torch.Tensor,
        history: torch.Tensor,
        filled: torch.Tensor,
        eos_masked: torch.Tensor,
        u: torch.Tensor,
        max_top_k: Optional[int] = None,
        probs_out: Optional[list] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batched pass over (B, 4, V) logits with per-row parameters (B,), the rows' last
        tokens ``history`` (B, 4, W) of which ``filled`` (B,) are real, and uniforms ``u`` (B, 4).
        ``probs_out``: a list that receives the (B, 4, V) distribution drawn from (tests)."""
        b, nq, v = logits.shape
        lg = logits / temperature.view(b, 1, 1)
        # Repetition penalty: penalty ** (times the code occurred in the window), dividing
        # positive logits and multiplying negative ones (ChatTTS's processor).
        weight = (torch.arange(REPETITION_WINDOW, device=lg.device) < filled.view(b, 1)).to(lg.dtype)
        freq = lg.new_zeros(b, nq, v).scatter_add_(2, history, weight.view(b, 1, -1).expand(b, nq, -1))
        alpha = torch.pow(penalty.view(b, 1, 1), freq)
        lg = torch.where(lg < 0, lg * alpha, lg / alpha)
        # Top-p then top-k as transformers' warpers compute them, over the best ``width`` codes
        # (all of them by default: a width taken from the batch, e.g. its largest k, would change
        # a row's sums with the rows beside it; ``max_top_k`` narrows it for callers of one row):
        # top-p keeps a code while the mass above it (of the full softmax) is under top_p; top-k
        # keeps logits at or above the k-th largest (ties kept); both keep MIN_TOKENS_TO_KEEP.
        width = min(v, max(MIN_TOKENS_TO_KEEP, max_top_k if max_top_k is not None else v))
        sorted_lg, order = torch.topk(lg, width, dim=-1, sorted=True)
        p_sorted = (sorted_lg - torch.logsumexp(lg, -1, keepdim=True)).exp()
        above = p_sorted.cumsum(-1) - p_sorted
        rank = torch.arange(width, device=lg.device)
        keep = (above < top_p.view(b, 1, 1)) | (rank < MIN_TOKENS_TO_KEEP)
        k = torch.clamp(top_k, min=MIN_TOKENS_TO_KEEP, max=width).view(b, 1, 1).expand(b, nq, 1)
        keep &= sorted_lg >= sorted_lg.gather(-1, k - 1)
        # End-of-speech after the warpers, before a row's minimum length (as ChatTTS masks it).
        keep &= ~((order == self.eos) & eos_masked.view(b, 1, 1))
        probs = torch.where(keep, sorted_lg, torch.full_like(sorted_lg, -torch.inf)).softmax(-1)
        if probs_out is not None:
            probs_out.append(lg.new_zeros(b, nq, v).scatter_(-1, order, probs))
        # A NaN or infinite logit would only drop out of the sort's kept set: fail the row instead.
        ok = torch.isfinite(probs).all(-1).all(-1) & torch.isfinite(logits).all(-1).all(-1)
        probs = torch.where(ok.view(b, 1, 1), probs, torch.zeros_like(probs).index_fill_(-1, rank[:1], 1.0))
        # Inverse CDF over the kept tokens, best first: the first whose cumulative mass passes
        # u * total. u * total rounding up to the total (never in exact arithmetic) takes the best.
        cdf = probs.cumsum(-1)
        total = cdf[..., -1:]
        x = u.unsqueeze(-1) * total
        x = torch.where(x < total, x, torch.zeros_like(x))
        pick = torch.searchsorted(cdf, x, right=True).clamp_(max=width - 1)
        return order.gather(-1, pick).squeeze(-1), ok
