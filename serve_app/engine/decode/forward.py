"""The decode step's GPT forward, written out for one new token per row.

``LlamaModel.forward`` is general: it builds a causal mask from whatever it is given, routes
every layer through cache objects, attention interfaces and keyword plumbing. For a decode
step all of that is known in advance (one query per row, a boolean padding mask, KV columns
written in place into the batch's buffers), and its Python cost is paid per layer per step:
~1.5 ms of a 2-layer GPT's ~6 ms step on this CPU, and what a GPU step mostly is. This runs the
same modules (the loaded weights, the layers' norms, projections and MLPs, the model's rotary
embedding) in the same order with the same kernels (``scaled_dot_product_attention``), without
the plumbing. ``DecodeForward.supports`` says when it applies (default RoPE, no attention bias
quirks); otherwise the engine keeps transformers' forward. The prefill stays transformers'.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from .batch import BatchState


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class DecodeForward:
    """One decode step of a transformers ``LlamaModel`` over the batch's KV buffers."""

    def __init__(self, gpt: Any, embed: Any):
        cfg = gpt.config
        self.gpt = gpt
        self.layers = list(gpt.layers[: cfg.num_hidden_layers])
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scaling = self.layers[0].self_attn.scaling if self.layers else 1.0
        param = next(gpt.parameters())
        # ChatTTS's four code embeddings as one table (one gather a step, not four module calls).
        with torch.no_grad():
            tables = [e.weight.detach() for e in embed.emb_code]
            self.vocab = tables[0].shape[0]
            self.codes = torch.cat(tables).to(param.device)
            self.offsets = torch.arange(len(tables), device=param.device) * self.vocab
        self._rotary_table(cfg.max_position_embeddings)

    @torch.no_grad()
    def _rotary_table(self, n: int) -> None:
        """The rotary embedding of positions 0..n-1, computed once by the model's own module (the
        same ops on a vector of positions: the same values as computed per step)."""
        param = next(self.gpt.parameters())
        positions = torch.arange(n, device=param.device).unsqueeze(0)
        cos, sin = self.gpt.rotary_emb(torch.zeros(1, dtype=param.dtype, device=param.device), positions)
        self.cos, self.sin = cos[0], sin[0]  # (n, D)

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, 4) codes -> (B, hidden): the sum of the four codebooks' embeddings."""
        return F.embedding(tokens + self.offsets, self.codes).sum(1)

    @staticmethod
    def supports(gpt: Any) -> bool:
        """The plain Llama this writes out: default RoPE, attention by SDPA or eager (same math)."""
        cfg = gpt.config
        rope = (getattr(cfg, "rope_parameters", None) or {}).get("rope_type", "default")
        return rope == "default" and getattr(cfg, "_attn_implementation", "sdpa") in ("sdpa", "eager")

    def __call__(self, batch: BatchState, emb: torch.Tensor) -> torch.Tensor:
        """``emb`` (B, hidden): each row's new token embedded -> the last hidden states (B, hidden);
        the batch's buffers get the step's KV column of each row and advance by one (``open_step``
        / ``close_step`` as around transformers' forward). On CPU each row attends over exactly
        its own keys; elsewhere the batch attends in one call over the step's aligned span under
        the mask (batch.py: why)."""
        b = emb.shape[0]
        mask = batch.open_step()[:, None, None, :]  # (B, 1, 1, span), True = attend
        span = batch.step_span
        # On CPU each row attends over its own keys in a call of its own: the same arithmetic as
        # when it decodes alone, and as ChatTTS's decode of it. A GPU takes the batch in one call.
        lengths = [n + 1 for n in batch.lengths] if emb.device.type == "cpu" else None
        if span > self.cos.shape[0]:  # a position past the table (positions stay below the span)
            self._rotary_table(2 * span)
        h = emb.unsqueeze(1)  # (B, 1, hidden)
        cos = self.cos[batch.pos].view(b, 1, 1, -1)  # (B, 1, 1, D): broadcast over heads
        sin = self.sin[batch.pos].view(b, 1, 1, -1)
        kbufs, vbufs = [], []
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(b, 1, self.heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            kbuf, vbuf = batch.write_column(i, k, v)
            kbufs.append(kbuf)
            vbufs.append(vbuf)
            if lengths is not None:  # each row over exactly its own keys (batch.py: why)
                o = torch.cat(
                    [
                        F.scaled_dot_product_attention(
                            q[r : r + 1],
                            kbuf[r : r + 1, :, :n],
                            vbuf[r : r + 1, :, :n],
                            scale=self.scaling,
                            enable_gqa=self.kv_heads != self.heads,
                        )
                        for r, n in enumerate(lengths)
                    ]
                )
            else:
                o = F.scaled_dot_product_attention(
                    q,
                    kbuf[:, :, :span],
                    vbuf[:, :, :span],
                    attn_mask=mask,
                    scale=self.scaling,
                    enable_gqa=self.kv_heads != self.heads,
                )
            h = h + attn.o_proj(o.transpose(1, 2).reshape(b, 1, -1))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        batch.close_step(kbufs, vbufs)
        return self.gpt.norm(h)[:, -1]
