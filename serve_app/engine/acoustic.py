"""The acoustic engine: ChatTTS's GPT decoded as one running batch with per-row state.

The loop owns a batch of rows (one row = one text segment). Between two decode steps it admits
waiting rows (each is prefilled alone, then its KV joins the batch's buffers: TGI's
``concatenate``) and drops finished or cancelled rows (their KV goes with them: TGI's
``filter``). Every row keeps its own position ids, sampling parameters, seed (a private
``torch.Generator`` drawn once per step, so its tokens do not depend on its neighbours), token
budget and chunk schedule. Each row streams chunks of GPT hidden states, which is what
ChatTTS's decoder turns into mel frames. The parts live in ``decode/`` (``Scheduler``, ``decide``
(the deadline rule), ``Playback``, ``StepModel``, ``Prefiller``, ``BatchState``, ``Sampler``,
``RowStream``, ``ParkedRows``, ``EngineStats``, with ``cuda_graphs`` ``GraphRunner``). This module
runs them: the loop, admission (``scheduling``: real-time streams least slack first, parking rows
far ahead of their listeners, within the capacity measured from the loop's own steps; or the fair
order between clients alone), the decode step, chunk emission, back-pressure, and the one failure
path (``_fail``). Every request gets a playback clock (``RowStream.playback``): its rows' slack,
and the stall its listener has heard, which ``realtime()`` reports with the replica's capacity.
``continuous=False`` turns this into window batching (a batch runs to its end before the next one
is admitted), kept for the benchmark comparison.

It uses ChatTTS's own modules: the tokenizer and speaker prompt format, ``Embed`` (code
embeddings and heads), the ``LlamaModel`` and ``gen_logits``. No Ray, no HTTP.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from .config import AcousticConfig
from .decode.batch import BatchState, Prefilled, code_embeddings
from .decode.capacity import StepModel
from .decode.cuda_graph import GraphRunner, buckets_for
from .decode.deadline import Capacity, decide
from .decode.forward import DecodeForward
from .decode.parking import ParkedRows, falling_behind, wakes_loop
from .decode.playback import Playback
from .decode.prefill import Prefiller
from .decode.row import Row
from .decode.sampling import Sampler
from .decode.scheduler import Scheduler
from .decode.stats import EngineStats
from .decode.streams import HiddenChunk, RowStream, StreamGroup
from .errors import CapacityExhausted, EngineError
from .pacing import TOKEN_SECONDS
from .threads import apply_torch_threads, on_new_thread
from .types import SegmentRequest
from .voices import SpeakerSampler
from .weights.loading import LoadedModel

# Re-exported for the benchmarks and older callers; the engine's own code imports each from its home.
__all__ = ["AcousticConfig", "AcousticEngine", "HiddenChunk", "RowStream", "SegmentRequest"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamClock:
    """One real-time stream as the engine sees it (``AcousticEngine.realtime``)."""

    row_id: int  # its first row's id
    client: str
    started: bool  # its first audio has left
    slack_s: float  # seconds before its listener hears silence (negative: in silence that long,
    # or, not started, waiting that long for first audio)
    stalled_s: float  # silence its listener has heard so far (inferred from what was sent when)
    segments: int
    segments_done: int


@dataclass(frozen=True)
class RealtimeStatus:
    """The replica's real-time capacity and demand (``AcousticEngine.realtime``), for admission,
    metrics and autoscaling. Capacity figures are None until the loop has measured a step."""

    capacity_streams: Optional[int]  # the most real-time rows each decoded at >= 1x, with headroom
    capacity_audio_s_per_s: Optional[float]  # audio seconds per second the batch makes at its current size
    step_s: Optional[float]  # expected decode step at the current size
    running_rows: int
    demand_streams: int  # real-time streams decoding or waiting (not finished)
    waiting_streams: int  # of them, those whose first audio has not left yet
    min_slack_s: Optional[float]  # the least slack of a started stream not finished
    stalled_streams: int  # started streams whose listener is in silence now
    streams: tuple[StreamClock, ...]


class AcousticEngine:
    """Owns the model's GPT and one running batch. Thread-safe ``submit``; one decode thread.

    ``clock``: the time the scheduler, the playback clocks and the step-time model read (tests and
    simulations inject one; durations of work, ``stats``, stay on the wall clock)."""

    def __init__(
        self, model: LoadedModel, config: AcousticConfig = AcousticConfig(), clock: Callable[[], float] = time.monotonic
    ):
        self.model = model
        self.cfg = config
        self._clock = clock
        chat = model.chat
        self.chat = chat
        self.gpt = chat.gpt.gpt  # transformers LlamaModel
        self.embed = chat.embed  # ChatTTS Embed: emb_code and head_code
        self.device = model.device
        self.gpt_device = chat.device_gpt
        self.gpt_dtype = next(self.gpt.parameters()).dtype
        self.eos = chat.config.gpt.num_audio_tokens - 1
        self.hidden_size = self.gpt.config.hidden_size
        self.stats = EngineStats()
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._seq = itertools.count()
        self.scheduler = Scheduler()  # guarded by _lock
        # Rows out of the batch while their consumers catch up, with their KV (decode thread only).
        self.parked = ParkedRows()
        # Rows the deadline rule set aside (far ahead of their listeners), with their KV (decode thread only).
        self.held = ParkedRows()
        # Decode step time against rows, measured online: the replica's real-time capacity.
        self.capacity = StepModel()
        self._playbacks: dict[int, Playback] = {}  # streams not ended, by their first row's id (under _lock)
        # Built on a thread that exits: their parallel ops (the heads' weight norm, dual-layout
        # copies) would leave a replica's long-lived init thread a second OpenMP team, and the
        # decode step's barriers would sleep on futexes: half the speed (threads.py).
        self.batch, self.prefill, self.sampler, self.decode_forward = on_new_thread(self._decode_parts)
        self.graphs: Optional[GraphRunner] = None  # decode steps from CUDA graphs (read at construction)
        if config.cuda_graphs and torch.device(self.gpt_device).type == "cuda":
            self.graphs = GraphRunner(self.gpt, self.embed, buckets_for(config.max_rows), config.cuda_graph_kv_tokens)
        elif config.cuda_graphs:
            log.warning("cuda_graphs: the GPT is on %s, not a CUDA device; decoding eagerly", self.gpt_device)
        self._thread: Optional[threading.Thread] = None
        self.torch_threads = model.torch_threads  # the decode thread applies it to itself
        self._stop = False
        self._stalled = False  # rows wait, none may join now (step() found nothing to admit)
        # Called after every decode step with the number of rows decoded (metrics hook).
        self.on_step: Optional[Callable[[int], None]] = None
        # The decode pace a row's tokens come at (seconds per step, smoothed), with the time
        # between steps (admissions, prefills) counted while rows wait through it: what
        # Row.chunk_ready weighs against a listener's audio running out.
        self.pace_s: Optional[float] = None
        self._busy_since_step: Optional[float] = None
        self.speakers = SpeakerSampler(model.chat.speaker)

    def _decode_parts(self) -> tuple[BatchState, Prefiller, Sampler, Optional[DecodeForward]]:
        # The forward without transformers' plumbing (decode/forward.py) where the GPT is the plain Llama it writes out.
        forward = DecodeForward(self.gpt, self.embed) if DecodeForward.supports(self.gpt) else None
        prefill = Prefiller(self.chat, self.gpt, self.embed, self.device, self.gpt_device, self.gpt_dtype)
        return BatchState(self.gpt.config, self.gpt_device), prefill, Sampler(self.embed, self.eos), forward

    # ------------------------------------------------------------------ public API

    def submit(
        self, req: SegmentRequest, loop: Optional[asyncio.AbstractEventLoop] = None, after: Optional[RowStream] = None
    ) -> RowStream:
        """Queue a segment; chunks arrive on the returned stream. Pass ``loop`` to iterate async.

        ``after``: wait for that stream's first chunk before joining the batch (see ``submit_all``)."""
        row = self._row(req, loop, after)
        self._playback([row])
        self._push([row])
        return row.stream

    def submit_all(
        self, reqs: list[SegmentRequest], loop: Optional[asyncio.AbstractEventLoop] = None
    ) -> list[RowStream]:
        """Queue one request's segments: the first joins at once, the others once it has sent its
        first chunk. They still decode in parallel, but the first audio does not wait for the
        other segments' prefills (each ~0.2 s of CPU here) and the steps they would slow down.

        All or nothing: a full queue (``EngineOverloaded``), a client past its share of the queue
        (``ClientQueueFull``) or a request larger than the queue (``RequestTooLarge``) queues none
        of its rows, and leaves every other queued row as it was."""
        rows: list[Row] = []
        for req in reqs:
            rows.append(self._row(req, loop, rows[0].stream if rows else None))
        if len(rows) > 1:
            # Read in order by one consumer: later segments wait while the request holds
            # max_stream_chunks unread (_park, the scheduler), and every chunk read may wake the loop.
            StreamGroup([r.stream for r in rows])
            for r in rows:
                r.stream.on_taken = self._poke
        self._playback(rows)
        self._push(rows)
        return [r.stream for r in rows]

    def _playback(self, rows: list[Row]) -> Playback:
        """The request's playback clock, on each of its rows' streams."""
        pb = Playback([r.req for r in rows], self.cfg.prebuffer_s, rows[0].stream.submitted_at)
        pb.streams = [r.stream for r in rows]
        for i, r in enumerate(rows):
            r.stream.playback, r.stream.segment = pb, i
        return pb

    def _row(self, req: SegmentRequest, loop: Optional[asyncio.AbstractEventLoop], after: Optional[RowStream]) -> Row:
        if self.model.is_random and req.target_tokens:
            # Random weights never say end-of-speech: stop at the text's expected length.
            n = min(req.target_tokens, req.max_new_tokens)
            req = dataclasses.replace(req, min_new_tokens=n, max_new_tokens=n)
        if req.spk_emb is None and req.spk_seed is not None:
            # The planner (no torch) names the speaker by seed; it is sampled here, once per seed.
            req = dataclasses.replace(req, spk_emb=self.speakers.from_seed(req.spk_seed))
        seq = next(self._seq)
        stream = RowStream(seq, loop)
        stream.submitted_at = self._clock()
        return Row(req=req, stream=stream, after=after)

    def _push(self, rows: list[Row]) -> None:
        with self._wake:
            self._stalled = False
            self.scheduler.push_all(
                [(r, r.stream.row_id) for r in rows], self.cfg.max_queued_rows, self.cfg.max_queued_rows_per_client
            )
            self._playbacks[rows[0].stream.row_id] = rows[0].stream.playback
            self._wake.notify()

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
        return len(self.batch.rows)

    @property
    def parked_rows(self) -> int:
        """Rows out of the batch until their consumers catch up (``max_stream_chunks``)."""
        return len(self.parked)

    @property
    def deadline_parked_rows(self) -> int:
        """Rows the deadline rule set aside (far ahead of their listeners, or without one)."""
        return len(self.held)

    @property
    def waiting_rows(self) -> int:
        return len(self.scheduler)

    def realtime(self, now: Optional[float] = None) -> RealtimeStatus:
        """The replica's real-time capacity and demand, and each real-time stream's clock (any
        thread; figures the decode thread is updating may be a step old)."""
        now = self._clock() if now is None else now
        with self._lock:
            playbacks = [pb for pb in self._playbacks.values() if pb.realtime and not pb.finished]
        streams = tuple(
            StreamClock(
                row_id=pb.streams[0].row_id,
                client=pb.client,
                started=pb.started,
                slack_s=pb.slack(now),
                stalled_s=pb.stall_s(now),
                segments=len(pb),
                segments_done=pb.head,
            )
            for pb in playbacks
            if pb.streams and not pb.ended
        )
        rows = len(self.batch.rows)
        cfg = self.cfg
        started = [s.slack_s for s in streams if s.started]
        return RealtimeStatus(
            capacity_streams=self.capacity.rows_within(
                TOKEN_SECONDS * (1 - cfg.capacity_headroom), cfg.max_rows + cfg.reserved_rows
            ),
            capacity_audio_s_per_s=self.capacity.audio_rate(max(1, rows)),
            step_s=self.capacity.step_s(max(1, rows)),
            running_rows=rows,
            demand_streams=len(streams),
            waiting_streams=sum(1 for s in streams if not s.started),
            min_slack_s=min(started, default=None),
            stalled_streams=sum(1 for s in started if s < 0),
            streams=streams,
        )

    def run_until_idle(self) -> None:
        """Drive the loop on the calling thread until no row is running or waiting (tests, CLI)."""
        while self.step():
            pass

    def step(self) -> bool:
        """Admit (and, by the deadline rule, park and resume), run one decode step, retire
        finished rows. Returns False when idle.

        A failure here fails the running rows (not the loop): each through ``_fail``."""
        try:
            self._resume()
            if self._deadline():
                self._schedule()
            else:
                self._admit(self._pop_admissible())
            if not self.batch.rows:
                # Rows wait that none may join yet (their requests' readers are behind): the loop
                # sleeps until a reader or a new row wakes it, instead of spinning.
                self._stalled = bool(self.scheduler)
                return bool(self.scheduler) or self._resumable()
            self._decode_step()
        except Exception as exc:  # noqa: BLE001 - a failed step fails this batch, not the loop
            log.exception("decode step failed; failing %d rows", len(self.batch.rows))
            for row in self.batch.rows:
                self._fail(row, f"decode failed: {exc.__class__.__name__}")
            self._retire()
        return True

    # ------------------------------------------------------------------ loop

    def _run(self) -> None:
        torch.set_grad_enabled(False)
        # Apply the thread count on this thread too (OpenMP/MKL settings are per thread): steps
        # ran 15-25% slower on a thread that never set it (2 OpenMP threads, measured in-process).
        apply_torch_threads(self.torch_threads)
        while True:
            with self._wake:
                while (
                    not self._stop
                    and not self.batch.rows
                    and (not self.scheduler or self._stalled)
                    and not self._resumable()
                ):
                    # A parked row's consumer wakes the loop when it catches up (_poke); the
                    # timeout also notices a consumer that went away (cancelled).
                    self._wake.wait(timeout=0.5 if self.parked or self._stalled else None)
                    self._stalled = False
                if self._stop:
                    break
            self.step()
        # Rows still waiting for a slot would otherwise leave their consumers blocked forever.
        with self._lock:
            waiting = self.scheduler.drain()
        for row in [*self.batch.rows, *waiting, *self.parked.drain(), *self.held.drain()]:
            self._fail(row, "engine stopped")
        self._retire()

    def _pop_admissible(self) -> list[Row]:
        """Rows to admit now (see ``Scheduler``); rows cancelled while waiting end here."""
        with self._lock:
            # A request's later segments join only while it holds fewer than max_stream_chunks
            # unread (when the loop runs beside its readers: a caller of step() reads afterwards).
            hold = self.cfg.max_stream_chunks if self._thread is not None else None
            taken = self.scheduler.pop_admissible(self.batch.rows, self.cfg, self._clock(), hold_groups_at=hold)
        out = []
        for row in taken:
            if row.stream.cancelled.is_set():
                row.finish_reason = "cancelled"
                self._end(row)
            else:
                out.append(row)
        return out

    # ------------------------------------------------------------------ admission (prefill + merge)

    def _deadline(self) -> bool:
        """Rows are scheduled by the deadline rule now (else by ``Scheduler`` alone)."""
        return self.cfg.scheduling == "deadline" and self.cfg.continuous

    @torch.inference_mode()
    def _schedule(self) -> None:
        """The deadline rule (decode/deadline.py): park the rows it sets aside, bring back the ones
        it resumes and admit the ones it takes, the last two in one merge (one copy of the batch)."""
        limit = self.cfg.max_stream_chunks if self._thread is not None else None
        if limit is not None and self.held:
            # A set-aside row whose reader fell behind waits for its reader instead (back-pressure).
            behind = [self.held.rows[i] for i in falling_behind(self.held.rows, limit)]
            if behind:
                self.parked.add(self.held.take_rows(behind), self._poke)
        back, cancelled = self.held.take(0, None)  # cancelled set-aside rows end here
        for row in cancelled:
            self._end(row)
        now = self._clock()
        cfg = self.cfg
        slots = cfg.max_rows + cfg.reserved_rows
        admit = self.capacity.rows_within(TOKEN_SECONDS * (1 - cfg.capacity_headroom), slots)
        if admit:  # a row past the largest batch measured lately, not more (decode/capacity.py)
            admit = min(admit, self.capacity.largest_recent() + 1)
        cap = Capacity(admit_rows=admit, park_rows=self.capacity.rows_within(TOKEN_SECONDS, slots))
        with self._lock:
            plan = decide(self.batch.rows, self.held.rows, self.scheduler, cfg, now, cap, hold_groups_at=limit)
            # New streams still waiting for room past capacity_wait_s are refused (a stream beyond
            # the capacity would make every listener stall): what fit this step is admitted first.
            late = [] if cfg.capacity_wait_s is None else self.scheduler.pop_unstarted(now - cfg.capacity_wait_s)
        for row in late:
            self._refuse(row)
        for row in plan.ended:
            row.finish_reason = "cancelled"
            self._end(row)
        if plan.park:
            t0 = time.perf_counter()
            parked = self.batch.park(sorted(plan.park))
            for p in parked:
                p.row.parked_at = now
            self.held.add(parked)
            self.stats.deadline_parked += len(parked)
            self.stats.park_seconds += time.perf_counter() - t0
        self._admit(plan.admit, self.held.take_rows(plan.resume))

    @torch.inference_mode()
    def _admit(self, new_rows: list[Row], back: Optional[list[Prefilled]] = None) -> None:
        """Prefill ``new_rows`` and merge them, after ``back`` (parked rows coming back), into the
        batch in one merge; the new rows then draw their first tokens."""
        back = back or []
        if not new_rows and not back:
            return
        t0 = time.perf_counter()
        resumed_s = 0.0
        prefilled: list[Prefilled] = []
        for row in new_rows:
            try:
                prefilled.append(self.prefill(row))
            except Exception as exc:  # noqa: BLE001 - a bad row fails alone
                log.warning("prefill failed: %s", exc)
                self._fail(row, f"prefill failed: {exc}")
        if prefilled or back:
            t_merge = time.perf_counter()
            try:
                self.batch.merge(back + prefilled)  # all of them in one copy of the batch's KV
            except Exception as exc:  # noqa: BLE001 - e.g. out of memory: these rows fail, the batch goes on
                log.exception("merging %d rows failed", len(back) + len(prefilled))
                for p in back:
                    self._fail(p.row, f"resume failed: {exc.__class__.__name__}")
                for p in prefilled:
                    self._fail(p.row, f"prefill failed: {exc.__class__.__name__}")
                prefilled = []
            else:
                if prefilled:
                    self.stats.admissions += 1
                if back:
                    resumed_s = time.perf_counter() - t_merge
                    self.stats.deadline_resumed += len(back)
                    self.stats.resume_seconds += resumed_s
        if prefilled:
            now = self._clock()
            for p in prefilled:
                p.row.stream.admitted_at = now
            self.stats.rows_admitted += len(prefilled)
            # The prefills' last hidden states yield the new rows' first tokens (the batch's last rows).
            start = len(self.batch.rows) - len(prefilled)
            self._sample_and_advance(start, torch.cat([p.hidden for p in prefilled]))
        self.stats.prefill_seconds += time.perf_counter() - t0 - resumed_s  # a merge with resumed rows is theirs
        self._retire()

    # ------------------------------------------------------------------ decode

    @torch.inference_mode()
    def _decode_step(self) -> None:
        t0 = time.perf_counter()
        start = self._clock()
        n = len(self.batch.rows)
        hidden = self._forward(self.batch.sampling.last)  # each row's last token in, (B, hidden) out
        self.stats.steps += 1
        self.stats.row_steps += n
        self.stats.max_rows = max(self.stats.max_rows, n)
        # Each row's input token of this step produced `hidden`: it belongs to that token.
        self._sample_and_advance(0, hidden)
        self._retire()
        self._park()
        self.stats.decode_seconds += time.perf_counter() - t0
        # What a running row waits per token at this size, admissions between steps included.
        self.capacity.observe(n, self._keep_pace(start))
        if self.on_step is not None:
            self.on_step(n)

    def _keep_pace(self, start: float) -> float:
        """Update ``pace_s`` with this step; returns the step's time, the wait before it included."""
        end = self._clock()
        took = end - (self._busy_since_step if self._busy_since_step is not None else start)
        self.pace_s = took if self.pace_s is None else 0.7 * self.pace_s + 0.3 * took
        # Rows still running wait through whatever comes before the next step; none: idle time is no one's.
        self._busy_since_step = end if self.batch.rows else None
        return took

    def _forward(self, last: torch.Tensor) -> torch.Tensor:
        """The GPT over one new token per row (``last``: (B, 4) codes) -> last hidden (B, hidden)."""
        batch = self.batch
        if self.graphs is not None and self.graphs.fits(batch):
            self.stats.graph_steps += 1
            return self.graphs.step(batch, last)
        if self.decode_forward is not None:
            return self.decode_forward(batch, self.decode_forward.embed(last).to(self.gpt_dtype))
        emb = code_embeddings(self.embed, last)
        mask = batch.open_step()
        cache = batch.cache()
        out = self.gpt(
            inputs_embeds=emb.unsqueeze(1).to(self.gpt_dtype),
            attention_mask=mask[:, None, None, :],
            position_ids=batch.pos.unsqueeze(1),
            cache=cache,
            use_cache=True,
        )
        batch.close_step([layer.kbuf for layer in cache.layers], [layer.vbuf for layer in cache.layers])
        return out.last_hidden_state[:, -1]

    def _sample_and_advance(self, start: int, hidden: torch.Tensor) -> None:
        """Draw the next token of the batch's rows ``start:`` from ``hidden`` (n, hidden), all in
        one pass (``Sampler``); then each row's bookkeeping: end-of-speech, its hidden state, a
        chunk when one is due. The only per-row work is plain Python."""
        tokens, ok = self.sampler.sample(self.batch.sampling, hidden, start)
        # One device->host copy each: the hidden states (what the rows stream) and the flags.
        hidden_cpu = hidden.detach().to("cpu", torch.float32)
        stop = tokens.eq(self.eos).any(1).tolist()
        ok = ok.tolist()
        now = self._clock()
        for b, row in enumerate(self.batch.rows[start:]):
            if row.finish_reason is not None:
                continue  # failed or cancelled in the meantime: the next retire drops it
            if row.stream.cancelled.is_set():
                row.finish_reason = "cancelled"
                continue
            if not ok[b]:
                # Degenerate sampling parameters or numerics: this row fails, the batch goes on.
                self._fail(row, "sampling produced invalid probabilities")
                continue
            row.accept(stop[b], hidden_cpu[b])
            if row.chunk_ready(self.cfg, now, self.pace_s):
                row.stream.send(row.take_chunk(False, self.hidden_size), now)

    # ------------------------------------------------------------------ back-pressure: park and resume

    def _park(self) -> None:
        """Rows whose consumers hold ``max_stream_chunks`` unread chunks leave the batch with
        their KV: what a stream buffers stays bounded, and the slot goes to rows someone reads.
        Only while the loop runs on its own thread (``start``): a caller driving ``step`` /
        ``run_until_idle`` reads its streams afterwards, not beside the decode."""
        limit = self.cfg.max_stream_chunks
        if limit is None or self._thread is None:
            return
        slow = falling_behind(self.batch.rows, limit)
        if not slow:
            return
        parked = self.batch.park(slow)
        self.parked.add(parked, self._poke)
        self.stats.rows_parked += len(parked)

    def _resumable(self) -> bool:
        return self.parked.any_ready(self.cfg.max_stream_chunks) or bool(self.held)

    def _poke(self, stream: RowStream) -> None:
        """A parked row's consumer, or a request's, took a chunk (its thread): wake the loop once
        it caught up."""
        if wakes_loop(stream, self.cfg.max_stream_chunks):
            with self._wake:
                self._stalled = False
                self._wake.notify()

    @torch.inference_mode()
    def _resume(self) -> None:
        """Parked rows whose consumers caught up rejoin the batch (before new rows: they were
        admitted first); cancelled ones end."""
        if self.held and not self._deadline():
            # Scheduling switched to fair: the rows the deadline rule set aside come back like these.
            self.parked.add(self.held.drain_parked(), self._poke)
        if not self.parked:
            return
        free = self.cfg.max_rows + self.cfg.reserved_rows - len(self.batch.rows)
        back, cancelled = self.parked.take(free, self.cfg.max_stream_chunks)
        for row in cancelled:
            self._end(row)
        if not back:
            return
        try:
            self.batch.merge(back)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: these rows fail, the batch goes on
            log.exception("resuming %d rows failed", len(back))
            for p in back:
                self._fail(p.row, f"resume failed: {exc.__class__.__name__}")
            return
        self.stats.rows_resumed += len(back)

    # ------------------------------------------------------------------ leaving the batch

    def _fail(self, row: Row, reason: str) -> None:
        """The one way a row fails (prefill, merge, sampling, a failed step, the engine stopping):
        its stream ends with ``EngineError(reason)`` and it is marked so that the next retire
        frees its slot (a row that failed before joining the batch has none)."""
        row.finish_reason = "error"
        if not row.stream.ended:
            self.stats.rows_failed += 1
            row.stream.fail(EngineError(reason))
            self._forget(row)

    def _refuse(self, row: Row) -> None:
        """A new real-time stream that found no room within ``capacity_wait_s``: its stream ends
        with ``CapacityExhausted`` (503), its later segments with it."""
        row.finish_reason = "error"
        self.stats.capacity_refusals += 1
        row.stream.fail(
            CapacityExhausted(
                f"every real-time stream this replica can keep at 1x is taken; none ended within "
                f"{self.cfg.capacity_wait_s:g} s (acoustic.capacity_wait_s): retry shortly"
            )
        )

    def _end(self, row: Row) -> None:
        """A row with a finish reason leaves: its stream's last item."""
        if row.finish_reason == "cancelled":
            self.stats.rows_cancelled += 1
            row.stream.finish()
        elif row.finish_reason != "error":  # a failed row's stream already ended with its error
            self.stats.rows_finished += 1
            row.stream.send(row.take_chunk(True, self.hidden_size), self._clock())
        self._forget(row)

    def _forget(self, row: Row) -> None:
        """Its stream ended: once all of its request's have, its clock leaves the registry."""
        pb = row.stream.playback
        if pb is not None and pb.ended:
            with self._lock:
                self._playbacks.pop(pb.streams[0].row_id, None)

    def _retire(self) -> None:
        """Drop finished, cancelled and failed rows from the batch (and their KV)."""
        keep = []
        for i, row in enumerate(self.batch.rows):
            if row.finish_reason is None and row.stream.cancelled.is_set():
                row.finish_reason = "cancelled"
            if row.finish_reason is None:
                keep.append(i)
            else:
                self._end(row)
        self.batch.retire(keep)
