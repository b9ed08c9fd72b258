"""The Acoustic autoscaling policy (deployments/autoscaling.py) as a pure function of Serve's
``AutoscalingContext``, wrapped the way Serve's controller wraps it; and the configs that name it.

No Ray is started here: the policy is called directly, as the controller calls it. The cluster
tests (tests/system/test_cluster.py) run it inside a real controller.
"""

from __future__ import annotations

import copy
import logging
import subprocess
import sys

import pytest
from ray.serve._private.autoscaling_state import _resolve_policy_callable
from ray.serve._private.common import DeploymentID, ReplicaID
from ray.serve.autoscaling_policy import _apply_autoscaling_config
from ray.serve.config import AutoscalingConfig, AutoscalingContext, AutoscalingPolicy
from support.configs import CONFIGS, chattts_app, deployments, load

from bench.lib.procs import REPO_ROOT as REPO
from deployments.autoscaling import (
    DESIRED_METRIC,
    MAX_ROWS,
    RUNNING_ROWS,
    STREAMS_CAPACITY,
    STREAMS_WANTED,
    WAITING_ROWS,
    EngineQueuePolicy,
    desired_replicas,
    engine_stats,
)
from deployments.routing import rank_by_headroom

POLICY = "deployments.autoscaling:EngineQueuePolicy"
DEP = DeploymentID(name="Acoustic", app_name="chattts")


def replica(i: int) -> ReplicaID:
    return ReplicaID(unique_id=f"r{i}", deployment_id=DEP)


def context(
    rows: list[tuple[float, float, float]],
    *,
    target: int | None = None,
    queued: float = 0.0,
    config: AutoscalingConfig | None = None,
    state: dict | None = None,
) -> AutoscalingContext:
    """A context as the controller builds it: ``rows`` = (running, waiting, max_rows) per reporting replica."""
    config = config or AutoscalingConfig(min_replicas=1, max_replicas=8)
    reps = [replica(i) for i in range(len(rows))]
    metrics = (
        {
            RUNNING_ROWS: {r: run for r, (run, _, _) in zip(reps, rows)},
            WAITING_ROWS: {r: wait for r, (_, wait, _) in zip(reps, rows)},
            MAX_ROWS: {r: m for r, (_, _, m) in zip(reps, rows)},
        }
        if rows
        else {}
    )
    n = len(rows) or 1
    return AutoscalingContext(
        deployment_id=DEP,
        deployment_name=DEP.name,
        app_name=DEP.app_name,
        current_num_replicas=n,
        target_num_replicas=target if target is not None else n,
        running_replicas=reps,
        total_num_requests=0.0,
        total_queued_requests=queued,
        aggregated_metrics=metrics,
        raw_metrics=None,
        capacity_adjusted_min_replicas=config.min_replicas,
        capacity_adjusted_max_replicas=config.max_replicas,
        policy_state=dict(state or {}),
        last_scale_up_time=None,
        last_scale_down_time=None,
        current_time=None,
        config=config,
    )


class Sink:
    """Stands in for a ray.util.metrics.Gauge: keeps the last value per tag set."""

    def __init__(self):
        self.values: dict[tuple, float] = {}

    def set(self, value, tags=None):
        self.values[tuple(sorted((tags or {}).items()))] = value


def policy(target_fill: float = 0.75) -> EngineQueuePolicy:
    p = EngineQueuePolicy(target_fill=target_fill)
    p._gauges = (Sink(), Sink())
    return p


# ----------------------------------------------------------------------------- the formula


def test_engine_stats_are_what_the_policy_reads():
    stats = engine_stats(waiting_rows=3, running_rows=16, max_rows=16)
    assert stats == {WAITING_ROWS: 3.0, RUNNING_ROWS: 16.0, MAX_ROWS: 16.0, STREAMS_WANTED: 0.0}
    measured = engine_stats(waiting_rows=0, running_rows=2, max_rows=16, streams_wanted=3, streams_capacity=4)
    assert measured[STREAMS_WANTED] == 3.0 and measured[STREAMS_CAPACITY] == 4.0
    assert all(isinstance(v, float) for v in {**stats, **measured}.values())  # Serve accepts only numbers


@pytest.mark.parametrize(
    "rows, queued, fill, want",
    [
        ([(16, 20, 16)], 0, 0.75, 3),  # 36 rows / 12 per replica
        ([(12, 0, 16)], 0, 0.75, 1),  # exactly one replica's share: not two
        ([(12, 0, 16), (12, 0, 16)], 0, 0.75, 2),
        ([(12, 1, 16), (12, 0, 16)], 0, 0.75, 3),  # one row over two shares
        ([(2, 0, 16), (1, 0, 16), (0, 0, 16)], 0, 0.75, 1),  # idle replicas: back to one
        ([(0, 0, 16)], 0, 0.75, 0),  # nothing at all: Serve's min_replicas bound decides
        ([(16, 0, 16)], 13, 0.75, 3),  # requests queued in handles count one row each
        ([(2, 1, 2)], 0, 0.25, 3),  # a share below one row counts as one row
        ([(32, 64, 32)], 0, 2.0, 2),  # fill above 1 tolerates a queue
    ],
)
def test_desired_replicas_is_rows_over_target_fill(rows, queued, fill, want):
    d = desired_replicas(context(rows, queued=queued), fill)
    assert d is not None and d.replicas == want, d
    assert d.reporting == len(rows)
    assert d.running_rows + d.waiting_rows + d.queued_requests == sum(r + w for r, w, _ in rows) + queued


def test_no_report_yet_keeps_the_current_target():
    ctx = context([], target=3)
    assert desired_replicas(ctx, 0.75) is None
    assert policy()(ctx) == (3, {})


def test_target_fill_is_checked():
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="target_fill"):
            EngineQueuePolicy(target_fill=bad)


# ----------------------------------------------------------------------------- inside Serve's wrapper


def test_serve_applies_its_delays_to_the_policy():
    """The controller wraps every policy with _apply_autoscaling_config: the upscale delay holds a
    scale-up back and the downscale delay a scale-down, with the policy unchanged."""
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=8, upscale_delay_s=0, downscale_delay_s=600)
    wrapped = _apply_autoscaling_config(policy())
    up, state = wrapped(context([(16, 20, 16)], config=cfg))
    assert up == 3  # no upscale delay: at once
    down, state = wrapped(context([(1, 0, 16)] * 3, config=cfg, state=state))
    assert down == 3  # wants 1, but the downscale delay has not passed
    cfg_slow_up = AutoscalingConfig(min_replicas=1, max_replicas=8, upscale_delay_s=30)
    held, _ = wrapped(context([(16, 20, 16)], config=cfg_slow_up))
    assert held == 1


def test_serve_applies_its_smoothing_to_the_policy():
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=8, upscale_delay_s=0, upscaling_factor=0.5)
    wrapped = _apply_autoscaling_config(policy())
    n, _ = wrapped(context([(16, 44, 16)], config=cfg))  # wants 5 from 1: half the step, rounded up
    assert n == 3


def test_decision_goes_to_the_metric_and_one_log_line_per_change(caplog):
    p = policy()
    tags = (("application", "chattts"), ("deployment", "Acoustic"))
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        for _ in range(5):  # the controller calls it every 0.1 s
            p(context([(16, 20, 16)]))
        p(context([(6, 0, 16)]))
    desired, rows = p._gauges
    assert desired.values[tags] == 1
    assert rows.values[tags + (("kind", "running"),)] == 6
    assert rows.values[tags + (("kind", "target_per_replica"),)] == 12
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autoscale Acoustic")]
    assert len(lines) == 2, lines
    assert "running 16.0 + waiting 20.0" in lines[0] and "-> desired 3 (bounded 3, bounds [1, 8])" in lines[0]
    assert "-> desired 1" in lines[1]


def test_demand_flickering_past_the_bound_logs_once(caplog):
    """At max_replicas the raw demand may flip between max and max + 1 every tick: one line, as
    Serve acts on the bounded value."""
    p = policy()
    cfg = AutoscalingConfig(min_replicas=1, max_replicas=3)
    with caplog.at_level(logging.INFO, logger="ray.serve"):
        for i in range(10):
            p(context([(12, 0 if i % 2 else 1, 16)] * 3, config=cfg))  # 36 or 37 rows: 3 or 4 replicas
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("autoscale Acoustic")]
    assert len(lines) == 1 and "(bounded 3, bounds [1, 3])" in lines[0], lines


def test_metric_name_is_the_documented_one():
    assert DESIRED_METRIC == "tts_autoscale_desired_replicas"
    ops = (REPO / "docs" / "operations.md").read_text()
    assert DESIRED_METRIC in ops


# ----------------------------------------------------------------------------- as Serve loads it


def test_serve_builds_the_policy_from_the_config_names(tmp_path):
    """The config names it; Serve pickles the module by value, and the controller instantiates the
    class with policy_kwargs. The pickle must load where this package cannot be imported (a
    controller whose head node lacks it)."""
    spec = AutoscalingPolicy(policy_function=POLICY, policy_kwargs={"target_fill": 0.5})
    instance = _resolve_policy_callable(spec)
    assert isinstance(instance, EngineQueuePolicy) and instance.target_fill == 0.5
    pickled = tmp_path / "policy.pkl"
    pickled.write_bytes(spec.get_serialized_policy_def())
    code = (
        "import sys, importlib.abc\n"
        "class NoPackage(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('serve_app', 'deployments'):\n"
        "            raise ImportError('no ' + name + ' here')\n"
        "sys.meta_path.insert(0, NoPackage())\n"
        "from ray import cloudpickle\n"
        f"cls = cloudpickle.loads(open({str(pickled)!r}, 'rb').read())\n"
        "print(cls(target_fill=0.5).target_fill)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "0.5"


# ----------------------------------------------------------------------------- the shipped configs


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_acoustic_scales_on_the_engine_queue_and_cpu_stages_on_requests(name):
    deps = deployments(load(name))
    acoustic = AutoscalingConfig.model_validate(deps["Acoustic"]["autoscaling_config"])
    assert acoustic.policy.policy_function == POLICY
    assert isinstance(_resolve_policy_callable(acoustic.policy), EngineQueuePolicy)
    for stage in ("Ingress", "TextNormalizer", "Vocoder"):
        cfg = AutoscalingConfig.model_validate(deps[stage]["autoscaling_config"])
        assert cfg.policy.is_default_policy_function(), stage


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_streaming_stages_drain_for_the_longest_stream(name):
    """A replica removed by a downscale waits for its open streams; the longest lasts
    ingress.request_timeout_s (the Ingress cuts it there), so every stage a stream passes through
    must wait at least that long."""
    from serve_app.settings import AppConfig

    config = load(name)
    deps = deployments(config)
    longest = AppConfig.model_validate(copy.deepcopy(chattts_app(config)["args"])).ingress.request_timeout_s
    assert longest <= config["http_options"]["request_timeout_s"]
    for stage in ("Ingress", "Vocoder", "Acoustic"):
        assert deps[stage]["graceful_shutdown_timeout_s"] > longest, stage
        assert deps[stage]["graceful_shutdown_wait_loop_s"] <= 2, stage


def test_cpu_config_keeps_one_acoustic_replica_per_box():
    deps = deployments(load("cpu"))
    assert deps["Acoustic"]["autoscaling_config"]["max_replicas"] == 1
    assert deps["TextNormalizer"]["autoscaling_config"]["max_replicas"] > 1


def test_real_time_streams_wanted_over_the_measured_capacity_add_replicas():
    """Streams a replica keeps at 1x fill before its rows do: 9 streams wanted (carried, waiting,
    refused lately) over 2 replicas that keep 4 each at 1x want ceil(9 / (0.75 * 4)) = 3; rows
    alone would want 1. Unmeasured capacity adds nothing."""
    rows = [(2, 0, 16), (2, 0, 16)]
    ctx = context(rows, queued=0)
    for i, wanted in enumerate((5.0, 4.0)):
        ctx.aggregated_metrics.setdefault(STREAMS_WANTED, {})[f"r{i}"] = wanted
        ctx.aggregated_metrics.setdefault(STREAMS_CAPACITY, {})[f"r{i}"] = 4.0
    d = desired_replicas(ctx, 0.75)
    assert d.replicas == 3 and d.streams_wanted == 9.0 and d.streams_per_replica == 3.0
    del ctx.aggregated_metrics[STREAMS_CAPACITY]
    assert desired_replicas(ctx, 0.75).replicas == 1


def test_routing_offers_the_replicas_with_the_most_headroom_first():
    stats = {"a": 0.0, "b": 3.0, "c": None, "d": 1.0}
    groups = rank_by_headroom(list(stats), stats.get)
    assert groups[0] == ["b", "d"] and sorted(groups[1]) == ["a", "c"]
    assert sorted(rank_by_headroom(["x", "y"], lambda r: None)[0]) == ["x", "y"]  # nothing reported: both, either order
