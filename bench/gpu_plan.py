"""What the GPU check runs (``python -m bench gpu``): its steps, the Serve variants it compares,
``GpuPlan`` (sizes, budgets and the dry run's tiny ones) and each variant's Serve config.

Pure (no Ray, no torch, nothing run): ``bench/test_gpu_plan.py`` checks the variants' configs
here, apart from running the steps (``gpu_steps.py``) and reporting them (``gpu_report.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .lib.procs import REPO_ROOT
from .lib.serve import GPU_CONFIG

STEPS = ("tests", "fidelity", "ceiling", "serve_2x0.5", "serve_1x1")
# name -> (Acoustic replicas, num_gpus each). The single replica gets the decode slots of both.
SERVE_VARIANTS = {"serve_2x0.5": (2, 0.5), "serve_1x1": (1, 1.0)}


@dataclass
class GpuPlan:
    dry_run: bool = False
    weights: str = "random"
    device: str = "cuda"
    dtype: str = "bfloat16"
    steps: tuple = STEPS
    deadline_s: float = 480.0
    tests_timeout_s: float = 100.0
    tests_filter: str = "cuda"  # pytest -k: the CPU pairs already run in CI
    tests_paths: tuple = ("tests",)  # where pytest collects the gpu-marked tests
    # Batch invariance in the GPU's dtypes (python -m bench fidelity): rows alone vs batched vs ChatTTS.
    fidelity_precisions: str = "bfloat16,float16"
    fidelity_rows: int = 4
    fidelity_tokens: int = 40
    fidelity_timeout_s: float = 90.0
    ceiling_batches: list = field(default_factory=lambda: [1, 8, 32, 64])
    ceiling_reps: int = 1
    first_chunk_reps: int = 3
    ceiling_timeout_s: float = 150.0  # the first run on a machine also builds the random weights
    ceiling_threads: Optional[int] = None  # torch's default: all cores
    serve_levels: list = field(default_factory=lambda: [1, 16, 64])
    level_s: float = 20.0
    min_level_s: float = 8.0
    vocoder_replicas: int = 4  # fixed (no autoscaling mid-phase): 4 x 2 CPUs of the box's 16
    ray_cpus: Optional[float] = None
    request_timeout_s: float = 120.0
    texts: Optional[tuple] = None  # request texts (None: bench/corpus.txt)
    config: str = GPU_CONFIG.relative_to(REPO_ROOT).as_posix()  # from the repository root

    @classmethod
    def dry(cls, **kw) -> "GpuPlan":
        # The tests step checks its own plumbing on one test's cases (CI runs the CPU pairs anyway).
        base = dict(
            dry_run=True,
            weights="random-tiny",
            device="cpu",
            tests_filter="same_tokens",
            # Only the module that holds them: collecting the whole suite costs more than the cases.
            tests_paths=("tests/system/test_gpu.py",),
            tests_timeout_s=240.0,
            fidelity_precisions="float32",
            fidelity_rows=3,
            fidelity_tokens=12,
            fidelity_timeout_s=120.0,
            ceiling_batches=[1, 2],
            first_chunk_reps=1,
            ceiling_timeout_s=120.0,
            ceiling_threads=1,
            serve_levels=[1, 2],
            level_s=4.0,
            min_level_s=2.0,
            vocoder_replicas=1,
            # Short texts: a tiny model on 2 busy cores still completes requests in 4 s.
            texts=("你好。", "Hello there.", "好的，谢谢。", "Thanks a lot."),
            # Logical CPUs as on the GPU box, so the config's CPU requests fit on 2 cores.
            ray_cpus=16.0,
        )
        base.update(kw)
        return cls(**base)


def serve_config(plan: GpuPlan, variant: str, port: int) -> tuple[dict, dict]:
    """config/serve.gpu.yaml for one variant, and the overrides applied to it (for the report)."""
    from .lib.serve import apply_overrides, args_path, deployment_path, get_path, load_config, set_replicas

    replicas, num_gpus = SERVE_VARIANTS[variant]
    base = load_config(plan.config)
    args = args_path(base)
    acoustic = deployment_path(base, "Acoustic")
    # A dry run has no GPU to reserve: the replicas ask for none (and decode on CPU).
    overrides: dict[str, Any] = {
        f"{args}.model.device": plan.device,
        f"{acoustic}.ray_actor_options.num_gpus": 0 if plan.dry_run else num_gpus,
    }
    if replicas == 1:
        # One replica holds the decode slots of the two it replaces (else it is half the capacity).
        per_replica = get_path(base, f"{args}.acoustic") or {}
        for key in ("max_rows", "token_budget"):
            if key in per_replica:
                overrides[f"{args}.acoustic.{key}"] = 2 * per_replica[key]
        ongoing = get_path(base, f"{acoustic}.max_ongoing_requests")
        if ongoing:
            overrides[f"{acoustic}.max_ongoing_requests"] = 2 * ongoing
    cfg = apply_overrides(base, weights=plan.weights, port=port, overrides=overrides)
    set_replicas(cfg, "Acoustic", replicas)
    set_replicas(cfg, "Vocoder", plan.vocoder_replicas)
    shown = {k.replace(f"{args}.", "args.").replace(f"{acoustic}.", "Acoustic."): v for k, v in overrides.items()}
    shown.update(
        {"model.weights.source": plan.weights, "Acoustic.replicas": replicas, "Vocoder.replicas": plan.vocoder_replicas}
    )
    return cfg, shown
