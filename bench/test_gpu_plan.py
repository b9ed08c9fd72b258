"""The GPU check's Serve configs (pure, no Ray): the dry run (tests/system/test_gpu.py) starts only
the two-replica variant, so the other variant's config is checked here."""

from __future__ import annotations

from bench.gpu_plan import SERVE_VARIANTS, GpuPlan, serve_config
from bench.lib.serve import args_path, deployment_path, get_path, load_config


def test_each_variant_asks_for_its_gpu_share_and_one_replica_gets_the_slots_of_two():
    base = load_config(GpuPlan().config)
    args, acoustic = args_path(base), deployment_path(base, "Acoustic")
    cfgs = {v: serve_config(GpuPlan(), v, port=20001)[0] for v in SERVE_VARIANTS}
    for variant, (replicas, num_gpus) in SERVE_VARIANTS.items():
        cfg = cfgs[variant]
        assert get_path(cfg, f"{acoustic}.ray_actor_options.num_gpus") == num_gpus
        auto = get_path(cfg, f"{acoustic}.autoscaling_config")
        assert auto["min_replicas"] == auto["max_replicas"] == replicas
        assert get_path(cfg, f"{args}.model.device") == "cuda"
        assert get_path(cfg, f"{args}.model.weights.source") == "random"
    one, two = cfgs["serve_1x1"], cfgs["serve_2x0.5"]
    for key in ("max_rows", "token_budget"):
        assert get_path(one, f"{args}.acoustic.{key}") == 2 * get_path(two, f"{args}.acoustic.{key}")
    assert get_path(one, f"{acoustic}.max_ongoing_requests") == 2 * get_path(two, f"{acoustic}.max_ongoing_requests")


def test_a_dry_run_reserves_no_gpu_and_decodes_on_cpu():
    cfg, shown = serve_config(GpuPlan.dry(), "serve_1x1", port=20001)
    acoustic = deployment_path(cfg, "Acoustic")
    assert get_path(cfg, f"{acoustic}.ray_actor_options.num_gpus") == 0
    assert shown["args.model.device"] == "cpu" and shown["model.weights.source"] == "random-tiny"
