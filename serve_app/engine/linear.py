"""CPU decode GEMMs: each GPT linear layer also keeps its weight in (in, out) layout.

torch stores a linear weight as (out, in) and ``F.linear`` multiplies by its transpose. For the
few-row products of a decode step, MKL's kernel for that layout can be much slower than the same
product with an (in, out) copy of the weight; at 2-3 rows the (in, out) kernel is the slower
one, and at 1 row and at prefill sizes the two are even, so each call picks its layout by row
count (the measurements: bench/README.md, "Measurements behind code choices"). The price is a
second copy of the GPT's linear weights in RAM (about 0.76 GB at full size: one float32 copy of
the GPT's linear layers). GPUs do not need it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# Rows (tokens in the call) from which the (in, out) layout wins on full-size layers
# (bench/README.md, "Measurements behind code choices").
MIN_ROWS = 4


class DualLayoutLinear(nn.Module):
    """Drop-in for an ``nn.Linear``: same parameters, plus a transposed copy used for 4+ rows."""

    def __init__(self, linear: nn.Linear, min_rows: int = MIN_ROWS):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.min_rows = min_rows
        # Not a parameter: derived from weight, rebuilt here rather than saved.
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() < self.min_rows * self.in_features:
            return F.linear(x, self.weight, self.bias)
        y = x @ self.weight_t
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, min_rows={self.min_rows}"


def use_dual_layout(module: nn.Module, min_rows: int = MIN_ROWS) -> int:
    """Replace every ``nn.Linear`` under ``module`` with a ``DualLayoutLinear``; returns how many.

    Call after the weights are loaded (the copies are taken now) and not on a module in training."""
    targets = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in targets:
        setattr(parent, name, DualLayoutLinear(child, min_rows))
    return len(targets)
