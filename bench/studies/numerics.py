"""int8 GPT linear layers (``model.quantize: int8``, serve_app/engine/quant.py) against float32.

Three measurements, all in one process on one set of weights:

* ``layers``: the kernel candidates on single full-size layers (768x3072 and 3072x768) at 1, 8
  and 16 rows: float32 in torch's layout and in (in, out) layout, torch's ``quantize_dynamic``,
  the project's ``Int8Linear``, and torchao's int8 configs when torchao is installed;
* ``throughput`` (through bench/ceiling.py): the engine at batch 1/8/16 with the GPT's linear
  layers swapped in place between float32 (torch layout), float32 dual layout and int8, runs
  interleaved so the three share whatever else the machine is doing; decode step time (GPT
  forward alone, and the engine's whole step) and audio seconds per second;
* ``numerics``: near-greedy decoding (temperature 1e-5; ``top_k=1`` is not greedy in ChatTTS,
  its warpers keep 3 candidates) of the same segments in float32 and int8, how many tokens agree
  before the first difference; and the teacher-forced hidden-state cosine: both GPTs read the
  float32 run's exact inputs (its prompt and its tokens) and their hidden states are compared
  position by position.

    python -m bench numerics layers --out layers.json [--reps 7]
    python -m bench numerics profile --out profile.json [--quantize int8] [--batches 1,8]
    python -m bench ceiling --out ceiling.json --quantize-only     # throughput + numerics

``quantize_markdown`` renders the ceiling's int8 section in the run report (bench/run_report.py).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Optional

from ..lib.harness import logger
from ..lib.report import Col, Table
from ..lib.report import fmt as _f
from ..lib.stats import mean
from ..lib.stats import median as _median

VARIANTS = ("fp32", "fp32-dual", "int8")
_log = logger("numerics")


# ---------------------------------------------------------------------------------- variants


class LinearVariants:
    """The GPT's linear layers as float32 (torch layout), float32 dual layout and int8, built once
    from the loaded weights (no float copy for ``fp32``: it shares the loaded parameters), and
    swapped in place so every engine built on the model uses the installed one."""

    def __init__(self, gpt: Any):
        from torch import nn

        from serve_app.engine.linear import DualLayoutLinear
        from serve_app.engine.quant import Int8Linear

        self.slots = [
            (parent, name, child)
            for parent in gpt.modules()
            for name, child in parent.named_children()
            if isinstance(child, (nn.Linear, DualLayoutLinear))
        ]
        if not self.slots:
            raise ValueError("the GPT has no float linear layers (loaded with quantize already?)")
        plain, dual, int8 = [], [], []
        for _parent, _name, child in self.slots:
            lin = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
            lin.weight, lin.bias = child.weight, child.bias  # the loaded parameters, not copies
            plain.append(lin)
            dual.append(child if isinstance(child, DualLayoutLinear) else DualLayoutLinear(child))
            int8.append(Int8Linear(child))
        self.modules = {"fp32": plain, "fp32-dual": dual, "int8": int8}
        self.installed: Optional[str] = None

    def install(self, variant: str) -> None:
        for (parent, name, _child), module in zip(self.slots, self.modules[variant]):
            setattr(parent, name, module)
        self.installed = variant


class GptRecorder:
    """Hooks on the GPT: the time of every one-token-per-row (decode step) forward with the
    variant it ran, and, when ``keep_inputs``, every call's input embeddings (the prefill's, then
    each step's). With ``rotate`` the next variant is installed before each decode step, so the
    variants share every burst of load from other processes (the steps are interleaved).

    The hooks sit on the first layer's input norm (a forward starts there: its input is the
    embeddings) and the final norm (it ends there), so they see the engine's written-out decode
    step (decode/forward.py) and transformers' forward alike."""

    def __init__(self, gpt: Any, variants: LinearVariants):
        self.variants = variants
        self.steps: list[tuple[Optional[str], float]] = []
        self.inputs: list[Any] = []
        self.keep_inputs = self.rotate = False
        self._next = 0
        self._t0 = 0.0
        self._handles = [
            gpt.layers[0].input_layernorm.register_forward_pre_hook(self._pre),
            gpt.norm.register_forward_hook(self._post),
        ]

    def _pre(self, _module: Any, args: tuple) -> None:
        emb = args[0]  # (rows, tokens, hidden): the embeddings the forward started from
        if self.keep_inputs:
            self.inputs.append(emb.detach().clone())
        if self.rotate and emb.shape[1] == 1:
            self.variants.install(VARIANTS[self._next % len(VARIANTS)])
            self._next += 1
        self._t0 = time.perf_counter()

    def _post(self, _module: Any, args: tuple, _out: Any) -> None:
        if args[0].shape[1] == 1:
            self.steps.append((self.variants.installed, time.perf_counter() - self._t0))

    def reset(self, keep_inputs: bool = False, rotate: bool = False) -> None:
        self.steps, self.inputs, self.keep_inputs, self.rotate, self._next = [], [], keep_inputs, rotate, 0

    def close(self) -> None:
        for h in self._handles:
            h.remove()


# ---------------------------------------------------------------------------------- throughput


def interleaved_steps(run_engine: Callable[[int, int], dict], recorder: GptRecorder, n: int, tokens: int) -> dict:
    """One engine run of ``n`` rows whose decode steps rotate through the variants: each variant's
    median GPT step, and int8's speed-up as the median over consecutive (fp32, fp32-dual, int8)
    triples of the per-triple ratio (robust to load that comes and goes)."""
    recorder.reset(rotate=True)
    try:
        run_engine(n, tokens)
    finally:
        recorder.rotate = False
    steps = recorder.steps
    triples = [dict(steps[i : i + 3]) for i in range(0, len(steps) - 2, 3)]
    triples = [t for t in triples if len(t) == 3]
    out: dict = {"steps": len(steps), "raw_ms": [[name, round(1e3 * dt, 1)] for name, dt in steps]}
    for v in VARIANTS:
        mine = [dt for name, dt in steps if name == v]
        out[f"{v}_ms"] = round(1e3 * _median(mine), 2)
        out[f"{v}_mean_ms"] = round(1e3 * mean(mine), 2)  # tails count for throughput
    for base in ("fp32", "fp32-dual"):
        out[f"int8_speedup_vs_{base}"] = round(_median([t[base] / t["int8"] for t in triples]), 3)
        out[f"int8_speedup_of_means_vs_{base}"] = round(out[f"{base}_mean_ms"] / out["int8_mean_ms"], 3)
    return out


def compare_throughput(
    run_engine: Callable[[int, int], dict],
    variants: LinearVariants,
    recorder: GptRecorder,
    batches: list[int],
    tokens: int,
    reps: int,
) -> dict:
    """Per batch size: the GPT step of each variant from ``interleaved_steps`` (one run), then
    ``run_engine(n, tokens)`` (Ceiling.run_engine: decode and vocode) under each variant for
    audio seconds per second and the engine's whole step, the variants back to back in each of
    ``reps`` repetitions (order reversed every other one); ratios per repetition, medians."""
    for v in VARIANTS:  # warm-up: first calls allocate, fbgemm packs its buffers
        variants.install(v)
        run_engine(2, 8)
    out: dict = {"variants": list(VARIANTS), "tokens_per_row": tokens, "reps": reps, "batches": {}}
    for n in batches:
        row: dict = {"gpt_step": interleaved_steps(run_engine, recorder, n, tokens)}
        g = row["gpt_step"]
        _log(
            f"batch {n} GPT step (interleaved): "
            + ", ".join(f"{v} {g[v + '_ms']} ms" for v in VARIANTS)
            + f"; int8 x{g['int8_speedup_vs_fp32']} vs fp32, x{g['int8_speedup_vs_fp32-dual']} vs fp32-dual"
        )
        runs: dict[str, list[dict]] = {v: [] for v in VARIANTS}
        for r in range(reps):
            for v in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                variants.install(v)
                res = run_engine(n, tokens)
                runs[v].append(
                    {
                        "audio_s_per_s": res["audio_s"] / res["wall_s"],
                        "engine_step_ms": 1e3 * (res["decode_s"] - res["prefill_s"]) / max(1, res["steps"]),
                    }
                )
                _log(
                    f"batch {n} rep {r + 1} {v}: engine step {runs[v][-1]['engine_step_ms']:.1f} ms, "
                    f"{runs[v][-1]['audio_s_per_s']:.3f} audio s/s"
                )
        if reps < 1:  # GPT step only
            out["batches"][str(n)] = row
            continue
        for v in VARIANTS:
            row[v] = {k: round(_median([x[k] for x in runs[v]]), 4) for k in ("audio_s_per_s", "engine_step_ms")}
            row[v]["audio_s_per_s_runs"] = [round(x["audio_s_per_s"], 4) for x in runs[v]]
        for base in ("fp32", "fp32-dual"):
            row[f"int8_audio_ratio_vs_{base}"] = round(
                _median([q["audio_s_per_s"] / b["audio_s_per_s"] for b, q in zip(runs[base], runs["int8"])]), 3
            )
            row[f"int8_engine_step_speedup_vs_{base}"] = round(
                _median([b["engine_step_ms"] / q["engine_step_ms"] for b, q in zip(runs[base], runs["int8"])]), 3
            )
        out["batches"][str(n)] = row
    return out


# ---------------------------------------------------------------------------------- numerics


def _cosines(a: Any, b: Any) -> Any:
    import torch

    return torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1)


def near_greedy_inputs(model: Any, recorder: GptRecorder, seg: Any, tokens: int) -> tuple[Any, list]:
    """Decode ``seg`` alone at temperature 1e-5 for ``tokens`` tokens with the installed variant;
    returns the prefill's inputs_embeds (1, P, H) and each step's (one per token fed back)."""
    from serve_app.engine.acoustic import AcousticConfig, AcousticEngine

    eng = AcousticEngine(model, AcousticConfig(token_budget=1 << 20))
    req = dataclasses.replace(seg, temperature=1e-5, max_new_tokens=tokens, target_tokens=tokens)
    recorder.reset(keep_inputs=True)
    stream = eng.submit(req)
    eng.run_until_idle()
    list(stream)
    recorder.keep_inputs = False
    prefill, *steps = recorder.inputs
    return prefill, [s[0, 0] for s in steps]


def compare_numerics(
    model: Any,
    variants: LinearVariants,
    recorder: GptRecorder,
    segments: list,
    tf_tokens: int = 200,
    agree_tokens: int = 100,
) -> dict:
    """Token agreement (near-greedy, int8 vs float32 dual) over the first ``agree_tokens`` and the
    teacher-forced hidden-state cosine over ``tf_tokens`` positions, per segment."""
    import torch

    gpt = model.chat.gpt.gpt
    per_seg = []
    for i, seg in enumerate(segments):
        fed: dict[str, tuple] = {}
        for v in ("fp32-dual", "int8", "fp32"):
            variants.install(v)
            fed[v] = near_greedy_inputs(model, recorder, seg, max(tf_tokens, agree_tokens) + 1)
        ref_steps = fed["fp32-dual"][1]

        def agreement(steps: list, ref_steps: list = ref_steps) -> tuple[int, list[bool]]:
            n = min(agree_tokens, len(ref_steps), len(steps))
            same = [bool(torch.equal(a, b)) for a, b in zip(ref_steps[:n], steps[:n])]
            return (same.index(False) if False in same else n), same

        first_diff, same = agreement(fed["int8"][1])
        n = len(same)
        # Control: float32 in torch's layout differs from the dual layout by rounding only (~1e-6):
        # how far near-greedy decoding of these weights goes before such a difference flips a token.
        control_first_diff = agreement(fed["fp32"][1])[0]
        # Teacher forcing: the float32 run's prompt and tokens, one causal forward per variant.
        prefill = fed["fp32-dual"][0]
        seq = torch.cat([prefill, torch.stack(ref_steps[:tf_tokens])[None].to(prefill.dtype)], 1)
        hidden = {}
        for v in ("fp32-dual", "int8"):
            variants.install(v)
            with torch.inference_mode():
                h = gpt(inputs_embeds=seq).last_hidden_state[0]
            # Position P-1 + t produced token t: the hidden states the vocoder would get.
            hidden[v] = h[prefill.shape[1] - 1 : prefill.shape[1] - 1 + tf_tokens]
        cos = _cosines(hidden["int8"], hidden["fp32-dual"])
        per_seg.append(
            {
                "text": seg.text,
                "prompt_tokens": int(prefill.shape[1]),
                "agree_tokens": n,
                "tokens_equal_before_first_difference": first_diff,
                "tokens_equal_share": round(sum(same) / n, 4),
                "control_fp32_vs_dual_tokens_equal_before_first_difference": control_first_diff,
                "tf_positions": int(cos.numel()),
                "tf_cosine_min": round(float(cos.min()), 5),
                "tf_cosine_mean": round(float(cos.mean()), 5),
                "tf_cosine_p01": round(float(cos.quantile(0.01)), 5),
            }
        )
        _log(
            f"segment {i}: {first_diff}/{n} tokens before the first difference (fp32 vs dual: {control_first_diff}), teacher-forced cosine "
            f"min {per_seg[-1]['tf_cosine_min']} mean {per_seg[-1]['tf_cosine_mean']}"
        )
    return {
        "reference": "fp32-dual",
        "temperature": 1e-5,
        "segments": per_seg,
        "tf_cosine_min": min(s["tf_cosine_min"] for s in per_seg),
        "tf_cosine_mean": round(mean(s["tf_cosine_mean"] for s in per_seg), 5),
        "tokens_equal_before_first_difference": [s["tokens_equal_before_first_difference"] for s in per_seg],
        "control_fp32_vs_dual": [s["control_fp32_vs_dual_tokens_equal_before_first_difference"] for s in per_seg],
        "agree_tokens": agree_tokens,
    }


# ---------------------------------------------------------------------------------- layers


def _layer_candidates(lin: Any) -> dict[str, Callable]:
    import torch
    import torch.nn.functional as F
    from torch import nn

    from serve_app.engine.quant import Int8Linear

    w_t = lin.weight.detach().t().contiguous()
    cands: dict[str, Callable] = {
        "fp32": lambda x: F.linear(x, lin.weight, lin.bias),
        "fp32 (in,out)": lambda x: x @ w_t + lin.bias,
        "Int8Linear (project)": Int8Linear(lin),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cands["torch quantize_dynamic"] = torch.ao.quantization.quantize_dynamic(
            nn.Sequential(copy.deepcopy(lin)), {nn.Linear}, dtype=torch.qint8
        )
    try:
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        return cands
    for label, config in (
        ("torchao int8 weight-only", Int8WeightOnlyConfig()),
        ("torchao int8 dynamic", Int8DynamicActivationInt8WeightConfig()),
    ):
        m = nn.Sequential(copy.deepcopy(lin))
        quantize_(m, config)
        cands[label] = m
    return cands


def compare_layers(reps: int = 7, calls: int = 50, rows: tuple[int, ...] = (1, 8, 16)) -> dict:
    """Median microseconds per call (``calls`` calls per repetition, candidates interleaved) and
    relative error against float32, per layer shape and row count."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    out: dict = {}
    with torch.inference_mode():
        for n_in, n_out in ((768, 3072), (3072, 768)):
            lin = nn.Linear(n_in, n_out)
            nn.init.normal_(lin.weight, std=0.02)  # transformers' init of the GPT's layers
            cands = _layer_candidates(lin)
            for n in rows:
                x = torch.randn(n, 1, n_in)
                ref = cands["fp32"](x)
                times: dict[str, list[float]] = {k: [] for k in cands}
                for _ in range(reps):
                    for k, f in cands.items():
                        for _ in range(3):
                            f(x)
                        t0 = time.perf_counter()
                        for _ in range(calls):
                            f(x)
                        times[k].append((time.perf_counter() - t0) / calls * 1e6)
                base = _median(times["fp32"])
                key = f"{n_in}x{n_out} rows {n}"
                out[key] = {
                    k: {
                        "us": round(_median(times[k]), 1),
                        "speedup_vs_fp32": round(base / _median(times[k]), 2),
                        "rel_err": round(float((f(x) - ref).norm() / ref.norm()), 4),
                    }
                    for k, f in cands.items()
                }
                _log(key + ": " + ", ".join(f"{k} {v['us']} us" for k, v in out[key].items()))
    return out


# ---------------------------------------------------------------------------------- profile

# Where a decode step's time goes, by torch profiler op name (self CPU time).
OP_GROUPS = (
    ("int8 linear (fbgemm)", ("quantized::",)),
    ("float linear", ("aten::mm", "aten::addmm", "aten::linear", "aten::matmul", "aten::bmm")),
    ("attention (SDPA)", ("scaled_dot_product", "_flash_attention", "aten::_efficient_attention")),
    ("Int8Linear row scale (norm, clamp)", ("aten::linalg_vector_norm", "aten::clamp_min")),
    (
        "heads' weight norm + sampling",
        (
            "_weight_norm_interface",
            "aten::sort",
            "aten::exponential_",
            "aten::multinomial",
            "softmax",
            "aten::topk",
            "aten::cumsum",
            "aten::scatter",
        ),
    ),
)


def profile_steps(quantize: str, batch: int, tokens: int, threads: int, weights: str = "random") -> dict:
    """torch.profiler over the decode steps of ``batch`` rows (the model loaded by ``load_model``
    with ``model.quantize``), self CPU time by op group and the top ops."""
    from torch.profiler import ProfilerActivity, profile

    from serve_app.engine.acoustic import AcousticConfig, AcousticEngine, SegmentRequest
    from serve_app.engine.config import ModelConfig, WeightsConfig
    from serve_app.engine.voices import speaker_from_seed
    from serve_app.engine.weights.loading import load_model

    model = load_model(
        ModelConfig(weights=WeightsConfig(source=weights), device="cpu", torch_threads=threads, quantize=quantize)
    )
    with open("/proc/self/statm") as f:  # resident pages after loading: what the layers cost in RAM
        rss_mib = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    eng = AcousticEngine(model, AcousticConfig(max_rows=max(16, batch), token_budget=1 << 20))
    spk = speaker_from_seed(model.chat.speaker, 1)
    reqs = [
        SegmentRequest(
            text="今天天气很好，我们出去走走吧。", spk_emb=spk, seed=i, max_new_tokens=tokens, target_tokens=tokens
        )
        for i in range(batch)
    ]
    for r in reqs:
        eng.submit(r)
    for _ in range(3):  # admission (prefill) and two warm steps stay out of the profile
        eng.step()
    steps0 = eng.stats.steps
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        eng.run_until_idle()
    n_steps = eng.stats.steps - steps0
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    groups: dict[str, float] = {}
    for e in events:
        label = next((g for g, keys in OP_GROUPS if any(k in e.key for k in keys)), "other")
        groups[label] = groups.get(label, 0.0) + e.self_cpu_time_total
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    return {
        "quantize": quantize,
        "batch": batch,
        "steps": n_steps,
        "rss_mib_after_load": round(rss_mib),
        "ms_per_step": round(total / 1e3 / max(1, n_steps), 2),
        "share_pct": {g: round(100 * t / total, 1) for g, t in sorted(groups.items(), key=lambda kv: -kv[1])},
        "top_ops": [
            [e.key, round(e.self_cpu_time_total / 1e3 / max(1, n_steps), 2), e.count // max(1, n_steps)] for e in top
        ],
    }


NUMERICS_COLUMNS = [
    Col("segment", 0),
    Col("prompt tokens", lambda x: str(x[1].get("prompt_tokens"))),
    Col(
        "near-greedy tokens equal before the first difference",
        lambda x: f"{x[1].get('tokens_equal_before_first_difference')} of {x[1].get('agree_tokens')}",
    ),
    Col("same, fp32 vs fp32-dual (control)", (1, "control_fp32_vs_dual_tokens_equal_before_first_difference")),
    Col("teacher-forced positions", lambda x: str(x[1].get("tf_positions"))),
    Col("hidden cosine min", (1, "tf_cosine_min"), nd=5),
    Col("p01", (1, "tf_cosine_p01"), nd=5),
    Col("mean", (1, "tf_cosine_mean"), nd=5),
]


def quantize_markdown(q: Optional[dict]) -> list[str]:
    """The ceiling's int8 vs float32 rows and numerics table (this module), if it has them."""
    if not q:
        return []
    variants = q.get("variants", [])
    step = lambda x: x[1].get("gpt_step") or {}  # noqa: E731
    cols = [Col("batch", 0)]
    cols += [Col(f"GPT step {v} ms", lambda x, v=v: step(x).get(f"{v}_ms"), nd=1) for v in variants]
    cols += [
        Col(
            head,
            lambda x, b=b: (
                f"{_f(step(x).get(f'int8_speedup_vs_{b}'))} / {_f(step(x).get(f'int8_speedup_of_means_vs_{b}'))}"
            ),
        )
        for head, b in (("int8 speed-up vs fp32 (median / of means)", "fp32"), ("vs fp32-dual", "fp32-dual"))
    ]
    cols += [Col(f"engine step {v} ms", (1, v, "engine_step_ms"), nd=1) for v in variants]
    cols += [Col(f"audio s/s {v}", (1, v, "audio_s_per_s"), nd=3) for v in variants]
    cols.append(Col("int8 audio s/s vs fp32-dual", (1, "int8_audio_ratio_vs_fp32-dual")))
    lines = [
        "",
        "### int8 vs float32 (`model.quantize`)",
        "",
        f"{q.get('tokens_per_row')} tokens per row. GPT step: the GPT forward of a decode step, median over one run "
        "whose steps rotate through the variants (speed-up: median of the per-rotation ratios / ratio of the mean "
        "steps). Engine step (the "
        f"whole step, sampling included) and audio s/s (decode and vocode): medians of {q.get('reps')} runs per "
        "variant, interleaved.",
        "",
        *Table(cols, sorted(q.get("batches", {}).items(), key=lambda kv: int(kv[0]))).lines(),
    ]
    num = q.get("numerics")
    if num:
        lines += ["", f"Numerics, int8 against {num.get('reference')} on the same weights:", ""]
        lines += Table(NUMERICS_COLUMNS, enumerate(num.get("segments", []))).lines()
    return lines


# ---------------------------------------------------------------------------------- command


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("what", choices=["layers", "profile"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=7, help="layers: repetitions")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantize", default="int8", help="profile: model.quantize")
    ap.add_argument("--batches", default="1,8", help="profile: batch sizes")
    ap.add_argument("--tokens", type=int, default=40, help="profile: tokens per row")
    ap.add_argument("--weights", default="random", help="profile: weights source")


def main(args: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(args.threads)
    result: dict = {"torch": torch.__version__, "torch_threads": args.threads}
    if args.what == "layers":
        result["layers"] = compare_layers(args.reps)
    else:
        result["profile"] = [
            profile_steps(args.quantize, int(b), args.tokens, args.threads, args.weights)
            for b in args.batches.split(",")
        ]
        for p in result["profile"]:
            _log(f"{p['quantize']} batch {p['batch']}: {p['ms_per_step']} ms/step (profiled), {p['share_pct']}")
    Path(args.out).write_text(json.dumps(result, indent=2))
    return 0
