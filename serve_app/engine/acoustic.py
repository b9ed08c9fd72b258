"""The acoustic engine: ChatTTS's GPT decoded as one running batch with per-row state.

The loop owns a batch of rows (one row = one text segment). Between two decode steps it
admits waiting rows (each is prefilled alone, then its KV cache is left-padded and merged into
the batch: TGI's ``concatenate``) and drops finished or cancelled rows (their KV columns go with
them: TGI's ``filter``). Every row keeps its own position ids, sampling parameters, seed
(a private ``torch.Generator`` drawn once per step, so its tokens do not depend on its
neighbours), token budget and chunk schedule. Each row streams chunks of GPT hidden states,
which is what ChatTTS's decoder turns into mel frames.

``continuous=False`` turns this into window batching (a batch runs to its end before the next
one is admitted), kept for the benchmark comparison.

It uses ChatTTS's own modules: the tokenizer and speaker prompt format, ``Embed`` (code
embeddings and heads), the ``LlamaModel`` and ``gen_logits`` (repetition penalty, top-p, top-k).
No Ray, no HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Iterator, Optional

import torch
import torch.nn.functional as F
import torch.nn.utils.parametrize as P

from .config import AcousticConfig
from .threads import apply_torch_threads
from .weights import LoadedModel

log = logging.getLogger(__name__)

NUM_VQ = 4
REPETITION_WINDOW = 16  # ChatTTS's past_window for its repetition penalty
AGING_SECONDS = 2.0  # waiting this long raises a row's priority by one level (no starvation)
KV_HEADROOM = 64  # free KV columns allocated ahead: steps write in place, one re-allocation per 64


class EngineError(RuntimeError):
    """A request failed inside the engine (its stream ends with this error)."""


class EngineOverloaded(EngineError):
    """The admission queue is full."""


@dataclass
class SegmentRequest:
    """One segment to decode. Text is already normalised; prompt carries control tags."""

    text: str
    spk_emb: Optional[str]
    seed: int
    max_new_tokens: int  # hard cap, real or random weights
    min_new_tokens: int = 1  # end-of-speech is masked before this many tokens
    target_tokens: Optional[int] = None  # random weights: the segment's length (see pacing.py)
    prompt: str = "[speed_5]"
    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    priority: int = 0  # higher first
    first_chunk_tokens: Optional[int] = None
    chunk_tokens: Optional[int] = None


@dataclass
class HiddenChunk:
    """Hidden states of consecutive tokens of one row, ``hidden`` is (n, 768) float32 on CPU."""

    hidden: torch.Tensor
    index: int  # chunk number in the row
    start_token: int  # index of the first token of this chunk in the row
    final: bool = False
    finish_reason: Optional[str] = None  # "stop" | "length" on the final chunk (a cancelled row just ends)


_END = object()


class RowStream:
    """The consumer side of one row: iterate chunks (sync or async), or cancel it.

    The engine thread puts items; a sync consumer blocks on a ``queue.Queue``, an async one
    awaits an ``asyncio.Queue`` fed through ``call_soon_threadsafe`` (never blocking its loop).
    """

    def __init__(self, row_id: int, loop: Optional[asyncio.AbstractEventLoop]):
        self.row_id = row_id
        self._loop = loop
        self._q: Any = asyncio.Queue() if loop is not None else queue.Queue()
        self.cancelled = threading.Event()
        self.submitted_at = time.monotonic()
        self.admitted_at: Optional[float] = None  # joined the running batch (queue time ends)
        self.first_chunk_at: Optional[float] = None
        self.finished_at: Optional[float] = None
        self.ended = False  # its last item (end or error) was put

    @property
    def started(self) -> bool:
        """Has sent its first chunk, or will never send one (ended, cancelled)."""
        return self.first_chunk_at is not None or self.ended or self.cancelled.is_set()

    def _put(self, item: Any) -> None:
        if item is _END or isinstance(item, BaseException):
            self.ended = True
        if self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._q.put_nowait, item)
            except RuntimeError:  # the consumer's loop is closed: nobody is listening
                self.cancelled.set()
        else:
            self._q.put(item)

    def cancel(self) -> None:
        """Stop decoding this row at the next step and free its slot."""
        self.cancelled.set()

    def poll(self) -> list[HiddenChunk]:
        """The chunks ready now, without waiting (sync streams; for a caller that drives the
        engine with ``step()`` on its own thread). Raises the row's error, if any."""
        if self._loop is not None:
            raise TypeError("this stream was opened for async iteration")
        out = []
        while not self._q.empty():
            item = self._q.get_nowait()
            if isinstance(item, BaseException):
                raise item
            if item is not _END:
                out.append(item)
        return out

    def __iter__(self) -> Iterator[HiddenChunk]:
        if self._loop is not None:
            raise TypeError("this stream was opened for async iteration")
        while True:
            item = self._q.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    async def __aiter__(self) -> AsyncIterator[HiddenChunk]:
        if self._loop is None:
            raise TypeError("this stream was opened for sync iteration")
        try:
            while True:
                item = await self._q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            # The consumer stopped early (finished, error or cancelled): free the row.
            self.cancelled.set()


@dataclass
class _Row:
    req: SegmentRequest
    stream: RowStream
    generator: torch.Generator
    prompt_len: int = 0
    n_generated: int = 0  # tokens sampled so far (incl. the one waiting to be fed)
    history: list = field(default_factory=list)  # last tokens (4,) for the repetition penalty
    pending: list = field(default_factory=list)  # hidden states not yet sent
    chunks_sent: int = 0
    tokens_sent: int = 0
    last_token: Optional[torch.Tensor] = None  # (4,) long: input of the next step
    finish_reason: Optional[str] = None
    after: Optional[RowStream] = None  # admitted only once this stream has started

    @property
    def budget(self) -> int:
        return self.prompt_len + self.req.max_new_tokens

    def chunk_size(self, cfg: AcousticConfig) -> int:
        if self.chunks_sent == 0:
            return self.req.first_chunk_tokens or cfg.first_chunk_tokens
        return self.req.chunk_tokens or cfg.chunk_tokens


@dataclass(order=True)
class _Waiting:
    sort_key: tuple
    seq: int
    row: Any = field(compare=False)


@dataclass
class EngineStats:
    steps: int = 0  # decode steps (one forward of the running batch)
    row_steps: int = 0  # sum over steps of rows in the batch
    admissions: int = 0  # times one or more rows joined the batch
    rows_admitted: int = 0
    rows_finished: int = 0
    rows_cancelled: int = 0
    rows_failed: int = 0
    max_rows: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def mean_rows(self) -> float:
        return self.row_steps / self.steps if self.steps else 0.0


class AcousticEngine:
    """Owns the model's GPT and one running batch. Thread-safe ``submit``; one decode thread."""

    def __init__(self, model: LoadedModel, config: AcousticConfig = AcousticConfig()):
        self.model = model
        self.cfg = config
        chat = model.chat
        self.chat = chat
        self.gpt = chat.gpt.gpt  # transformers LlamaModel
        self.embed = chat.embed  # ChatTTS Embed: emb_code and head_code
        self.device = model.device
        self.gpt_device = chat.device_gpt
        self.gpt_dtype = next(self.gpt.parameters()).dtype
        self.eos = chat.config.gpt.num_audio_tokens - 1
        self.num_layers = self.gpt.config.num_hidden_layers
        self.stats = EngineStats()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._waiting: list[_Waiting] = []
        self._seq = itertools.count()
        self._rows: list[_Row] = []
        # Per layer: (B, H, capacity, D) buffers, and (B, H, T, D) views of their filled part.
        self._kbuf: list[torch.Tensor] = []
        self._vbuf: list[torch.Tensor] = []
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._mask: Optional[torch.Tensor] = None  # (B, T) bool, True = real token
        self._pos: Optional[torch.Tensor] = None  # (B,) next position id per row
        self._thread: Optional[threading.Thread] = None
        self.torch_threads = model.torch_threads  # the decode thread applies it to itself
        self._stop = False
        self._warpers: dict[tuple, tuple] = {}
        # Called after every decode step with the number of rows decoded (metrics hook).
        self.on_step: Optional[Callable[[int], None]] = None

    # ------------------------------------------------------------------ public API

    def submit(self, req: SegmentRequest, loop: Optional[asyncio.AbstractEventLoop] = None,
               after: Optional[RowStream] = None) -> RowStream:
        """Queue a segment; chunks arrive on the returned stream. Pass ``loop`` to iterate async.

        ``after``: wait for that stream's first chunk before joining the batch (see ``submit_all``)."""
        if self.model.is_random and req.target_tokens:
            # Random weights never say end-of-speech: stop at the text's expected length.
            n = min(req.target_tokens, req.max_new_tokens)
            req = dataclasses.replace(req, min_new_tokens=n, max_new_tokens=n)
        stream = RowStream(next(self._seq), loop)
        gen = torch.Generator(device="cpu").manual_seed(int(req.seed))
        row = _Row(req=req, stream=stream, generator=gen, after=after)
        with self._wake:
            if len(self._waiting) >= self.cfg.max_queued_rows:
                raise EngineOverloaded(f"acoustic queue full ({self.cfg.max_queued_rows} rows waiting)")
            # Higher priority first, then arrival order; aging is applied at admission.
            heapq.heappush(self._waiting, _Waiting((-req.priority, stream.submitted_at), stream.row_id, row))
            self._wake.notify()
        return stream

    def submit_all(self, reqs: list[SegmentRequest], loop: Optional[asyncio.AbstractEventLoop] = None) -> list[RowStream]:
        """Queue one request's segments: the first joins at once, the others once it has sent its
        first chunk. They still decode in parallel, but the first audio does not wait for the
        other segments' prefills (each ~0.2 s of CPU here) and the steps they would slow down."""
        streams: list[RowStream] = []
        try:
            for req in reqs:
                streams.append(self.submit(req, loop=loop, after=streams[0] if streams else None))
        except EngineOverloaded:
            for st in streams:  # all or nothing: no orphan rows decoding for nobody
                st.cancel()
            raise
        return streams

    def start(self) -> None:
        """Run the decode loop on a daemon thread: it should hold the process's only
        multi-threaded OpenMP team (``threads.py``)."""
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._run, name="acoustic-decode", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def reconfigure(self, **changes: Any) -> None:
        """Change decode knobs at runtime (validated); applies from the next step."""
        with self._lock:
            self.cfg = AcousticConfig.model_validate({**self.cfg.model_dump(), **changes})

    @property
    def running_rows(self) -> int:
        return len(self._rows)

    @property
    def waiting_rows(self) -> int:
        return len(self._waiting)

    def run_until_idle(self) -> None:
        """Drive the loop on the calling thread until no row is running or waiting (tests, CLI)."""
        while self.step():
            pass

    def step(self) -> bool:
        """Admit, run one decode step, retire finished rows. Returns False when idle."""
        self._admit()
        if not self._rows:
            return bool(self._waiting)
        try:
            self._decode_step()
        except Exception as exc:  # noqa: BLE001 - a failed step fails this batch, not the loop
            log.exception("decode step failed; failing %d rows", len(self._rows))
            for row in self._rows:
                self.stats.rows_failed += 1
                row.stream._put(EngineError(f"decode failed: {exc.__class__.__name__}"))
            self._reset_batch()
        return True

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        # Apply the thread count on this thread too (OpenMP/MKL settings are per thread): steps
        # ran 15-25% slower on a thread that never set it (2 OpenMP threads, measured in-process).
        apply_torch_threads(self.torch_threads)
        while True:
            with self._wake:
                while not self._stop and not self._rows and not self._waiting:
                    self._wake.wait()
                if self._stop:
                    break
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one batch
                log.exception("acoustic step failed; failing %d running rows", len(self._rows))
                for row in self._rows:
                    if row.finish_reason is None:
                        self._fail(row, f"decode failed: {exc.__class__.__name__}")
                self._reset_batch()
        for row in self._rows:
            row.stream._put(EngineError("engine stopped"))
        self._reset_batch()
        # Rows still waiting for a slot would otherwise leave their consumers blocked forever.
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for w in waiting:
            w.row.stream._put(EngineError("engine stopped"))

    def _pop_admissible(self) -> list[_Row]:
        """Rows to admit now: by (aged) priority, within max_rows and the token budget."""
        with self._lock:
            if not self._waiting:
                return []
            if not self.cfg.continuous and self._rows:
                return []  # window batching: the running batch finishes first
            now = time.monotonic()
            # Re-key by aged priority: waiting AGING_SECONDS counts as one priority level more.
            entries = sorted(
                self._waiting,
                key=lambda w: (-(w.row.req.priority + (now - w.row.stream.submitted_at) / AGING_SECONDS), w.seq),
            )
            free = self.cfg.max_rows - len(self._rows)
            used = sum(r.budget for r in self._rows)
            taken: list[_Waiting] = []
            for w in entries:
                if len(taken) >= free:
                    break
                if w.row.stream.cancelled.is_set():
                    taken.append(w)  # drop it below without decoding
                    continue
                if self.cfg.continuous and w.row.after is not None and not w.row.after.started:
                    continue  # a later segment: its request's first segment has no audio out yet
                need = self._prompt_len_estimate(w.row) + w.row.req.max_new_tokens
                if used + need > self.cfg.token_budget and (self._rows or taken):
                    break  # keep order: do not let small rows overtake a big one forever
                used += need
                taken.append(w)
            ids = {w.seq for w in taken}
            self._waiting = [w for w in self._waiting if w.seq not in ids]
            heapq.heapify(self._waiting)
        out = []
        for w in taken:
            if w.row.stream.cancelled.is_set():
                self.stats.rows_cancelled += 1
                w.row.stream._put(_END)
            else:
                out.append(w.row)
        return out

    @staticmethod
    def _prompt_len_estimate(row: _Row) -> int:
        return len(row.req.text) + len(row.req.prompt) + 8

    # ------------------------------------------------------------------ admission (prefill + merge)

    @torch.inference_mode()
    def _admit(self) -> None:
        new_rows = self._pop_admissible()
        if not new_rows:
            return
        t0 = time.perf_counter()
        prefilled = []
        for row in new_rows:
            try:
                prefilled.append((row, *self._prefill(row)))
            except Exception as exc:  # noqa: BLE001 - a bad row fails alone
                log.warning("prefill failed: %s", exc)
                self.stats.rows_failed += 1
                row.stream._put(EngineError(f"prefill failed: {exc}"))
        if prefilled:
            self._merge(prefilled)  # all of them in one copy of the batch's KV
            self.stats.admissions += 1
        for row, _keys, _values, hidden in prefilled:
            row.stream.admitted_at = time.monotonic()
            self.stats.rows_admitted += 1
            # The prefill's last hidden state yields the row's first token.
            self._sample_and_advance([row], hidden)
        self.stats.prefill_seconds += time.perf_counter() - t0
        self._retire()

    def _prefill(self, row: _Row) -> tuple[list, list, torch.Tensor]:
        chat = self.chat
        text = chat.speaker.decorate_code_prompts([row.req.text], row.req.prompt, None, row.req.spk_emb)
        input_ids, _attn, text_mask = chat.tokenizer.encode(text, NUM_VQ, device=self.gpt_device)
        emb = self.embed(input_ids, text_mask)
        if row.req.spk_emb is not None:
            chat.speaker.apply(emb, row.req.spk_emb, input_ids, chat.tokenizer.spk_emb_ids, self.gpt_device)
        row.prompt_len = int(input_ids.shape[1])
        from transformers import DynamicCache

        cache = DynamicCache(config=self.gpt.config)
        out = self.gpt(
            inputs_embeds=emb.to(self.gpt_device, self.gpt_dtype),
            position_ids=torch.arange(row.prompt_len, device=self.gpt_device).unsqueeze(0),
            cache=cache,
            use_cache=True,
        )
        hidden = out.last_hidden_state[:, -1].to(self.device, torch.float32)
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        return keys, values, hidden

    def _merge(self, prefilled: list[tuple]) -> None:
        """Append prefilled rows ``(row, keys, values, hidden)`` to the batch: every row's KV
        right-aligned (left padding) in new buffers, the running rows' copied once."""
        lengths = [keys[0].shape[2] for _row, keys, _values, _hidden in prefilled]
        t_run = self._mask.shape[1] if self._rows else 0
        t = max([t_run, *lengths])
        b_run = len(self._rows)
        for name, new_kv in (("_keys", 1), ("_values", 2)):
            running = getattr(self, name)
            bufs = []
            for layer in range(self.num_layers):
                sources = [running[layer][i] for i in range(b_run)] + [p[new_kv][layer][0] for p in prefilled]
                bufs.append(_pack_rows(sources, t))
            self._set_kv(name, bufs, t)
        new_mask = [torch.ones(1, n, dtype=torch.bool, device=self.gpt_device) for n in lengths]
        masks = ([self._mask] if self._rows else []) + new_mask
        self._mask = torch.cat([_pad_left(m, t, dim=1) for m in masks], 0)
        new_pos = torch.tensor(lengths, dtype=torch.long, device=self.gpt_device)
        self._pos = torch.cat([self._pos, new_pos]) if self._rows else new_pos
        self._rows.extend(p[0] for p in prefilled)

    def _set_kv(self, name: str, bufs: list[torch.Tensor], t: int) -> None:
        """Install per-layer buffers for keys or values and their filled views (T = t)."""
        setattr(self, "_kbuf" if name == "_keys" else "_vbuf", bufs)
        setattr(self, name, [b[:, :, :t] for b in bufs])

    # ------------------------------------------------------------------ decode

    @torch.inference_mode()
    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        rows = self._rows
        last = torch.stack([r.last_token for r in rows]).to(self.gpt_device)  # (B, 4)
        emb = torch.stack([self.embed.emb_code[q](last[:, q]) for q in range(NUM_VQ)], 2).sum(2)
        self._mask = torch.cat([self._mask, self._mask.new_ones(len(rows), 1)], 1)
        from transformers import DynamicCache

        cache = DynamicCache(config=self.gpt.config)
        t = self._keys[0].shape[2]
        cache.layers = [_BufferedLayer(self._kbuf[i], self._vbuf[i], t) for i in range(self.num_layers)]
        out = self.gpt(
            inputs_embeds=emb.unsqueeze(1).to(self.gpt_dtype),
            attention_mask=self._mask[:, None, None, :],
            position_ids=self._pos.unsqueeze(1),
            cache=cache,
            use_cache=True,
        )
        self._kbuf = [layer.kbuf for layer in cache.layers]
        self._vbuf = [layer.vbuf for layer in cache.layers]
        self._keys = [layer.keys for layer in cache.layers]
        self._values = [layer.values for layer in cache.layers]
        self._pos = self._pos + 1
        hidden = out.last_hidden_state[:, -1].to(self.device, torch.float32)
        self.stats.steps += 1
        self.stats.row_steps += len(rows)
        self.stats.max_rows = max(self.stats.max_rows, len(rows))
        # Each row's input token of this step produced `hidden`: it belongs to that token.
        self._sample_and_advance(rows, hidden)
        self._retire()
        self.stats.decode_seconds += time.perf_counter() - t0
        if self.on_step is not None:
            self.on_step(len(rows))

    def _logits_warpers(self, top_p: float, top_k: int, penalty: float) -> tuple:
        key = (top_p, top_k, penalty)
        if key not in self._warpers:
            from ChatTTS.model import gen_logits

            self._warpers[key] = gen_logits(num_code=self.eos, top_P=top_p, top_K=top_k, repetition_penalty=penalty)
        return self._warpers[key]

    def _sample_and_advance(self, rows: list[_Row], hidden: torch.Tensor) -> None:
        """Sample each row's next token from ``hidden`` (B, 768); record hidden for the row.

        ChatTTS keeps the hidden state that produced token i as frame i, and drops the one that
        produced end-of-speech. Rows are sampled with their own parameters and generator.
        """
        with P.cached():
            logits = torch.stack([self.embed.head_code[q](hidden) for q in range(NUM_VQ)], 1)  # (B, 4, V)
        logits = logits.float()
        live: list[tuple[int, _Row]] = []
        probs_rows = []
        for b, row in enumerate(rows):
            if row.stream.cancelled.is_set():
                row.finish_reason = "cancelled"
                continue
            lg = logits[b] / row.req.temperature  # (4, V)
            warpers, processors = self._logits_warpers(row.req.top_p, row.req.top_k, row.req.repetition_penalty)
            if row.history:
                hist = torch.stack(row.history[-REPETITION_WINDOW:], 1).to(lg.device)  # (4, n)
                for proc in processors:
                    lg = proc(hist, lg)
            for warp in warpers:
                lg = warp(None, lg)
            if row.n_generated < row.req.min_new_tokens:
                lg[:, self.eos] = -torch.inf
            probs_rows.append(F.softmax(lg, dim=-1))
            live.append((b, row))
        if not live:
            return
        # One device->host copy for the whole batch; sampling runs on CPU per-row generators.
        probs = torch.stack(probs_rows).cpu()
        hidden_cpu = hidden.detach().to("cpu", torch.float32)
        for (b, row), p in zip(live, probs):
            if not bool(torch.isfinite(p).all()):
                # Degenerate sampling parameters or numerics: this row fails, the batch goes on.
                self._fail(row, "sampling produced invalid probabilities")
                continue
            token = torch.multinomial(p, 1, generator=row.generator).squeeze(1)  # (4,)
            row.n_generated += 1
            if bool(token.eq(self.eos).any()):
                row.finish_reason = "stop"
                continue
            row.pending.append(hidden_cpu[b])
            row.history.append(token)
            if len(row.history) > REPETITION_WINDOW:
                del row.history[0]
            row.last_token = token
            if row.n_generated >= row.req.max_new_tokens:
                row.finish_reason = "length"
            elif len(row.pending) >= row.chunk_size(self.cfg):
                self._emit(row, final=False)

    def _fail(self, row: _Row, reason: str) -> None:
        row.finish_reason = "error"
        self.stats.rows_failed += 1
        row.stream._put(EngineError(reason))

    def _emit(self, row: _Row, final: bool) -> None:
        if not row.pending and not final:
            return
        hidden = torch.stack(row.pending) if row.pending else torch.zeros(0, self.gpt.config.hidden_size)
        chunk = HiddenChunk(
            hidden=hidden,
            index=row.chunks_sent,
            start_token=row.tokens_sent,
            final=final,
            finish_reason=row.finish_reason if final else None,
        )
        row.tokens_sent += len(row.pending)
        row.pending = []
        row.chunks_sent += 1
        if row.stream.first_chunk_at is None:
            row.stream.first_chunk_at = time.monotonic()
        row.stream._put(chunk)
        if final:
            row.stream.finished_at = time.monotonic()
            row.stream._put(_END)

    def _retire(self) -> None:
        """Drop finished/cancelled rows from the batch (and their KV), trim all-padding columns."""
        keep = []
        for i, row in enumerate(self._rows):
            if row.finish_reason is None and row.stream.cancelled.is_set():
                row.finish_reason = "cancelled"
            if row.finish_reason is None:
                keep.append(i)
                continue
            if row.finish_reason == "cancelled":
                self.stats.rows_cancelled += 1
                row.stream._put(_END)
            elif row.finish_reason == "error":
                pass  # its stream already ended with the error
            else:
                self.stats.rows_finished += 1
                self._emit(row, final=True)
        if len(keep) == len(self._rows):
            return
        if not keep:
            self._reset_batch()
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
        idx = torch.tensor(order, dtype=torch.long, device=self.gpt_device)
        self._rows = [self._rows[i] for i in order]
        self._mask = self._mask.index_select(0, idx)
        self._pos = self._pos.index_select(0, idx)
        # Columns where every remaining row is padding carry nothing: cut them (views; the freed
        # rows and columns go back when the buffers are next re-allocated).
        first = int(self._mask.any(0).nonzero()[0])
        self._mask = self._mask[:, first:]
        end = self._keys[0].shape[2]
        if holes:
            dst = torch.tensor(holes, dtype=torch.long, device=self.gpt_device)
            src = torch.tensor(movers, dtype=torch.long, device=self.gpt_device)
            for buf in (*self._kbuf, *self._vbuf):
                buf[dst, :, first:end] = buf[src, :, first:end]
        self._set_kv("_keys", [b[:n, :, first:] for b in self._kbuf], end - first)
        self._set_kv("_values", [b[:n, :, first:] for b in self._vbuf], end - first)

    def _reset_batch(self) -> None:
        self._rows, self._keys, self._values, self._kbuf, self._vbuf = [], [], [], [], []
        self._mask = self._pos = None


def _pack_rows(rows: list[torch.Tensor], t: int) -> torch.Tensor:
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


def _with_headroom(x: torch.Tensor) -> torch.Tensor:
    """A (B, H, T + KV_HEADROOM, D) buffer whose first T columns are ``x``."""
    b, h, t, d = x.shape
    buf = x.new_empty(b, h, t + KV_HEADROOM, d)
    buf[:, :, :t] = x
    return buf


_buffered_layer_cls = None


def _BufferedLayer(kbuf: torch.Tensor, vbuf: torch.Tensor, n: int):
    """A KV cache layer over preallocated buffers (the class is built on first use: transformers
    is imported lazily, like everywhere in the engine)."""
    global _buffered_layer_cls
    if _buffered_layer_cls is None:
        from transformers.cache_utils import DynamicLayer

        class BufferedLayer(DynamicLayer):
            """A decode step writes its KV column in place and attention reads a view of the
            filled part, where ``DynamicLayer`` copies the whole cache with ``torch.cat`` every
            step (28% of a batch-8 step on this CPU)."""

            def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, n: int):
                super().__init__()
                self.lazy_initialization(kbuf, vbuf)
                self.kbuf, self.vbuf, self.n = kbuf, vbuf, n
                self.keys, self.values = kbuf[:, :, :n], vbuf[:, :, :n]

            def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
                end = self.n + key_states.shape[2]
                if end > self.kbuf.shape[2]:
                    self.kbuf = _with_headroom(self.kbuf[:, :, : self.n])
                    self.vbuf = _with_headroom(self.vbuf[:, :, : self.n])
                self.kbuf[:, :, self.n : end] = key_states
                self.vbuf[:, :, self.n : end] = value_states
                self.n = end
                self.keys, self.values = self.kbuf[:, :, :end], self.vbuf[:, :, :end]
                return self.keys, self.values

            def get_seq_length(self) -> int:
                return self.n

        _buffered_layer_cls = BufferedLayer
    return _buffered_layer_cls(kbuf, vbuf, n)


def _pad_left(x: torch.Tensor, length: int, dim: int = 2) -> torch.Tensor:
    n = x.shape[dim]
    if n == length:
        return x
    shape = list(x.shape)
    shape[dim] = length - n
    return torch.cat([x.new_zeros(shape), x], dim)
