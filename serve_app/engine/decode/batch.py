"""The running batch's tensors: KV buffers and position ids, kept aligned with the list of rows.

Rows are left-aligned (right padding): row i's KV fills columns 0..pos[i]-1 of its buffer row,
and a step writes each row's new column at its own ``pos[i]`` (which is also its position id).
Per layer the keys (and values) live in a zero-filled (B, H, capacity, D) buffer.

Why this layout: batch invariance. A row's keys are then a contiguous run from column 0 that no
other row moves: the CPU decode step (``DecodeForward``) attends each row over exactly its own
keys, the computation ChatTTS's own decode does for it alone, whatever else is in the batch.
Where one call must cover the batch (a GPU step, CUDA graphs, transformers' own forward),
attention reads the first ``span`` columns, the columns in use rounded up to ``ALIGN``, under a
mask that is True on each row's real columns: the other rows then only add masked columns after
a row's keys, in whole blocks. With left padding a row's keys moved whenever a longer row joined,
and the kernels' reduction order moved with them: under int8 (which rounds each activation to 8
bits) that flipped tokens (tests/unit/test_batch_invariance.py).

The buffers are re-allocated only every ``KV_HEADROOM`` steps. Admission appends prefilled rows
(TGI's ``concatenate``: one re-pack of the batch); retirement drops rows (TGI's ``filter``:
in-place compaction, columns past the longest remaining row cut as views).
"""

from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .row import Row
from .sampling import NUM_VQ, SamplingState

KV_HEADROOM = 64  # free KV columns allocated ahead: steps write in place, one re-allocation per 64
# Attention reads whole blocks of this many columns (a multiple of the CPU kernels' vector and
# block widths): a row's reduction order is then the same alone and in any batch.
ALIGN = 64


def aligned(n: int) -> int:
    """``n`` rounded up to a whole number of ``ALIGN`` blocks."""
    return -(-n // ALIGN) * ALIGN


class BufferedLayer(DynamicLayer):
    """A transformers cache layer over the batch's buffers, for transformers' own forward (models
    ``DecodeForward`` does not write out): a step writes each row's KV column in place at the row's
    position (``BatchState.write_column``) and attention reads the aligned span. Used for decode
    steps only (one new token per row)."""

    def __init__(self, batch: "BatchState", layer: int):
        super().__init__()
        self.batch, self.layer = batch, layer
        self.lazy_initialization(batch.kbuf[layer], batch.vbuf[layer])
        self.kbuf, self.vbuf = batch.kbuf[layer], batch.vbuf[layer]
        self.keys, self.values = batch.keys[layer], batch.values[layer]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.kbuf, self.vbuf = self.batch.write_column(self.layer, key_states, value_states)
        span = self.batch.step_span
        self.keys, self.values = self.kbuf[:, :, :span], self.vbuf[:, :, :span]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.batch.width


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
    """Rows, KV buffers and positions of the running batch. Not thread-safe (decode thread)."""

    def __init__(self, gpt_config: Any, device: torch.device):
        self.gpt_config = gpt_config
        self.num_layers = gpt_config.num_hidden_layers
        self.device = device
        self.layer_cls: type = BufferedLayer  # the cache layer transformers' forward writes through
        self.rows: list[Row] = []
        # Per layer: (B, H, capacity, D) zero-filled buffers, and (B, H, T, D) views of the columns in use.
        self.kbuf: list[torch.Tensor] = []
        self.vbuf: list[torch.Tensor] = []
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.pos: Optional[torch.Tensor] = None  # (B,) real tokens per row: its next column and position id
        self.lengths: list[int] = []  # the same on the host (per-row attention slices by it, no device sync)
        self._t = 0  # columns in use: the longest row (max of pos), kept on the host
        self.step_span = 0  # columns the current step's attention reads (open_step)
        self.sampling = SamplingState(device)  # per-row sampling parameters, recent tokens, next input

    @property
    def width(self) -> int:
        """T: KV columns in use (the longest row)."""
        return self._t if self.rows else 0

    @property
    def mask(self) -> Optional[torch.Tensor]:
        """(B, T) bool, True on each row's real columns (its first pos[i]); None without rows."""
        if not self.rows:
            return None
        return torch.arange(self._t, device=self.device) < self.pos.unsqueeze(1)

    def set_kv(self, kbuf: list[torch.Tensor], vbuf: list[torch.Tensor], t: int) -> None:
        """Install per-layer buffers and their views of the columns in use (T = t)."""
        self.kbuf, self.vbuf, self._t = kbuf, vbuf, t
        self.keys = [b[:, :, :t] for b in kbuf]
        self.values = [b[:, :, :t] for b in vbuf]

    def reset(self) -> None:
        self.rows, self.keys, self.values, self.kbuf, self.vbuf = [], [], [], [], []
        self.pos, self._t, self.lengths = None, 0, []
        self.sampling.reset()

    # ------------------------------------------------------------------ concatenate

    def merge(self, prefilled: list[Prefilled]) -> None:
        """Append prefilled rows: every row's KV left-aligned in new buffers, the running rows'
        copied once. All or nothing: on an error the batch is unchanged.

        One buffer at a time, each replacing its old one at once, so the batch's KV is never held
        twice: building every layer's new buffers before dropping the old ones was a transient
        second copy of the whole KV at every admission (the Acoustic replica's peak memory)."""
        lengths = [p.keys[0].shape[2] for p in prefilled]
        w = self.width
        t = max([w, *lengths])
        capacity = aligned(t) + KV_HEADROOM
        b_run = len(self.rows)
        new_pos = torch.tensor(lengths, dtype=torch.long, device=self.device)
        pos = torch.cat([self.pos, new_pos]) if self.rows else new_pos
        if not self.rows:
            kbuf = [pack_rows([p.keys[layer][0] for p in prefilled], capacity) for layer in range(self.num_layers)]
            vbuf = [pack_rows([p.values[layer][0] for p in prefilled], capacity) for layer in range(self.num_layers)]
            self.set_kv(kbuf, vbuf, t)
        else:
            replaced: list[tuple[list, list, int]] = []
            try:
                for layer in range(self.num_layers):
                    for bufs, views, attr in ((self.kbuf, self.keys, "keys"), (self.vbuf, self.values, "values")):
                        sources = [views[layer][i] for i in range(b_run)] + [
                            getattr(p, attr)[layer][0] for p in prefilled
                        ]
                        buf = pack_rows(sources, capacity)
                        del sources
                        bufs[layer], views[layer] = buf, buf[:, :, :t]  # the old buffer goes here
                        replaced.append((bufs, views, layer))
            except BaseException:
                # Back to the running rows alone: views of the new buffers (nothing to allocate).
                for bufs, views, layer in replaced:
                    bufs[layer] = bufs[layer][:b_run]
                    views[layer] = bufs[layer][:, :, :w]
                raise
            self._t = t
        self.pos = pos
        self.lengths = self.lengths + lengths
        self.sampling.append([p.row.req for p in prefilled], [p.sampling for p in prefilled])
        self.rows.extend(p.row for p in prefilled)

    # ------------------------------------------------------------------ one decode step

    def open_step(self) -> torch.Tensor:
        """The step's attention mask (B, span): each row's real columns and its new one (at
        ``pos``), over the columns in use plus one, rounded up to ``ALIGN``."""
        self.step_span = aligned(self._t + 1)
        return torch.arange(self.step_span, device=self.device) <= self.pos.unsqueeze(1)

    def cache(self) -> DynamicCache:
        """A transformers cache whose layers write into this batch's buffers (one decode step)."""
        cache = DynamicCache(config=self.gpt_config)
        cache.layers = [self.layer_cls(self, i) for i in range(self.num_layers)]
        return cache

    def write_column(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write a step's KV (B, H, 1, D) of ``layer``, each row at its own column ``pos``;
        returns the layer's buffers, at least ``step_span`` columns wide (re-allocated when not;
        hand them to ``close_step``)."""
        kbuf, vbuf = self.kbuf[layer], self.vbuf[layer]
        if kbuf.shape[2] < self.step_span:
            kbuf, vbuf = with_capacity(kbuf, self._t, self.step_span), with_capacity(vbuf, self._t, self.step_span)
            self.adopt(layer, kbuf, vbuf)
        rows = torch.arange(k.shape[0], device=kbuf.device)
        kbuf[rows, :, self.pos] = k[:, :, 0]
        vbuf[rows, :, self.pos] = v[:, :, 0]
        return kbuf, vbuf

    def adopt(self, layer: int, kbuf: torch.Tensor, vbuf: torch.Tensor) -> None:
        """A layer's buffers re-allocated mid-step replace the old ones now, so each old buffer is
        freed as its layer moves on, not all of them after the forward (a second copy of the whole
        KV every ``KV_HEADROOM`` steps). The views keep width T until ``close_step``."""
        self.kbuf[layer], self.vbuf[layer] = kbuf, vbuf
        self.keys[layer], self.values[layer] = kbuf[:, :, : self._t], vbuf[:, :, : self._t]

    def close_step(self, kbuf: list[torch.Tensor], vbuf: list[torch.Tensor]) -> None:
        """After the forward: every row holds one more column (buffers re-allocated if they grew)."""
        self.set_kv(kbuf, vbuf, self._t + 1)
        self.pos = self.pos + 1
        self.lengths = [n + 1 for n in self.lengths]

    # ------------------------------------------------------------------ park

    def park(self, indices: list[int]) -> list[Prefilled]:
        """Take the rows at ``indices`` out of the batch, each with a copy of its own KV (its
        real columns only: the first ``pos``) and its sampling state, ready to ``merge`` back
        where they left off."""
        out = []
        for i in indices:
            n = self.lengths[i]
            keys = [b[i : i + 1, :, :n].clone() for b in self.kbuf]
            values = [b[i : i + 1, :, :n].clone() for b in self.vbuf]
            out.append(Prefilled(self.rows[i], keys, values, None, self.sampling.take(i)))
        gone = set(indices)
        self.retire([i for i in range(len(self.rows)) if i not in gone])
        return out

    # ------------------------------------------------------------------ filter

    def retire(self, keep: list[int]) -> None:
        """Keep only the rows at indices ``keep`` (ascending), drop the others' KV; cut the
        columns past the longest remaining row."""
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
        self.pos = self.pos.index_select(0, idx)
        self.lengths = [self.lengths[i] for i in order]
        self.sampling.select(idx)
        end = self._t
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.device)
            src = torch.tensor(movers, dtype=torch.long, device=self.device)
            for buf in (*self.kbuf, *self.vbuf):
                buf[dst, :, :end] = buf[src, :, :end]
        # Columns past the longest remaining row carry nothing: cut them (views; they stay
        # allocated, finite, and masked until the buffers are next re-allocated).
        self.set_kv([b[:n] for b in self.kbuf], [b[:n] for b in self.vbuf], max(self.lengths))


def pack_rows(rows: list[torch.Tensor], capacity: int) -> torch.Tensor:
    """A zero-filled (len(rows), H, capacity, D) buffer with row j's (H, n, D) KV in columns 0..n.
    Zeros: attention reads masked columns too, and they must be finite."""
    h, _, d = rows[0].shape
    buf = rows[0].new_zeros(len(rows), h, capacity, d)
    for j, x in enumerate(rows):
        buf[j, :, : x.shape[1]] = x
    return buf


def with_capacity(x: torch.Tensor, t: int, span: int) -> torch.Tensor:
    """A zero-filled (B, H, span + KV_HEADROOM, D) buffer whose first ``t`` columns are ``x``'s."""
    b, h, _, d = x.shape
    buf = x.new_zeros(b, h, span + KV_HEADROOM, d)
    buf[:, :, :t] = x[:, :, :t]
    return buf
