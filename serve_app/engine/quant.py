"""int8 weights for the GPT's linear layers on CPU (``model.quantize: int8``).

A CPU decode step reads every GPT linear weight once (756 MB in float32) and is bound by memory
bandwidth; in int8 the same weights are a quarter of that, multiplied by fbgemm's int8 kernels
(VNNI where the CPU has it). The kernel is torch's own fbgemm linear (``quantized::`` ops);
torchao's CPU paths are built for ``torch.compile`` and were slower than float32 in eager mode
(bench/README.md has the comparison).

Numerics:

* weights: symmetric int8 per output channel (max |w| / 127), packed once at load;
* activations: each row (token) is divided by its own max |x| and quantized with one fixed scale,
  so it gets all 8 bits whatever the other rows hold, and its result is bit-identical alone or
  in any batch. Dynamic per-tensor quantization (``quantize_dynamic``) takes one scale per call
  from the whole batch: a row's audio would then depend on the rows it shares steps with.

Only the GPT's attention and MLP projections are replaced (the modules under ``LlamaModel``);
ChatTTS's ``Embed`` (code embeddings and heads, ~1 % of the bytes read per step) stays float32.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)


def _activation_qparams() -> tuple[float, int]:
    """uint8 scale and zero point for rows scaled into [-1, 1]. fbgemm without VNNI adds pairs
    of uint8 x int8 products in int16, which saturates with full-range activations: 7 bits there."""
    probe = getattr(torch.cpu, "_is_vnni_supported", None)
    levels = 127 if probe is not None and probe() else 63
    return 1.0 / levels, levels


class Int8Linear(nn.Module):
    """Drop-in for an ``nn.Linear`` (or ``DualLayoutLinear``) on CPU with int8 weights."""

    def __init__(self, linear: nn.Module):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.detach().to(torch.float32)
        scale = (w.abs().amax(1) / 127.0).clamp_min(1e-12).to(torch.float64)
        zero = torch.zeros(w.shape[0], dtype=torch.long)
        with warnings.catch_warnings():
            # torch announces the end of quantized tensor dtypes (torch < 2.15 is pinned, and
            # tests/unit/test_quant.py fails first if they go); nothing an operator can act on.
            warnings.filterwarnings("ignore", message=".*quantize_per_channel.*deprecated")
            wq = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
        # The bias is added after the row scale is undone, so it is not packed with the weight.
        self._packed = torch.ops.quantized.linear_prepack(wq, None)
        bias = None if linear.bias is None else linear.bias.detach().to(torch.float32).clone()
        self.register_buffer("bias", bias)
        self.x_scale, self.x_zero_point = _activation_qparams()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True).clamp_min_(1e-30)
        y = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            x / m, self.x_scale, self.x_zero_point, self._packed
        ).mul_(m)
        return y if self.bias is None else y.add_(self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` / ``DualLayoutLinear`` under ``module`` with an ``Int8Linear``;
    returns how many. The float weights are dropped with the old modules."""
    from .linear import DualLayoutLinear

    targets = [
        (parent, name, child)
        for parent in module.modules()
        for name, child in parent.named_children()
        if type(child) in (nn.Linear, DualLayoutLinear)
    ]
    for parent, name, child in targets:
        setattr(parent, name, Int8Linear(child))
    return len(targets)


def quantize_gpt(gpt: nn.Module, mode: str, device: Any) -> str:
    """Apply ``model.quantize`` to the loaded GPT (transformers ``LlamaModel``); returns the mode
    in effect. int8 is CPU only: on another device (``device: auto`` that found a GPU) it is
    ignored with a warning, and the model runs as configured otherwise."""
    if mode == "none":
        return "none"
    if mode != "int8":
        raise ValueError(f"unknown quantize mode {mode!r}")
    if torch.device(device).type != "cpu":
        log.warning("model.quantize int8 is for CPU only: ignored on %s", device)
        return "none"
    n = quantize_linears(gpt)
    log.info("GPT: %d linear layers in int8", n)
    return "int8"
