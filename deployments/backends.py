"""What the layers below get from Ray, installed once per process by importing ``deployments``:
the metrics backend (``serve_app/metrics.py``: Ray Serve's metrics, tagged with deployment and
replica, exported by every node's metrics endpoint with a ``ray_`` prefix) and the back-pressure
boards (``serve_app/pipeline/flow.py``: one small detached actor per application)."""

from __future__ import annotations

from typing import Any, Optional

from serve_app import metrics
from serve_app.pipeline import flow


def make_metric(kind: str, name: str, description: str, tags: tuple, buckets: Optional[list]) -> Any:
    from ray.serve import metrics as m

    if kind == "counter":
        return m.Counter(name, description=description, tag_keys=tags)
    if kind == "gauge":
        return m.Gauge(name, description=description, tag_keys=tags)
    return m.Histogram(name, description=description, boundaries=buckets, tag_keys=tags)


def open_board(name: str) -> Any:
    """The named board's actor handle (created by the first process that asks, found by the others)."""
    import ray

    actor = ray.remote(num_cpus=0, max_restarts=-1, max_concurrency=100_000)(flow.FlowBoard)
    return actor.options(name=name, namespace=flow.NAMESPACE, lifetime="detached", get_if_exists=True).remote()


def install() -> None:
    """Idempotent. Importing ``deployments`` calls it, and so does every stage's and actor's
    ``__init__``: Serve pickles a deployment's class by value (the module's name holds the
    Deployment, not the class), so a replica whose class refers to nothing else of this package
    never imports it; the TextNormalizer recorded no metrics that way."""
    metrics.use(make_metric)
    flow.use_boards(open_board)
