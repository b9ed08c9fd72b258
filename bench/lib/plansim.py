"""The cluster as a discrete-event model (simpy) for ``python -m bench plan``.

Streams arrive (Poisson at a rate that may follow a day, or closed-loop clients whose number
steps), wait at most the Acoustic's ``capacity_wait_s`` for room, and decode on Acoustic replicas
whose step time is a curve of the rows in the batch; the Vocoder admits streams by its measured
rate. What decides is the project's own code: each replica's real-time capacity is a ``StepModel``
(engine/decode/capacity.py) fed the curve and asked ``rows_within`` as the engine asks it; the
Vocoder's is a ``StreamGate`` (engine/stream_gate.py) fed the rate; the replica count is
``deployments.autoscaling.desired_replicas`` on the stats a replica reports (``engine_stats``),
averaged over the look-back as Serve does, then Serve's own scaling factors and delays
(``ray.serve.autoscaling_policy``, on the simulated clock) and bounds.

Coarse on purpose (thousands of replicas over a day in seconds): time advances in slices of
``dt``; within one, every replica steps ``dt / step_s(rows)`` times. Streams are cohorts: the
streams one replica admitted in one slice with one length class (the corpus's lengths in
``LENGTH_CLASSES`` quantiles), each ending when its replica's token clock passes its length. A
stream stalls while its replica's steps are slower than its audio (stalled stream-seconds:
rows x (1 - rate) x dt); the lead a faster decode built is not credited (conservative).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import numpy as np

LENGTH_CLASSES = 3
FREE, STARTING, RUNNING, DRAINING = 0, 1, 2, 3
TTFB_BINS = np.geomspace(1e-3, 600.0, 600)  # TTFB histogram edges (s): percentiles of millions of streams


@dataclass
class Curve:
    """Decode step time (ms) against rows in the batch, where it comes from, and whether measured."""

    name: str
    points: list  # [(rows, step ms)]
    source: str
    estimate: bool = False


@dataclass
class Shape:
    """What the model runs: the Acoustic replica (its curve and rows), the delays and the policy's
    settings (an ``autoscaling_config`` of a Serve config), the Vocoder and first audio."""

    curve: Curve
    max_rows: int
    autoscaling: dict  # the deployment's autoscaling_config (policy_kwargs.target_fill inside)
    replica_start_s: float  # a new replica's start-up until it serves
    gpus_per_replica: float
    vocoder_rate: float  # audio s/s one Vocoder replica makes (its one torch thread)
    vocoders_per_gpu: float = 2.0  # Vocoder replicas alive per GPU (0: ``vocoders_fixed``)
    vocoders_fixed: int = 0
    first_audio_fixed_s: float = 0.0  # the service's own share of first audio + the first vocoder window
    graceful_shutdown_s: float = 310.0
    retries: int = 2  # a client told 503 asks again after Retry-After this many times (the openai SDK's)


@dataclass
class Load:
    """Open: ``rate(t)`` new streams per second. Closed: ``clients(t)`` clients, each sending its next
    stream when the last one ends (a refused one after Retry-After)."""

    duration_s: float
    lengths_tokens: Sequence[int]  # the corpus's per-request tokens (a stream's length is drawn from them)
    rate: Optional[Callable[[float], float]] = None
    clients: Optional[Callable[[float], int]] = None


@dataclass
class Result:
    t: list = field(default_factory=list)
    series: dict = field(default_factory=dict)
    totals: dict = field(default_factory=dict)
    ttfb_hist: Optional[np.ndarray] = None
    ttfb_levels: dict = field(default_factory=dict)  # closed loop: clients -> TTFB histogram


def project_rules():
    """The project's parameters and functions the model runs (imported where they live)."""
    from deployments.autoscaling import REFUSALS_WINDOW_S, desired_replicas
    from serve_app.engine.config import AcousticConfig
    from serve_app.engine.errors import CapacityExhausted
    from serve_app.errors import to_api_error

    acoustic = AcousticConfig()
    retry_after = float(to_api_error(CapacityExhausted("")).headers["Retry-After"])
    return acoustic, desired_replicas, REFUSALS_WINDOW_S, retry_after


def step_table(curve: Curve, max_rows: int):
    """``step_s[n]`` for n = 0..slots rows (``max_rows`` + the engine's reserved rows) and the
    replica's real-time capacity in streams, both from the engine's ``StepModel`` fed the curve (as
    the replica measures its own steps)."""
    from serve_app.engine.decode.capacity import StepModel
    from serve_app.engine.pacing import TOKEN_SECONDS

    acoustic = project_rules()[0]
    slots = max_rows + acoustic.reserved_rows
    model = StepModel()
    for _ in range(40):
        for rows, ms in curve.points:
            model.observe(int(rows), ms / 1000.0)
    table = np.array([math.inf] + [model.step_s(n) for n in range(1, slots + 1)])
    capacity = model.rows_within(TOKEN_SECONDS * (1 - acoustic.capacity_headroom), slots)
    return table, capacity


def vocoder_capacity(rate: float) -> int:
    """Streams one Vocoder replica keeps at 1x: its ``StreamGate`` after it measured ``rate``."""
    from serve_app.engine.stream_gate import WINDOW_S, StreamGate

    gate = StreamGate(project_rules()[0].capacity_headroom, None)
    gate.measure(0.0, 0.0)
    gate.measure(WINDOW_S, rate * WINDOW_S)
    return gate.capacity_streams


def water_fill(room: np.ndarray, k: int) -> np.ndarray:
    """``k`` streams over replicas with ``room`` free places, each to the one with the most left
    (the router's headroom order, deployments/routing.py), as counts per replica."""
    k = int(min(k, room.sum()))
    if k <= 0:
        return np.zeros_like(room)
    lo, hi = 0, int(room.max())  # the level L: sum(max(0, room - L)) >= k > sum(max(0, room - L - 1))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if np.maximum(room - mid, 0).sum() >= k:
            lo = mid
        else:
            hi = mid - 1
    take = np.maximum(room - lo - 1, 0)
    extra = k - int(take.sum())
    at_level = np.flatnonzero(room - take > lo)
    take[at_level[:extra]] += 1
    return take


def simulate(shape: Shape, load: Load, dt: float = 1.0, seed: int = 0, sample_s: float = 60.0) -> Result:
    import simpy
    from ray.serve.autoscaling_policy import _apply_delay_logic, _apply_scaling_factors
    from ray.serve.config import AutoscalingConfig

    from deployments.autoscaling import MAX_ROWS, RUNNING_ROWS, STREAMS_CAPACITY, STREAMS_WANTED, WAITING_ROWS
    from serve_app.engine.pacing import TOKEN_SECONDS

    acoustic, desired_replicas, refusals_window_s, retry_after = project_rules()
    rng = np.random.default_rng(seed)
    auto = dict(shape.autoscaling)
    target_fill = float(auto.get("policy", {}).get("policy_kwargs", {}).get("target_fill", 0.75))
    cfg = AutoscalingConfig(**{k: v for k, v in auto.items() if k != "policy"})
    slots_per_replica = shape.max_rows + acoustic.reserved_rows
    step_s, capacity = step_table(shape.curve, shape.max_rows)
    # Steps slower than real time even at one row: the rule holds nothing back (every slot, no refusal).
    admit_rows = capacity if capacity else slots_per_replica
    refuse = bool(capacity) and acoustic.capacity_wait_s is not None
    voc_cap = vocoder_capacity(shape.vocoder_rate)
    lengths = np.asarray(load.lengths_tokens, dtype=float)
    # Length classes: the mean of each of LENGTH_CLASSES equal shares of the sorted lengths (the mean kept).
    classes = np.array([c.mean() for c in np.array_split(np.sort(lengths), LENGTH_CLASSES) if len(c)])
    p_class = np.full(len(classes), 1.0 / len(classes))

    turns = max(1.0, dt / (lengths.mean() * step_s[admit_rows]))
    n_slots = int(cfg.max_replicas) + 64
    state = np.zeros(n_slots, dtype=np.int8)
    clock = np.zeros(n_slots)  # tokens each row of the replica has stepped since it started
    draining_since = np.zeros(n_slots)
    last_held = np.zeros(n_slots)  # each replica's rows, averaged over the last slice
    state[: cfg.initial_replicas or cfg.min_replicas] = RUNNING
    # Cohorts: replica, streams, token clock at which they end.
    c_rep = np.zeros(0, dtype=np.int64)
    c_n = np.zeros(0)
    c_end = np.zeros(0)
    queue: list[list[float]] = []  # [arrival time, streams, tries] waiting for room, oldest first
    retry_at: list[list[float]] = []  # [time, streams, tries] refused, asking again
    snapshots: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []  # (t, running, waiting, wanted)
    refused_log: list[tuple[float, float]] = []
    ttfb_hist = np.zeros(len(TTFB_BINS) + 1)
    tot = dict.fromkeys(
        ("arrivals", "served", "refusals", "refused_final", "stalled_stream_s", "stream_s", "audio_s"), 0.0
    )
    tot.update(gpu_s=0.0, capacity_stream_s=0.0, vocoder_refusals=0.0)
    policy = {"target": int(state.sum() // RUNNING), "state": {}, "desired": None}
    out = Result(ttfb_hist=ttfb_hist)
    names = ("load", "arrivals", "streams", "queued", "running", "starting", "target", "desired", "refused", "stalled")
    out.series = {k: [] for k in names}
    sample = {"refused": 0.0, "stalled": 0.0, "arrivals": 0.0}
    env = simpy.Environment()

    def rows_per_replica() -> np.ndarray:
        return np.bincount(c_rep, weights=c_n, minlength=n_slots)

    def start_replica(slot: int):
        yield env.timeout(shape.replica_start_s)
        if state[slot] == STARTING:
            state[slot] = RUNNING

    def scale_to(target: int, rows: np.ndarray) -> None:
        alive = np.flatnonzero((state == RUNNING) | (state == STARTING))
        if target > len(alive):
            for slot in np.flatnonzero(state == FREE)[: target - len(alive)]:
                state[slot], clock[slot] = STARTING, 0.0
                env.process(start_replica(int(slot)))
        elif target < len(alive):
            # Serve stops replicas still starting first, then (here) the least loaded.
            order = sorted(alive, key=lambda s: (state[s] != STARTING, rows[s]))
            for slot in order[: len(alive) - target]:
                state[slot] = FREE if state[slot] == STARTING else DRAINING
                draining_since[slot] = env.now

    def controller():
        """Every metrics interval the replicas push their stats; Serve's control loop then runs the
        policy over the look-back's mean, applies its factors and delays, and the bounds."""
        while True:
            yield env.timeout(cfg.metrics_interval_s)
            # A replica's stats are its rows at an instant: over many, the slice's mean (held rows).
            now, rows = env.now, last_held
            running = state == RUNNING
            waiting = sum(q[1] for q in queue)
            n_run = max(1, int(running.sum()))
            refused_lately = sum(n for t, n in refused_log if t >= now - refusals_window_s)
            wanted = rows + (waiting + refused_lately) / n_run
            snapshots.append((now, rows.copy(), np.full(n_slots, waiting / n_run), wanted))
            while snapshots and snapshots[0][0] < now - cfg.look_back_period_s:
                snapshots.pop(0)
            ids = np.flatnonzero(running)
            mean = [np.mean([s[i][ids] for s in snapshots], axis=0) for i in (1, 2, 3)]
            # What each replica's engine_stats reports, by the names the policy reads.
            metrics = {
                RUNNING_ROWS: dict(zip(ids.tolist(), mean[0].tolist())),
                WAITING_ROWS: dict(zip(ids.tolist(), mean[1].tolist())),
                STREAMS_WANTED: dict(zip(ids.tolist(), mean[2].tolist())),
                MAX_ROWS: dict.fromkeys(ids.tolist(), float(shape.max_rows)),
                STREAMS_CAPACITY: dict.fromkeys(ids.tolist(), float(capacity or 0)),
            }
            ctx = _Context(metrics, 0.0)
            decision = desired_replicas(ctx, target_fill)
            want = policy["target"] if decision is None else decision.replicas
            policy["desired"] = want
            want = _apply_scaling_factors(want, int(running.sum()), cfg)
            want, policy["state"] = _apply_delay_logic(max(0, want), policy["target"], cfg, policy["state"], _now=now)
            want = min(max(want, cfg.min_replicas), cfg.max_replicas)
            if want != policy["target"]:
                policy["target"] = want
                scale_to(want, rows)

    def streams():
        nonlocal c_rep, c_n, c_end
        next_sample = 0.0
        while env.now < load.duration_s:
            now = env.now
            # 1. Every replica steps through the slice at its batch's step time; a cohort whose
            #    replica's token clock passes its length ends in it, holding its rows for that part only.
            rows = rows_per_replica()
            step = step_s[np.minimum(rows, slots_per_replica).astype(int)]  # inf for an idle replica
            steps = dt / step
            ran = steps[c_rep]
            left = c_end - clock[c_rep]
            clock[:] += steps
            part = np.minimum(1.0, left / np.maximum(ran, 1e-12))  # share of the slice each cohort ran
            held = np.bincount(c_rep, weights=c_n * part, minlength=n_slots)
            last_held[:] = held
            slow = np.maximum(0.0, 1.0 - TOKEN_SECONDS / step)
            stalled = float((held * slow).sum() * dt)
            tot["stalled_stream_s"] += stalled
            sample["stalled"] += stalled
            tot["stream_s"] += float(held.sum() * dt)
            tot["audio_s"] += float((held * steps).sum() * TOKEN_SECONDS)
            done = part < 1.0
            tot["served"] += float(c_n[done].sum())
            keep = ~done
            c_rep, c_n, c_end, left = c_rep[keep], c_n[keep], c_end[keep], (left - ran)[keep]
            rows = rows_per_replica()
            # A drained replica (or one past its graceful shutdown) goes.
            gone = (state == DRAINING) & ((rows == 0) | (now - draining_since >= shape.graceful_shutdown_s))
            state[gone] = FREE
            # Rows still decoding at the next slice's end (at this batch's pace): the room a stream
            # arriving during it finds is what they leave.
            nxt = dt / step_s[np.minimum(rows, slots_per_replica).astype(int)]
            stay = np.bincount(c_rep, weights=c_n * (left > nxt[c_rep]), minlength=n_slots)
            # 2. New streams of this slice, and refused ones asking again.
            if load.rate is not None:
                new = float(rng.poisson(load.rate(now) * dt))
            else:
                in_system = c_n.sum() + sum(q[1] for q in queue) + sum(r[1] for r in retry_at)
                new = float(max(0, load.clients(now) - in_system))
            tot["arrivals"] += new
            sample["arrivals"] += new
            if new:
                queue.append([now, new, 0])
            for r in [r for r in retry_at if r[0] <= now]:
                retry_at.remove(r)
                queue.append([now, r[1], r[2]])
            # 3. Admission: within each running replica's capacity and the Vocoder's, oldest first.
            # A slice longer than a stream's decode holds several streams one after the other per place.
            room = np.where(state == RUNNING, np.maximum(admit_rows - stay, 0) * turns, 0).astype(np.int64)
            alive_gpus = float(((state == RUNNING) | (state == STARTING)).sum()) * shape.gpus_per_replica
            vocoders = shape.vocoders_fixed or math.ceil(alive_gpus * shape.vocoders_per_gpu)
            acoustic_free = int(room.sum())
            free = min(acoustic_free, int(max(0, vocoders * voc_cap - stay.sum()) * turns))
            admitted_now = []
            for q in queue:
                take = min(int(q[1]), free)
                if take:
                    admitted_now.append((now - q[0], take))
                    q[1] -= take
                    free -= take
            queue[:] = [q for q in queue if q[1] > 0]
            k = sum(n for _, n in admitted_now)
            if k:
                per = water_fill(room, k)
                reps = np.flatnonzero(per)
                split = rng.multinomial(per[reps], p_class)  # (replicas, length classes)
                ri, ci = np.nonzero(split)
                c_rep = np.concatenate([c_rep, reps[ri]])
                c_n = np.concatenate([c_n, split[ri, ci].astype(float)])
                c_end = np.concatenate([c_end, clock[reps[ri]] + classes[ci]])
                # First audio: the wait, the fixed share, then prefill (a step) and the first chunk's steps.
                after = stay + per
                first = (1 + acoustic.first_chunk_tokens) * step_s[
                    np.minimum(after[reps], slots_per_replica).astype(int)
                ]
                first_mean = float(np.average(first, weights=per[reps]))
                level = None if load.clients is None else int(load.clients(now))
                for waited, n in admitted_now:
                    b = np.searchsorted(TTFB_BINS, waited + shape.first_audio_fixed_s + first_mean)
                    ttfb_hist[b] += n
                    if level is not None:
                        out.ttfb_levels.setdefault(level, np.zeros_like(ttfb_hist))[b] += n
            # 4. Streams that waited past capacity_wait_s are refused (503, Retry-After).
            vocoder_bound = acoustic_free > k
            if refuse or vocoder_bound:
                for q in [q for q in queue if now + dt - q[0] > acoustic.capacity_wait_s]:
                    queue.remove(q)
                    tot["refusals"] += q[1]
                    sample["refused"] += q[1]
                    if vocoder_bound:  # the Vocoder's refusal: the Acoustic stage never sees it
                        tot["vocoder_refusals"] += q[1]
                    else:
                        refused_log.append((now, q[1]))
                    if q[2] < shape.retries:
                        retry_at.append([now + retry_after, q[1], q[2] + 1])
                    else:
                        tot["refused_final"] += q[1]
                while refused_log and refused_log[0][0] < now - refusals_window_s:
                    refused_log.pop(0)
            n_alive = int(((state == RUNNING) | (state == STARTING) | (state == DRAINING)).sum())
            tot["gpu_s"] += n_alive * shape.gpus_per_replica * dt
            tot["capacity_stream_s"] += float((state == RUNNING).sum()) * admit_rows * dt
            if now >= next_sample:
                next_sample += sample_s
                out.t.append(round(now, 2))
                s = out.series
                s["load"].append(load.rate(now) if load.rate else load.clients(now))
                s["streams"].append(round(float(held.sum()), 1))
                s["queued"].append(float(sum(q[1] for q in queue)))
                s["running"].append(int((state == RUNNING).sum()))
                s["starting"].append(int((state == STARTING).sum()))
                s["target"].append(policy["target"])
                s["desired"].append(policy["desired"])
                s["refused"].append(sample["refused"])
                s["arrivals"].append(sample["arrivals"])
                s["stalled"].append(round(sample["stalled"], 2))
                sample.update(refused=0.0, stalled=0.0, arrivals=0.0)
            yield env.timeout(dt)

    env.process(controller())
    proc = env.process(streams())
    env.run(until=proc)
    tot["in_flight_end"] = float(c_n.sum() + sum(q[1] for q in queue) + sum(r[1] for r in retry_at))
    tot.update(capacity_streams=capacity, vocoder_capacity_streams=voc_cap, admit_rows=admit_rows)
    out.totals = tot
    return out


class _Context:
    """What ``desired_replicas`` reads of Serve's ``AutoscalingContext``."""

    def __init__(self, aggregated_metrics: dict, total_queued_requests: float):
        self.aggregated_metrics = aggregated_metrics
        self.total_queued_requests = total_queued_requests


def percentile(hist: np.ndarray, q: float) -> Optional[float]:
    """The ``q`` percentile (0-100) of a TTFB histogram (each bin read at its upper edge)."""
    total = hist.sum()
    if not total:
        return None
    i = int(np.searchsorted(np.cumsum(hist), q / 100.0 * total))
    return float(TTFB_BINS[min(i, len(TTFB_BINS) - 1)])
