"""Acoustic autoscaling on the decode engine's queue: a Serve custom autoscaling policy.

Serve's default policy counts *requests* per replica. An Acoustic request is one ``stream`` call
that may carry many segment rows, and what limits a replica is its decode slots
(``acoustic.max_rows``), so this policy counts *rows*. Every Acoustic replica reports, through
Serve's ``record_autoscaling_stats`` hook (``engine_stats``), the rows waiting for a decode slot,
the rows decoding and its ``max_rows``. Serve pushes them to the controller every
``metrics_interval_s`` and gives the policy each replica's mean over ``look_back_period_s``
(``ctx.aggregated_metrics``). The policy then wants

    ceil((running + waiting + requests queued in handles) / (target_fill * max_rows))

replicas, or, where more, the real-time streams wanted (carried, waiting for room, or refused for
want of it lately) over ``target_fill`` times a replica's measured capacity in streams (the
engine's deadline scheduling: the streams it keeps at 1x) (``desired_replicas``): replicas are
added as the streams a replica can keep smooth fill up, before its listeners hear it slow down.
That raw demand is what it returns: Serve wraps every policy, this one included, in
``autoscaling_policy._apply_autoscaling_config`` (upscaling/downscaling factors,
``upscale_delay_s`` / ``downscale_delay_s``) and the controller then clamps the result to
``min_replicas`` / ``max_replicas``, exactly as for its default policy, so those config keys
keep their meaning.

The policy runs in the Serve controller (head node), never in a replica. Serve pickles this
module by value (``cloudpickle.register_pickle_by_value``), so it imports nothing of this
package: only the standard library and Ray. Its decision is logged to the controller's Serve log
when it changes and exported as the gauges ``tts_autoscale_desired_replicas`` and
``tts_autoscale_rows`` (Prometheus: ``ray_`` prefix, on the head node's metrics port).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional

log = logging.getLogger("ray.serve")

# The names of the custom metrics an Acoustic replica reports (engine_stats) and the policy reads.
WAITING_ROWS = "waiting_rows"
RUNNING_ROWS = "running_rows"
MAX_ROWS = "max_rows"

# Real-time streams (the engine's deadline scheduling): the streams a replica carries or was asked
# to start (decoding, waiting, refused lately) and how many it can keep at 1x.
STREAMS_WANTED = "rt_streams_wanted"
STREAMS_CAPACITY = "rt_streams_capacity"
# Streams a replica refused for want of capacity count as wanted this long (its ``streams_wanted``).
REFUSALS_WINDOW_S = 10.0

DESIRED_METRIC = "tts_autoscale_desired_replicas"
ROWS_METRIC = "tts_autoscale_rows"


def engine_stats(
    waiting_rows: int,
    running_rows: int,
    max_rows: int,
    streams_wanted: float = 0.0,
    streams_capacity: Optional[float] = None,
) -> dict[str, float]:
    """What ``Acoustic.record_autoscaling_stats`` returns (Serve wants a flat name -> number dict):
    the engine's rows, and its real-time streams wanted against its capacity in streams (left out
    until the replica has measured its steps)."""
    out = {WAITING_ROWS: float(waiting_rows), RUNNING_ROWS: float(running_rows), MAX_ROWS: float(max_rows)}
    out[STREAMS_WANTED] = float(streams_wanted)
    if streams_capacity is not None:
        out[STREAMS_CAPACITY] = float(streams_capacity)
    return out


@dataclass(frozen=True)
class Decision:
    """One evaluation of the policy: its inputs and the replicas it wants (before delays and bounds)."""

    replicas: int
    running_rows: float
    waiting_rows: float
    queued_requests: float
    rows_per_replica: float  # target_fill * max_rows: the rows one replica should carry
    reporting: int  # replicas whose stats reached the controller
    streams_wanted: float = 0.0  # real-time streams carried, waiting or refused lately, over the replicas
    streams_per_replica: Optional[float] = None  # target_fill * a replica's capacity in streams (None: unmeasured)


def _sum(per_replica: Optional[Mapping[Any, float]]) -> float:
    return float(sum((per_replica or {}).values()))


def desired_replicas(ctx: Any, target_fill: float) -> Optional[Decision]:
    """The replicas ``ctx`` (a ``ray.serve.config.AutoscalingContext``) asks for, or None while no
    replica has reported its engine yet (the policy then keeps the current target).

    Requests queued in handles (``ctx.total_queued_requests``: a replica at
    ``max_ongoing_requests`` takes no more) count one row each, the least a request brings.
    """
    metrics = ctx.aggregated_metrics or {}
    max_rows = metrics.get(MAX_ROWS) or {}
    if not max_rows:
        return None
    running = _sum(metrics.get(RUNNING_ROWS))
    waiting = _sum(metrics.get(WAITING_ROWS))
    queued = float(ctx.total_queued_requests or 0.0)
    per_replica = max(1.0, target_fill * (_sum(max_rows) / len(max_rows)))
    # A tiny epsilon keeps a load of exactly N * per_replica from asking for N + 1 through float noise.
    replicas = math.ceil((running + waiting + queued) / per_replica - 1e-9)
    # Real-time demand: every stream wanted (carried, waiting for room, or refused for want of it)
    # over what a replica keeps at 1x, measured, before any listener hears the batch slow down.
    wanted = _sum(metrics.get(STREAMS_WANTED))
    capacity = metrics.get(STREAMS_CAPACITY) or {}
    streams_per_replica = None
    if capacity and _sum(capacity) > 0:
        streams_per_replica = max(1.0, target_fill * _sum(capacity) / len(capacity))
        replicas = max(replicas, math.ceil(wanted / streams_per_replica - 1e-9))
    return Decision(replicas, running, waiting, queued, per_replica, len(max_rows), wanted, streams_per_replica)


class EngineQueuePolicy:
    """``autoscaling_config.policy.policy_function: deployments.autoscaling:EngineQueuePolicy``.

    ``policy_kwargs``: ``target_fill`` (0 < fill <= 2), the share of a replica's ``max_rows``
    it should carry on average. Below 1 leaves free slots so a burst is admitted at the next
    decode step; above 1 tolerates a queue. Serve creates one instance per deployment in the
    controller and calls it every control-loop tick (0.1 s).
    """

    def __init__(self, target_fill: float = 0.75):
        if not 0.0 < float(target_fill) <= 2.0:
            raise ValueError(f"target_fill must be in (0, 2], got {target_fill!r}")
        self.target_fill = float(target_fill)
        self._gauges: Optional[tuple[Any, Any]] = None
        self._last_logged: Optional[tuple] = None

    def __call__(self, ctx: Any) -> tuple[int, dict]:
        decision = desired_replicas(ctx, self.target_fill)
        if decision is None:
            return ctx.target_num_replicas, {}
        self._record(ctx, decision)
        return decision.replicas, {}

    def _record(self, ctx: Any, d: Decision) -> None:
        tags = {"deployment": ctx.deployment_name, "application": ctx.app_name or ""}
        desired, rows = self._metrics()
        desired.set(d.replicas, tags=tags)
        for kind, value in (
            ("running", d.running_rows),
            ("waiting", d.waiting_rows),
            ("handle_queued", d.queued_requests),
            ("target_per_replica", d.rows_per_replica),
            ("realtime_streams_wanted", d.streams_wanted),
            ("realtime_streams_per_replica", d.streams_per_replica or 0.0),
        ):
            rows.set(value, tags={**tags, "kind": kind})
        low, high = ctx.capacity_adjusted_min_replicas, ctx.capacity_adjusted_max_replicas
        bounded = min(max(d.replicas, low), high)
        # One line per change of what Serve will act on (the raw demand flickers at a boundary).
        key = (bounded, ctx.target_num_replicas, ctx.current_num_replicas, low, high)
        if key != self._last_logged:
            self._last_logged = key
            log.info(
                "autoscale %s: rows running %.1f + waiting %.1f + handle-queued requests %.1f over %d reporting "
                "replica(s), %.1f rows per replica (target_fill %.2f); real-time streams wanted %.1f, %s per "
                "replica -> desired %d (bounded %d, bounds [%d, %d]); "
                "target %d, running %d; Serve applies upscale_delay_s %gs / downscale_delay_s %gs",
                ctx.deployment_name,
                d.running_rows,
                d.waiting_rows,
                d.queued_requests,
                d.reporting,
                d.rows_per_replica,
                self.target_fill,
                d.streams_wanted,
                "unmeasured" if d.streams_per_replica is None else f"{d.streams_per_replica:.1f}",
                d.replicas,
                bounded,
                low,
                high,
                ctx.target_num_replicas,
                ctx.current_num_replicas,
                ctx.config.upscale_delay_s,
                ctx.config.downscale_delay_s,
            )

    def _metrics(self) -> tuple[Any, Any]:
        # Created on first use, in the controller (a Ray actor, so they are exported by its node).
        if self._gauges is None:
            from ray.util.metrics import Gauge

            self._gauges = (
                Gauge(
                    DESIRED_METRIC,
                    description="Acoustic replicas the engine-queue policy wants, before Serve's delays and bounds.",
                    tag_keys=("deployment", "application"),
                ),
                Gauge(
                    ROWS_METRIC,
                    description="The engine-queue policy's inputs: rows running, waiting, requests queued in handles, "
                    "target rows per replica.",
                    tag_keys=("deployment", "application", "kind"),
                ),
            )
        return self._gauges
