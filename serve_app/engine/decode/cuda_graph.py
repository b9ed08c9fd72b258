"""Decode steps replayed as CUDA graphs, one per batch-size bucket.

At small batches a GPU decode step costs the launches of its kernels (~15 per GPT layer) from
Python more than their work. A CUDA graph records one step's kernels once and replays them with
one launch. A graph fixes shapes and addresses, so the step is made static, as vLLM's and
SGLang's graph runners do:

- the batch is padded up to a bucket (1, 2, 4, ... 64 rows); a pad row feeds code 0 at position
  0 and attends only to its own new column, so it computes finite values nobody reads;
- the KV cache lives in one zero-filled storage per layer, (largest bucket, H, capacity, D); the
  batch's buffers are views of it (copied in after a merge, which re-packs elsewhere); the step
  writes each row's column at the row's position, held in a device tensor;
- attention reads all ``capacity`` columns under a (bucket, 1, 1, capacity) mask that is True
  only on each row's real columns and the new one; so the storage must never hold a NaN (a
  masked NaN still poisons the product), hence zeros and pad rows that attend to something;
- the inputs (codes, positions = write columns, mask) are static tensors filled before a replay;
  the hidden states come out in the graph's own tensor, read before the next replay.

Sampling stays outside the graph (one batched pass, ``sampling.py``). A step runs eagerly
when no graph can serve it (batch above the largest bucket, KV longer than the capacity, capture
failed), with one log line per cause. ``capture=False`` runs the same padded static step without
graphs, which is how it is tested on CPU.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .batch import NUM_VQ, BatchState, code_embeddings

log = logging.getLogger(__name__)

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
WARMUP_STEPS = 2  # eager runs before a capture (lazy workspaces and kernel choices happen outside the graph)


def buckets_for(max_rows: int) -> tuple[int, ...]:
    """The buckets a batch of up to ``max_rows`` rows may need."""
    top = next((b for b in BUCKETS if b >= max_rows), BUCKETS[-1])
    return tuple(b for b in BUCKETS if b <= top)


class StaticLayer(DynamicLayer):
    """A KV cache layer over a static storage view (b, H, capacity, D): writes each row's column
    at its position in ``pos`` (a device tensor, so a replay can move it) and gives attention
    every column (the mask hides what is not real)."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, pos: torch.Tensor):
        super().__init__()
        self.lazy_initialization(kbuf, vbuf)
        self.kbuf, self.vbuf, self.pos = kbuf, vbuf, pos
        self.rows = torch.arange(kbuf.shape[0], device=kbuf.device)
        self.keys, self.values = kbuf, vbuf

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        self.kbuf[self.rows, :, self.pos] = key_states[:, :, 0]
        self.vbuf[self.rows, :, self.pos] = value_states[:, :, 0]
        return self.kbuf, self.vbuf

    def get_seq_length(self) -> int:
        return self.kbuf.shape[2]


class GraphRunner:
    """The padded static decode step over static buffers, replayed from CUDA graphs."""

    def __init__(self, gpt: Any, embed: Any, buckets: tuple[int, ...], kv_tokens: int, capture: bool = True):
        self.gpt, self.embed = gpt, embed
        param = next(gpt.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.buckets = tuple(sorted(buckets))
        self.capacity = kv_tokens
        self.capture = capture
        self.disabled: Optional[str] = None  # set when capture failed: eager from then on
        self.graphs: dict[int, Any] = {}  # bucket -> torch.cuda.CUDAGraph
        self.outputs: dict[int, torch.Tensor] = {}  # bucket -> its graph's hidden states (b, hidden)
        self._said: set[str] = set()
        self.copies_in = 0  # KV copies into the static storage (after each merge: new buffers)
        self._k: list[torch.Tensor] = []  # per layer (rows, H, capacity, D), allocated on first use
        self._v: list[torch.Tensor] = []

    def _say_once(self, kind: str, message: str) -> None:
        if kind not in self._said:
            self._said.add(kind)
            log.warning("CUDA graphs: %s; this step (and any like it) runs eagerly", message)

    # ------------------------------------------------------------------ eligibility

    def fits(self, batch: BatchState) -> bool:
        """Can this step of the batch run static? (Says once per cause why not.)"""
        if self.disabled is not None:
            return False
        rows, t = len(batch.rows), batch.width
        if rows > self.buckets[-1]:
            self._say_once("rows", f"a batch of {rows} rows is above the largest bucket ({self.buckets[-1]})")
            return False
        if t + 1 > self.capacity:
            self._say_once(
                "kv",
                f"KV length {t + 1} is above the capacity ({self.capacity} tokens, "
                "AcousticConfig.cuda_graph_kv_tokens)",
            )
            return False
        return True

    # ------------------------------------------------------------------ the step

    def step(self, batch: BatchState, last: torch.Tensor) -> torch.Tensor:
        """One decode step of ``batch`` (``fits`` said yes) for input codes ``last`` (B, 4):
        the new hidden states (B, hidden), the batch advanced by one column."""
        if not self._k:
            self._allocate(batch)
        rows = len(batch.rows)
        bucket = next(b for b in self.buckets if b >= rows)
        self._place(batch)
        batch.open_step()
        self._fill(batch.pos, last)
        out = self._run(bucket)[:rows]
        batch.close_step(batch.kbuf, batch.vbuf)
        return out

    def _allocate(self, batch: BatchState) -> None:
        _, heads, _, dim = batch.keys[0].shape
        shape = (self.buckets[-1], heads, self.capacity, dim)
        for _ in range(batch.num_layers):
            # Zeros: attention reads masked columns too, they must be finite.
            self._k.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
            self._v.append(torch.zeros(shape, dtype=self.dtype, device=self.device))
        n = self.buckets[-1]
        self._tokens = torch.zeros(n, NUM_VQ, dtype=torch.long, device=self.device)
        self._pos = torch.zeros(n, 1, dtype=torch.long, device=self.device)
        self._mask = torch.zeros(n, 1, 1, self.capacity, dtype=torch.bool, device=self.device)
        self._columns = torch.arange(self.capacity, device=self.device)

    def _place(self, batch: BatchState) -> None:
        """Make the batch's KV buffers views of the static storage (rows left-aligned from column
        0, as in the batch's own buffers): after a merge (new buffers), copy them in."""
        k0 = batch.kbuf[0]
        if k0.untyped_storage().data_ptr() == self._k[0].untyped_storage().data_ptr():
            return
        rows, t = len(batch.rows), batch.width
        self.copies_in += 1
        for src, dst in zip((*batch.kbuf, *batch.vbuf), (*self._k, *self._v)):
            dst[:rows, :, :t].copy_(src[:, :, :t])
            dst[:rows, :, t:].zero_()  # a row's later columns: finite, and its own once written
        batch.set_kv([k[:rows] for k in self._k], [v[:rows] for v in self._v], t)

    def _fill(self, pos: torch.Tensor, last: torch.Tensor) -> None:
        """The static inputs of every row up to the largest bucket (so that whichever graph runs,
        and every warm-up, computes finite values only)."""
        rows = pos.shape[0]
        m = self._mask[:, 0, 0]
        m[:rows] = self._columns <= pos.unsqueeze(1)  # each row's real columns and its new one
        m[rows:] = self._columns == 0  # a pad row writes and attends to column 0 of its own storage row
        self._pos[:rows, 0] = pos
        self._pos[rows:] = 0
        self._tokens[:rows] = last
        self._tokens[rows:] = 0

    def _forward(self, bucket: int) -> torch.Tensor:
        """The step over the static buffers' first ``bucket`` rows: what a graph records."""
        emb = code_embeddings(self.embed, self._tokens[:bucket])
        cache = DynamicCache(config=self.gpt.config)
        pos = self._pos[:bucket, 0]
        cache.layers = [StaticLayer(k[:bucket], v[:bucket], pos) for k, v in zip(self._k, self._v)]
        out = self.gpt(
            inputs_embeds=emb.unsqueeze(1).to(self.dtype),
            attention_mask=self._mask[:bucket],
            position_ids=self._pos[:bucket],
            cache=cache,
            use_cache=True,
        )
        return out.last_hidden_state[:, -1]

    def _run(self, bucket: int) -> torch.Tensor:
        if not self.capture or self.disabled is not None:
            return self._forward(bucket)
        if not self.graphs:
            try:
                self._capture_all()
            except Exception as exc:  # noqa: BLE001 - graphs are an optimisation: decode eagerly
                self.graphs.clear()
                self.outputs.clear()
                self.disabled = f"capture failed ({exc.__class__.__name__}: {exc})"
                self._say_once("capture", self.disabled)
                return self._forward(bucket)
        self.graphs[bucket].replay()
        return self.outputs[bucket]

    def _capture_all(self) -> None:
        """Record every bucket's step, largest first so the smaller ones fit in its memory pool.

        Runs at the first static step, over its real inputs (already in the static buffers): a
        warm-up or capture of any bucket rewrites only the column this step writes anyway, and
        the replay that follows writes it again."""
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for bucket in reversed(self.buckets):
                for _ in range(WARMUP_STEPS):
                    self._forward(bucket)
        torch.cuda.current_stream(self.device).wait_stream(side)
        pool = None
        for bucket in reversed(self.buckets):
            graph = torch.cuda.CUDAGraph()
            # thread_local: another thread's CUDA work (a vocoder on the same GPU) may go on.
            with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
                out = self._forward(bucket)
            pool = graph.pool()
            self.graphs[bucket], self.outputs[bucket] = graph, out
        torch.cuda.synchronize(self.device)
        log.info("CUDA graphs captured for batch buckets %s (KV capacity %d tokens)", self.buckets, self.capacity)
