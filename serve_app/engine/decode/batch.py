"""The running batch's tensors: KV buffers, padding mask and position ids, kept aligned with the
list of rows.

Rows are left-padded: every row's KV ends at the same column, so one decode step writes all
rows' new KV column at once. Per layer the keys (and values) live in a (B, H, capacity, D)
buffer, ``kbuf``, with ``keys`` the (B, H, T, D) view of its filled part; a step writes its
column in place (``BufferedLayer``) and the buffer is re-allocated only every ``KV_HEADROOM``
steps. Admission appends prefilled rows (TGI's ``concatenate``: one re-pack of the batch);
retirement drops rows (TGI's ``filter``: in-place compaction, all-padding columns cut as views).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .row import Row
from .sampling import NUM_VQ, SamplingState

KV_HEADROOM = 64  # free KV columns allocated ahead: steps write in place, one re-allocation per 64


class BufferedLayer(DynamicLayer):
    """A KV cache layer over preallocated buffers: a decode step writes its KV column in place
    and attention reads a view of the filled part, where ``DynamicLayer`` copies the whole cache
    with ``torch.cat`` every step (28% of a batch-8 step on this CPU)."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, n: int):
        super().__init__()
        self.lazy_initialization(kbuf, vbuf)
        self.kbuf, self.vbuf, self.n = kbuf, vbuf, n
        self.keys, self.values = kbuf[:, :, :n], vbuf[:, :, :n]
        self.owner: Optional[tuple["BatchState", int]] = (
            None  # the batch and layer these buffers are (BatchState.cache)
        )

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        end = self.n + key_states.shape[2]
        self.kbuf, self.vbuf = write_kv(self.kbuf, self.vbuf, self.n, key_states, value_states)
        if self.owner is not None:
            batch, layer = self.owner
            batch.adopt(layer, self.kbuf, self.vbuf, self.n)
        self.n = end
        self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.n


class Prefilled(NamedTuple):
    """A row ready to join the batch: its KV per layer, (1, H, n, D), with either the prompt's
    last hidden state (a new row: it yields the first token) or, for a row coming back from
    being parked, its saved sampling state (``SamplingState.take``) and no hidden state."""

    row: Row
    keys: list
    values: list
    hidden: Optional[torch.Tensor]
    sampling: Optional[dict] = None


def code_embeddings(embed: Any, tokens: torch.Tensor) -> torch.Tensor:
    """ChatTTS's input embedding of one audio token per row: (B, 4) codes -> (B, hidden)."""
    return torch.stack([embed.emb_code[q](tokens[:, q]) for q in range(NUM_VQ)], 2).sum(2)


class BatchState:
    """Rows, KV buffers, mask and positions of the running batch. Not thread-safe (decode thread)."""

    def __init__(self, gpt_config: Any, device: torch.device):
        self.gpt_config = gpt_config
        self.num_layers = gpt_config.num_hidden_layers
        self.device = device
        self.layer_cls: type = BufferedLayer  # the cache layer over the buffers
        self.rows: list[Row] = []
        # Per layer: (B, H, capacity, D) buffers, and (B, H, T, D) views of their filled part.
        self.kbuf: list[torch.Tensor] = []
        self.vbuf: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask: Optional[torch.Tensor] = None  # (B, T) bool, True = real token
        self.pos: Optional[torch.Tensor] = None  # (B,) next position id per row
        self.sampling = SamplingState(device)  # per-row sampling parameters, recent tokens, next input

    @property
    def width(self) -> int:
        """T: KV columns in use (padding included)."""
        return self.keys[0].shape[2] if self.keys else 0

    def set_kv(self, kbuf: list[torch.Tensor], vbuf: list[torch.Tensor], t: int) -> None:
        """Install per-layer buffers and their filled views (T = t)."""
        self.kbuf, self.vbuf = kbuf, vbuf
        self.keys = [b[:, :, :t] for b in kbuf]
        self.values = [b[:, :, :t] for b in vbuf]

    def reset(self) -> None:
        self.rows, self.keys, self.values, self.kbuf, self.vbuf = [], [], [], [], []
        self.mask = self.pos = None
        self.sampling.reset()

    # ------------------------------------------------------------------ concatenate

    def merge(self, prefilled: list[Prefilled]) -> None:
        """Append prefilled rows: every row's KV right-aligned (left padding) in new buffers, the
        running rows' copied once. All or nothing: on an error the batch is unchanged.

        One buffer at a time, each replacing its old one at once, so the batch's KV is never held
        twice: building every layer's new buffers before dropping the old ones was a transient
        second copy of the whole KV at every admission (the Acoustic replica's peak memory)."""
        lengths = [p.keys[0].shape[2] for p in prefilled]
        w = self.width if self.rows else 0
        t = max([w, *lengths])
        b_run = len(self.rows)
        new_mask = [torch.ones(1, n, dtype=torch.bool, device=self.device) for n in lengths]
        masks = ([self.mask] if self.rows else []) + new_mask
        mask = torch.cat([pad_left(m, t, dim=1) for m in masks], 0)
        new_pos = torch.tensor(lengths, dtype=torch.long, device=self.device)
        pos = torch.cat([self.pos, new_pos]) if self.rows else new_pos
        if not self.rows:
            kbuf = [pack_rows([p.keys[layer][0] for p in prefilled], t) for layer in range(self.num_layers)]
            vbuf = [pack_rows([p.values[layer][0] for p in prefilled], t) for layer in range(self.num_layers)]
            self.set_kv(kbuf, vbuf, t)
        else:
            replaced: list[tuple[list, list, int]] = []
            try:
                for layer in range(self.num_layers):
                    for bufs, views, attr in ((self.kbuf, self.keys, "keys"), (self.vbuf, self.values, "values")):
                        sources = [views[layer][i] for i in range(b_run)] + [
                            getattr(p, attr)[layer][0] for p in prefilled
                        ]
                        buf = pack_rows(sources, t)
                        del sources
                        bufs[layer], views[layer] = buf, buf[:, :, :t]  # the old buffer goes here
                        replaced.append((bufs, views, layer))
            except BaseException:
                # Back to the running rows alone: views of the new buffers (nothing to allocate).
                for bufs, views, layer in replaced:
                    bufs[layer] = bufs[layer][:b_run, :, t - w :]
                    views[layer] = bufs[layer][:, :, :w]
                raise
        self.mask, self.pos = mask, pos
        self.sampling.append([p.row.req for p in prefilled], [p.sampling for p in prefilled])
        self.rows.extend(p.row for p in prefilled)

    # ------------------------------------------------------------------ one decode step

    def open_step(self) -> torch.Tensor:
        """Add the step's column to the mask (every row's new token is real); returns the mask."""
        self.mask = torch.cat([self.mask, self.mask.new_ones(len(self.rows), 1)], 1)
        return self.mask

    def cache(self) -> DynamicCache:
        """A transformers cache whose layers write into this batch's buffers."""
        cache = DynamicCache(config=self.gpt_config)
        t = self.width
        cache.layers = [self.layer_cls(self.kbuf[i], self.vbuf[i], t) for i in range(self.num_layers)]
        for i, layer in enumerate(cache.layers):
            if isinstance(layer, BufferedLayer):
                layer.owner = (self, i)
        return cache

    def write_column(self, layer: int, t: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a step's KV (B, H, 1, D) of ``layer`` at column ``t``; returns the layer's buffers
        (re-allocated when full; hand them to ``close_step``)."""
        kbuf, vbuf = write_kv(self.kbuf[layer], self.vbuf[layer], t, k, v)
        self.adopt(layer, kbuf, vbuf, t)
        return kbuf, vbuf

    def adopt(self, layer: int, kbuf: torch.Tensor, vbuf: torch.Tensor, t: int) -> None:
        """A layer's buffers re-allocated mid-step (``write_kv``) replace the old ones now, so each
        old buffer is freed as its layer moves on, not all of them after the forward (a second
        copy of the whole KV every ``KV_HEADROOM`` steps). The views keep width ``t`` until
        ``close_step``."""
        if kbuf is not self.kbuf[layer]:
            self.kbuf[layer], self.vbuf[layer] = kbuf, vbuf
            self.keys[layer], self.values[layer] = kbuf[:, :, :t], vbuf[:, :, :t]

    def close_step(self, kbuf: list[torch.Tensor], vbuf: list[torch.Tensor]) -> None:
        """After the forward: the buffers now hold one more column (re-allocated if they grew)."""
        self.set_kv(kbuf, vbuf, self.width + 1)
        self.pos = self.pos + 1

    # ------------------------------------------------------------------ park

    def park(self, indices: list[int]) -> list[Prefilled]:
        """Take the rows at ``indices`` out of the batch, each with a copy of its own KV (its
        real columns only: the last ``pos`` ones, rows being left-padded) and its sampling state,
        ready to ``merge`` back where they left off."""
        t = self.width
        out = []
        for i in indices:
            n = int(self.pos[i])
            keys = [b[i : i + 1, :, t - n : t].clone() for b in self.kbuf]
            values = [b[i : i + 1, :, t - n : t].clone() for b in self.vbuf]
            out.append(Prefilled(self.rows[i], keys, values, None, self.sampling.take(i)))
        gone = set(indices)
        self.retire([i for i in range(len(self.rows)) if i not in gone])
        return out

    # ------------------------------------------------------------------ filter

    def retire(self, keep: list[int]) -> None:
        """Keep only the rows at indices ``keep`` (ascending), drop the others' KV; trim columns
        where every remaining row is padding."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self.reset()
            return
        # Compact in place: every freed slot below the new batch size takes one kept row from
        # above it, so a finished row costs one row's KV copy, not a copy of the whole batch
        # (repacking every row was 10% of the decode thread's time at 12 rows).
        n = len(keep)
        kept = set(keep)
        holes = [i for i in range(n) if i not in kept]
        movers = [i for i in keep if i >= n]  # as many as holes
        order = list(range(n))
        for h, m in zip(holes, movers):
            order[h] = m
        idx = torch.tensor(order, dtype=torch.long, device=self.device)
        self.rows = [self.rows[i] for i in order]
        self.mask = self.mask.index_select(0, idx)
        self.pos = self.pos.index_select(0, idx)
        self.sampling.select(idx)
        # Columns where every remaining row is padding carry nothing: cut them (views; the freed
        # rows and columns go back when the buffers are next re-allocated).
        first = int(self.mask.any(0).nonzero()[0])
        self.mask = self.mask[:, first:]
        end = self.width
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.device)
            src = torch.tensor(movers, dtype=torch.long, device=self.device)
            for buf in (*self.kbuf, *self.vbuf):
                buf[dst, :, first:end] = buf[src, :, first:end]
        self.set_kv([b[:n, :, first:] for b in self.kbuf], [b[:n, :, first:] for b in self.vbuf], end - first)


def write_kv(
    kbuf: torch.Tensor, vbuf: torch.Tensor, n: int, k: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Write ``k``/``v`` (B, H, m, D) at columns n..n+m of the buffers, growing them by
    ``KV_HEADROOM`` when full; returns the buffers written."""
    end = n + k.shape[2]
    if end > kbuf.shape[2]:
        kbuf, vbuf = with_headroom(kbuf[:, :, :n]), with_headroom(vbuf[:, :, :n])
    kbuf[:, :, n:end] = k
    vbuf[:, :, n:end] = v
    return kbuf, vbuf


def pack_rows(rows: list[torch.Tensor], t: int) -> torch.Tensor:
    """A (len(rows), H, t + KV_HEADROOM, D) buffer: row j's (H, n, D) KV in columns t-n..t, zeros
    before it (masked, but must be finite), the headroom left unset (written before it is read)."""
    h, _, d = rows[0].shape
    buf = rows[0].new_empty(len(rows), h, t + KV_HEADROOM, d)
    for j, x in enumerate(rows):
        n = x.shape[1]
        if n < t:
            buf[j, :, : t - n].zero_()
        buf[j, :, t - n : t] = x
    return buf


def with_headroom(x: torch.Tensor) -> torch.Tensor:
    """A (B, H, T + KV_HEADROOM, D) buffer whose first T columns are ``x``."""
    b, h, t, d = x.shape
    buf = x.new_empty(b, h, t + KV_HEADROOM, d)
    buf[:, :, :t] = x
    return buf


def pad_left(x: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    n = x.shape[dim]
    if n == length:
        return x
    shape = list(x.shape)
    shape[dim] = length - n
    return torch.cat([x.new_zeros(shape), x], dim)
