"""CPU decode GEMMs: each GPT linear layer also keeps its weight in (in, out) layout.

torch stores a linear weight as (out, in) and ``F.linear`` multiplies by its transpose. For the
few-row products of a decode step, MKL's kernel for that layout can be much slower than the same
product with an (in, out) copy of the weight (the measurements: bench/README.md, "Measurements
behind code choices"). The price is a second copy of the GPT's linear weights in RAM (about
0.76 GB at full size: one float32 copy of the GPT's linear layers). GPUs do not need it.

The (in, out) product is also what makes float32 decoding batch-invariant: MKL computes each
output row of ``x @ w_t`` with the same reduction order for any number of rows from 2 up, while
``F.linear`` changes kernels (and roundings) with the row count, and a single row takes a
matrix-vector path of its own. So every call goes through ``x @ w_t`` and a single row is
computed as two (itself twice): a row's result is then the same alone and in any batch
(tests/unit/test_batch_invariance.py holds it to that, bit for bit).
"""

from __future__ import annotations

import torch
from torch import nn


class DualLayoutLinear(nn.Module):
    """Drop-in for an ``nn.Linear``: same parameters, plus the transposed copy every call multiplies by."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # Not a parameter: derived from weight, rebuilt here rather than saved.
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == self.in_features:  # one row: as one of two (the matrix-vector path rounds apart)
            y = (torch.cat([x.reshape(1, -1)] * 2) @ self.weight_t)[:1].view(*x.shape[:-1], -1)
        else:
            y = x @ self.weight_t
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def use_dual_layout(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` under ``module`` with a ``DualLayoutLinear``; returns how many.

    Call after the weights are loaded (the copies are taken now) and not on a module in training."""
    targets = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if type(child) is nn.Linear
    ]
    for parent, name, child in targets:
        setattr(parent, name, DualLayoutLinear(child))
    return len(targets)
