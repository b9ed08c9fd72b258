"""CPU decode GEMMs: each GPT linear layer also keeps its weight in (in, out) layout.

torch stores a linear weight as (out, in) and ``F.linear`` multiplies by its transpose. For the
few-row products of a decode step, MKL's kernel for that layout can be much slower than the same
product with an (in, out) copy of the weight (the measurements: bench/README.md, "Measurements
behind code choices"). The price is a second copy of the GPT's linear weights in RAM (about
0.76 GB at full size: one float32 copy of the GPT's linear layers). GPUs do not need it.

The (in, out) product is also what makes float32 decoding batch-invariant: ``F.linear`` changes
kernels (and roundings) with the row count, while MKL's kernel for ``x @ w_t`` gives each row the
same bits for most row counts, not all: which ones depends on the CPU (on one Xeon every count
from 2 up, a single row taking a matrix-vector path of its own; on an AVX-512 EPYC the multiples
of 4 and every count from 12 up, fewer rows taking a remainder kernel). So the counts are
measured once per layer shape and thread count (``row_padding``), and a product of an unstable
count is computed with zero rows added up to the next stable one: a row's result is then the same
alone and in any batch (tests/unit/test_batch_invariance.py holds it to that, bit for bit).
"""

from __future__ import annotations

import functools
import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

_PROBE_ROWS = 32  # row counts measured: 1 to this; larger ones are taken as stable


@functools.lru_cache(maxsize=None)
def row_padding(in_features: int, out_features: int, dtype: torch.dtype, threads: int) -> tuple[int, ...]:
    """For ``n`` rows (the index), the rows to compute ``x @ w`` (w: (in, out)) as so that every
    row gets the bits it gets in a product of the probe's largest count; counts past the tuple's
    end need none. Measured on random data of the layer's shape (a kernel is chosen by the
    shapes, not the values) with ``threads`` torch threads (the caller's: they split the rows)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(in_features, out_features, generator=gen).to(dtype)
    x = torch.randn(_PROBE_ROWS, in_features, generator=gen).to(dtype)
    whole = x @ w
    stable = [n for n in range(1, _PROBE_ROWS + 1) if torch.equal(x[:n] @ w, whole[:n])]
    unstable = sorted(set(range(1, _PROBE_ROWS + 1)) - set(stable))
    if unstable and unstable[-1] > _PROBE_ROWS // 2:
        log.warning(
            "%dx%d products change a row's bits at %s rows: not batch-invariant", in_features, out_features, unstable
        )
    last = unstable[-1] if unstable else 0
    return (0,) + tuple(min(m for m in stable if m >= n) for n in range(1, last + 1))


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` (n, in) with zero rows after it up to ``rows`` (an output row depends on its own row only)."""
    return torch.cat([x, x.new_zeros(rows - x.shape[0], x.shape[1])])


class DualLayoutLinear(nn.Module):
    """Drop-in for an ``nn.Linear``: same parameters, plus the transposed copy every call multiplies by."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        # Not a parameter: derived from weight, rebuilt here rather than saved.
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous(), persistent=False)
        self._padding: tuple[int, ...] | None = None  # measured at the first call, on the thread that decodes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._padding is None:
            self._padding = row_padding(
                self.in_features, self.out_features, self.weight_t.dtype, torch.get_num_threads()
            )
        rows = x.numel() // self.in_features
        if rows < len(self._padding) and self._padding[rows] != rows:  # a row count whose kernel rounds apart
            y = (_padded(x.reshape(rows, -1), self._padding[rows]) @ self.weight_t)[:rows].view(*x.shape[:-1], -1)
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
