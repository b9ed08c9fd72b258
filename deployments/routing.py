"""Routing calls to the Acoustic replicas by real-time headroom: a Serve request router.

Serve's default router picks the less busy of two random replicas by their ongoing requests. An
Acoustic request is a stream, and what a replica can still take is real-time headroom: the
streams it keeps at 1x (its measured capacity, the engine's deadline scheduling) less those it
carries. Each replica reports its headroom (``Acoustic.record_routing_stats``, every
``request_routing_stats_period_s``); ``HeadroomRouter`` offers the replicas with the most of it
first (two of them, Serve then takes the less busy), the rest after. Replicas tie when none
reports yet or all are equal: then two at random, as Serve's own router would.

It runs wherever the Acoustic stage is called from (the Vocoder's replicas, the Ingress's):
configured on the deployment (``request_router_config.request_router_class``).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Optional, Sequence, TypeVar

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

HEADROOM = "rt_headroom"  # the routing stat: streams the replica can still start at 1x

T = TypeVar("T")


def rank_by_headroom(replicas: Sequence[T], headroom: Callable[[T], Optional[float]]) -> list[list[T]]:
    """Groups to try in order: the two with the most headroom (ties shuffled), then the others.
    A replica without a report counts as none."""
    shuffled = list(replicas)
    random.shuffle(shuffled)
    ranked = sorted(shuffled, key=lambda r: -(headroom(r) or 0.0))
    return [ranked[:2], ranked[2:]] if len(ranked) > 2 else [ranked]


class HeadroomRouter(RequestRouter):
    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: Optional[PendingRequest] = None
    ) -> list[list[RunningReplica]]:
        return rank_by_headroom(candidate_replicas, _headroom)


def _headroom(replica: Any) -> Optional[float]:
    stats = replica.routing_stats or {}
    value = stats.get(HEADROOM)
    return None if value is None else float(value)
