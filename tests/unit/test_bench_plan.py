"""``python -m bench plan``'s model of the cluster (bench/lib/plansim.py): no Ray is started, the
project's policy and admission code run as the model calls them, on a simulated clock."""

from __future__ import annotations

import numpy as np
import pytest

import deployments.autoscaling
from bench.lib.plansim import Curve, Load, Shape, simulate, water_fill

# The local cluster test's Acoustic (tests/support/configs.py cluster_config): 4 rows, fill 0.5, 1..3.
AUTO = {
    "min_replicas": 1,
    "max_replicas": 3,
    "look_back_period_s": 3.0,
    "upscale_delay_s": 2.0,
    "downscale_delay_s": 6.0,
    "metrics_interval_s": 1.0,
    "policy": {"policy_function": "deployments.autoscaling:EngineQueuePolicy", "policy_kwargs": {"target_fill": 0.5}},
}
FAST = Curve("test", [(1, 9.0), (4, 10.0), (8, 11.0)], "a step well within real time")
LENGTHS = [60, 120, 180, 240]  # tokens: 1.3-5.1 s of audio


def shape(**kw) -> Shape:
    kw = {"replica_start_s": 5.0, "gpus_per_replica": 0.5, "vocoder_rate": 25.0, "vocoders_fixed": 4, **kw}
    return Shape(FAST, 4, dict(AUTO), **kw)


def steps(t: float) -> int:
    return 1 if t < 20 else (6 if t < 80 else 0)


def test_every_arrival_is_served_refused_or_still_in_flight():
    """Conservation, in a load past what the replicas can take (refusals and retries happen)."""
    for load in (
        Load(120.0, LENGTHS, rate=lambda t: 4.0),  # past 3 replicas x 5 streams of ~3 s: refusals
        Load(120.0, LENGTHS, clients=steps),
    ):
        tot = simulate(shape(), load, dt=0.1, seed=1, sample_s=1.0).totals
        assert tot["arrivals"] > 0
        assert tot["arrivals"] == tot["served"] + tot["refused_final"] + tot["in_flight_end"]
    assert simulate(shape(), Load(120.0, LENGTHS, rate=lambda t: 4.0), dt=0.1, seed=1).totals["refusals"] > 0


def test_a_step_of_load_scales_through_the_projects_policy(monkeypatch):
    """1 client -> 6 -> 0: the policy (deployments.autoscaling.desired_replicas, called by the model)
    asks for 3 replicas, they start after Serve's upscale delay and the start-up, and the count
    falls back to 1 after the downscale delay. With the policy replaced by one that always wants a
    single replica, nothing scales: the decision is the project's function."""
    calls = []
    real = deployments.autoscaling.desired_replicas

    def spy(ctx, target_fill):
        d = real(ctx, target_fill)
        calls.append(d)
        return d

    monkeypatch.setattr(deployments.autoscaling, "desired_replicas", spy)
    r = simulate(shape(), Load(120.0, LENGTHS, clients=steps), dt=0.1, seed=0, sample_s=1.0)
    t, running = np.array(r.t), np.array(r.series["running"])
    assert calls and max(d.replicas for d in calls if d) >= 3  # bounded to max_replicas 3
    assert running[t < 20].max() == 1
    up = t[(t >= 20) & (running == 3)]
    assert len(up) and up[0] - 20 <= AUTO["upscale_delay_s"] + AUTO["look_back_period_s"] + 5.0 + 2
    assert running[-1] == 1 and running[(t > 80) & (t < 80 + AUTO["downscale_delay_s"])].max() == 3

    monkeypatch.setattr(deployments.autoscaling, "desired_replicas", lambda ctx, fill: real(ctx, 2.0))
    flat = simulate(shape(), Load(120.0, LENGTHS, clients=steps), dt=0.1, seed=0, sample_s=1.0)
    assert max(flat.series["running"]) < 3


def test_a_seed_gives_the_same_report():
    load = Load(60.0, LENGTHS, rate=lambda t: 2.0 + t / 30)
    a, b = (simulate(shape(), load, dt=0.1, seed=7, sample_s=1.0) for _ in range(2))
    assert a.totals == b.totals and a.series == b.series and np.array_equal(a.ttfb_hist, b.ttfb_hist)
    assert simulate(shape(), load, dt=0.1, seed=8, sample_s=1.0).totals != a.totals


@pytest.mark.parametrize("k", [0, 1, 5, 13, 100])
def test_water_fill_gives_the_most_room_first(k):
    room = np.array([5, 0, 3, 8, 1])
    take = water_fill(room, k)
    assert take.sum() == min(k, room.sum()) and np.all(take <= room)
    left = room - take
    assert left[take > 0].min(initial=99) >= left.max() - 1  # no replica left with more than one more free


def test_the_runner_writes_its_report(tmp_path):
    """``python -m bench plan`` end to end on a short day of a small fleet: its JSON, Markdown and plot."""
    import json

    from bench.__main__ import main

    assert main(["plan", "--gpus", "4", "--hours", "0.05", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "plan.json").read_text())
    day = report["scenarios"]["4"]
    assert day["totals"]["arrivals"] > 0 and day["provisioning"] and day["gpu_hours"] > 0
    assert "| 4 GPUs, a day |" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "report.png").stat().st_size > 10000
