"""Acoustic stage (GPU when there is one): ChatTTS's GPT as one continuously batched decode loop.

``@serve.batch`` is the admission window: requests that arrive within ``batch_wait_timeout_s``
are submitted to the engine together (and so prefilled and merged in the same step). The engine
runs its decode loop on its own thread, admits new rows between steps and streams each
request's hidden-state chunks as they are ready; the per-request ``stream`` method forwards
them, segment after segment. A disconnected caller cancels its rows at the next step.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import time
from typing import AsyncIterator, Optional

import numpy as np
import ray
from ray import serve

from deployments.autoscaling import REFUSALS_WINDOW_S, engine_stats
from deployments.backends import install
from deployments.routing import HEADROOM
from serve_app import metrics
from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import AcousticConfig, ModelConfig
from serve_app.engine.decode.streams import aordered_chunks
from serve_app.engine.errors import EngineError
from serve_app.engine.refine import TextRefiner, refine_async
from serve_app.engine.threads import TorchThread, on_new_thread
from serve_app.engine.types import INTERNAL_CLIENT, SegmentRequest, WireChunk
from serve_app.engine.voices import OPENAI_VOICES
from serve_app.engine.weights.loading import load_model
from serve_app.pipeline.flow import FlowCredit, FlowRef, board, board_name
from serve_app.settings import LIVE_ACOUSTIC_FIELDS, AcousticUserConfig

log = logging.getLogger("ray.serve")


# Replicas, resources and autoscaling come from the config file (config/serve.yaml), which must
# set max_ongoing_requests >= max_batch_size (Serve's default of 5 would cap every batch at 5).
# The health check period is the code's: a dead decode thread fails the replica within 10 s.
@serve.deployment(health_check_period_s=10)
class Acoustic:
    def __init__(self, model: dict | None = None, acoustic: dict | None = None):
        install()  # this process records metrics and reaches boards through Ray (backends.py: why here)
        t0 = time.perf_counter()
        # Loaded on a thread that exits: the decode thread keeps the only OpenMP team (threads.py).
        # Only the GPT's part of ChatTTS: vocoding (and the DVAE) is the Vocoder stage's.
        self.model = on_new_thread(load_model, ModelConfig.model_validate(model or {}), audio=False)
        self._args = AcousticConfig.model_validate(acoustic or {})  # what a user_config is merged over
        self._admit_idle_at_once = AcousticUserConfig.model_fields["admit_idle_at_once"].default
        self._in_window = 0  # requests waiting in the admission window
        self._realtime: Optional[tuple] = None  # (the engine's RealtimeStatus, refusals lately), each second
        self._refusals: collections.deque = collections.deque()  # (when, streams refused)
        self._entering: list = []  # streams submitted here whose rows are not admitted yet
        self.engine = AcousticEngine(self.model, self._args)
        self.refiner = TextRefiner(self.model, self.engine.cfg)
        self._refine_thread = TorchThread("refine", threads=1)  # one torch thread: no second team
        self.engine.on_step = lambda rows: metrics.observe("tts_batch_rows", rows)
        self.engine.start()
        self._gauges = asyncio.get_event_loop().create_task(self._report_queue())
        self._warmup()
        board(board_name(serve.get_replica_context().app_name))  # the back-pressure board, found now (pipeline/flow.py)
        self.placement = _placement()
        log.info("Acoustic ready in %.1fs (%s weights)", time.perf_counter() - t0, self.model.weights.kind)
        log.info("Acoustic placement %s", json.dumps(self.placement))

    def _warmup(self) -> None:
        req = SegmentRequest(
            text="你好。",
            spk_emb=None,
            spk_seed=OPENAI_VOICES["alloy"],
            seed=0,
            max_new_tokens=4,
            target_tokens=4,
            client=INTERNAL_CLIENT,
        )  # nobody's: it caps no client's rows
        for _ in self.engine.submit(req):
            pass

    def reconfigure(self, user_config: dict) -> None:
        """Serve ``user_config`` (``AcousticUserConfig``): the admission window, and the live decode
        knobs merged over the deployment's ``args.acoustic`` (a knob the user_config no longer
        names goes back to its args value)."""
        live = AcousticUserConfig.model_validate(user_config or {})
        self._admit_idle_at_once = live.admit_idle_at_once
        self._admit.set_max_batch_size(live.max_batch_size)
        self._admit.set_batch_wait_timeout_s(live.batch_wait_timeout_s)
        cfg = live.engine_config(self._args)
        self.engine.reconfigure(**{k: getattr(cfg, k) for k in LIVE_ACOUSTIC_FIELDS})
        self.refiner.configure(self.engine.cfg)

    # The window's size and wait are set from user_config at start (reconfigure); these are
    # AcousticUserConfig's defaults until then.
    @serve.batch(
        max_batch_size=AcousticUserConfig.model_fields["max_batch_size"].default,
        batch_wait_timeout_s=AcousticUserConfig.model_fields["batch_wait_timeout_s"].default,
    )
    async def _admit(self, plans: list[list[SegmentRequest]]) -> list:
        """Submit a window's requests together; each caller gets its rows' streams (or an error)."""
        loop = asyncio.get_running_loop()
        out: list = []
        for segments in plans:
            try:
                out.append(self.engine.submit_all(segments, loop=loop))
            except EngineError as exc:  # queue full, client's share full, request too large: this caller's
                out.append(exc)
        return out

    async def _submit(self, segments: list[SegmentRequest]):
        """The request's row streams (or its EngineError): at once when the engine is idle, else
        through the admission window. Idle: no row running or waiting, no request in the window,
        and no row this replica submitted still on its way in (popped for its prefill, a row is
        neither waiting nor running yet): requests arriving together still share an admission."""
        if self._admit_idle_at_once and not self._in_window and self._engine_idle():
            try:
                streams = self.engine.submit_all(segments, loop=asyncio.get_running_loop())
            except EngineError as exc:
                return exc
            self._enter(streams)
            return streams
        self._in_window += 1
        try:
            streams = await self._admit(segments)
        finally:
            self._in_window -= 1
        if not isinstance(streams, EngineError):
            self._enter(streams)
        return streams

    def _enter(self, streams: list) -> None:
        self._entering = [st for st in (*self._entering, *streams) if st.admitted_at is None and not st.started]

    def _engine_idle(self) -> bool:
        self._enter([])
        return not self._entering and not self.engine.running_rows and not self.engine.waiting_rows

    async def stream(self, segments: list[SegmentRequest], flow: Optional[FlowRef] = None) -> AsyncIterator[WireChunk]:
        """Hidden-state chunks of every segment, in segment order, as they are decoded. With
        ``flow``, at most its window ahead of what the caller has taken: past it this stream stops
        reading its rows, and the engine parks them until it reads again (pipeline/flow.py)."""
        t_in = time.monotonic()
        streams = await self._submit(segments)
        t_admit = time.monotonic()
        if isinstance(streams, EngineError):
            raise streams
        credit = FlowCredit(flow)
        first = True
        try:
            async for seg, chunk in aordered_chunks(streams):
                await credit.ready()
                wire = self._wire(seg, chunk)
                if first:
                    first = False
                    wire.hops = _first_hops(streams[0], t_in, t_admit)
                yield wire
        finally:
            for st in streams:
                if st.admitted_at is not None:
                    metrics.observe("tts_stage_seconds", st.admitted_at - st.submitted_at, stage="queue")
                    if st.finished_at is not None:
                        metrics.observe("tts_stage_seconds", st.finished_at - st.admitted_at, stage="decode")

    def _wire(self, seg: int, chunk) -> WireChunk:
        return WireChunk(
            segment=seg,
            hidden=chunk.hidden.numpy().astype(np.float16),
            final=chunk.final,
            finish_reason=chunk.finish_reason,
            batch_rows=self.engine.running_rows,
        )

    async def _report_queue(self) -> None:
        """Every second: the engine's queue and its real-time capacity and demand as gauges, the
        streams it refused as a counter, and what autoscaling and routing read (``_realtime``)."""
        refused = 0
        while True:
            metrics.set_gauge("tts_queue_rows", self.engine.waiting_rows)
            metrics.set_gauge("tts_running_rows", self.engine.running_rows)
            rt = self.engine.realtime()
            now = time.monotonic()
            total = self.engine.stats.capacity_refusals
            if total > refused:
                metrics.inc("tts_capacity_refusals_total", total - refused, stage="acoustic")
                self._refusals.append((now, total - refused))
            refused = total
            while self._refusals and now - self._refusals[0][0] > REFUSALS_WINDOW_S:
                self._refusals.popleft()
            self._realtime = (rt, sum(n for _, n in self._refusals))
            if rt.capacity_streams is not None:
                metrics.set_gauge("tts_realtime_capacity_streams", rt.capacity_streams, stage="acoustic")
            metrics.set_gauge("tts_realtime_demand_streams", rt.demand_streams, stage="acoustic")
            metrics.set_gauge("tts_realtime_waiting_streams", rt.waiting_streams)
            metrics.set_gauge("tts_realtime_stalled_streams", rt.stalled_streams)
            await asyncio.sleep(1.0)

    async def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's custom autoscaling metrics, read by the Acoustic policy (deployments/autoscaling.py)
        in the controller: the engine's queue, and its real-time streams wanted (carried, waiting,
        refused within the last ``REFUSALS_WINDOW_S``) against its capacity in streams."""
        rt, refused = self._realtime or (self.engine.realtime(), 0)
        return engine_stats(
            self.engine.waiting_rows,
            self.engine.running_rows,
            self.engine.cfg.max_rows,
            streams_wanted=rt.demand_streams + refused,
            streams_capacity=rt.capacity_streams,
        )

    def record_routing_stats(self) -> dict[str, float]:
        """What the callers' router reads (deployments/routing.py): the real-time streams this
        replica can still start at 1x (left out until it has measured its steps)."""
        rt = self._realtime[0] if self._realtime else self.engine.realtime()
        if rt.capacity_streams is None:
            return {}
        return {HEADROOM: float(rt.capacity_streams - rt.demand_streams)}

    async def refine(self, texts: list[str], seed: int) -> list[str]:
        """ChatTTS's refine_text pass (GPT in text mode), beside the decode loop: bounded input
        (413), at most ``refine_wait_s`` in the refiner's queue (503 refine_busy), and stopped
        before its next token when this call is cancelled (the caller went away)."""
        return await refine_async(self.refiner, self._refine_thread, texts, seed)

    def stats(self) -> dict:
        s = self.engine.stats
        return {
            **{k: getattr(s, k) for k in s.__dataclass_fields__},
            "mean_rows": s.mean_rows,
            "running_rows": self.engine.running_rows,
            "waiting_rows": self.engine.waiting_rows,
            "parked_rows": self.engine.parked_rows,
            "deadline_parked_rows": self.engine.deadline_parked_rows,
            "realtime": _realtime_view(self.engine.realtime()),
            "admit_idle_at_once": self._admit_idle_at_once,
            "torch_threads": self.engine.torch_threads,
            "config": self.engine.cfg.model_dump(),
            "weights_kind": self.model.weights.kind,
            "weights_id": self.model.weights.weights_id,
            "placement": self.placement,
        }

    def weights_info(self) -> dict:
        return {
            "kind": self.model.weights.kind,
            "id": self.model.weights.weights_id,
            "source": self.model.weights.source,
        }

    def check_health(self) -> None:
        if self.engine._thread is None or not self.engine._thread.is_alive():
            raise RuntimeError("acoustic decode thread is not running")

    def __del__(self):
        # Serve calls this after its graceful shutdown: it stopped routing here and waited, up to
        # graceful_shutdown_timeout_s, for every open stream (an ongoing request) to end. Rows
        # still here were cut by that timeout: say so, as it means the timeout is too short.
        try:
            left = self.engine.running_rows + self.engine.waiting_rows
            if left:
                log.warning(
                    "Acoustic replica stopping with %d rows unfinished (graceful_shutdown_timeout_s too short?)", left
                )
            self.engine.stop()
        except Exception:  # noqa: BLE001
            pass


def _first_hops(st, t_in: float, t_admit: float) -> dict:
    """Where the first chunk's time went in this process (ms, one monotonic clock): the admission
    window (``@serve.batch``'s wait and the submit), the engine's queue and prefill (``admitted_at``
    is set once the row's prefill is merged), the first chunk's decode, and the hand-over from the
    decode thread to this stream."""
    now = time.monotonic()
    out = {"admit_window": min(st.submitted_at, t_admit) - t_in, "acoustic_total": now - t_in}
    if st.admitted_at is not None:
        out["queue_prefill"] = st.admitted_at - st.submitted_at
        if st.first_chunk_at is not None:
            out["first_chunk"] = st.first_chunk_at - st.admitted_at
            out["acoustic_handover"] = now - st.first_chunk_at
    return {k: round(v * 1000.0, 2) for k, v in out.items()}


def _realtime_view(rt) -> dict:
    """The engine's real-time status without its per-stream clocks (operators, tests, the bench)."""
    return {k: getattr(rt, k) for k in rt.__dataclass_fields__ if k != "streams"}


def _placement() -> dict:
    """Where this replica runs: replica, actor, node and the GPUs Ray gave it (fractional GPUs
    share an id)."""
    ctx = ray.get_runtime_context()
    return {
        "replica": serve.get_replica_context().replica_tag,
        "actor_id": ctx.get_actor_id(),
        "node_id": ctx.get_node_id(),
        "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
    }
