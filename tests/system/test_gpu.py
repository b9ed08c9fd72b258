"""The engine across devices and dtypes, against the CPU float32 decode (random-tiny weights).

The matrix tests are marked ``gpu`` (``pytest -m gpu`` selects them; ``python -m bench gpu`` runs
them on a GPU machine) and run in the normal suite too: on CPU in float32 and bfloat16, so the
reduced-precision path is exercised in CI; with CUDA also cuda float32, bfloat16 and float16.
The last test runs ``python -m bench gpu --dry-run`` (not marked ``gpu``: the check it runs
selects ``-m gpu`` itself).

What "the same decode" means per dtype (measured on these weights, see TOLERANCE): rows decode
near-greedily (temperature 1e-5, no repetition penalty: the token is the arg-max of the logits;
``top_k=1`` would not do it, ChatTTS's warpers keep at least 3 candidates). Random weights give
flat logits: the gap between a codebook's best and second-best code is often ~1e-3, so a
bfloat16 decode, whose logits differ from float32 by ~1e-2, picks another code within a few tokens
and the rows diverge from there. Such a switch is legitimate only where the reference's gap is
within the dtype's logit error; so each row must keep the reference's tokens at least up to its
first near-tie, and while both decodes have had the same tokens their hidden states and logits must
agree within the dtype's tolerance.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.utils.parametrize as P
from support.early import EarlyRun
from support.engine import drain, fixed_chunks, seg, streamed_vs_one_shot

from bench.lib.procs import bench_command
from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import ModelConfig
from serve_app.engine.decode.batch import KV_HEADROOM
from serve_app.engine.vocoder import VocoderEngine
from serve_app.engine.weights.loading import load_model

CUDA = torch.cuda.is_available()
_no_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")

# (device, dtype) pairs: CI runs the CPU ones; a GPU machine all five.
TARGETS = [
    pytest.param("cpu", "float32", id="cpu-float32"),
    pytest.param("cpu", "bfloat16", id="cpu-bfloat16"),
    pytest.param("cuda", "float32", id="cuda-float32", marks=_no_cuda),
    pytest.param("cuda", "bfloat16", id="cuda-bfloat16", marks=_no_cuda),
    pytest.param("cuda", "float16", id="cuda-float16", marks=_no_cuda),
]
device_dtype = pytest.mark.parametrize("device, dtype", TARGETS)

# Max |difference| from the CPU float32 decode while both rows have had the same tokens:
# (logits, hidden states). Measured on CPU over 4 rows x 60 tokens: float32 with the other GEMM
# layout 0 / 0, float16 1.5e-3 / 4.8e-3, bfloat16 1.1e-2 / 4.7e-2 (hidden states peak at ~4.5);
# the tolerances are ~3x that (float32: what cuBLAS vs MKL rounding can give).
TOLERANCE = {"float32": (2e-4, 1e-3), "float16": (5e-3, 2e-2), "bfloat16": (4e-2, 0.15)}
# Below this gap between the best two codes, temperature 1e-5 is no longer surely greedy (the
# second code gets exp(-gap / 1e-5) of the first's weight, 2e-9 here): the comparison stops there.
GREEDY_GAP = 2e-4
NEAR_GREEDY = dict(temperature=1e-5, repetition_penalty=1.0)
TOKENS = 48
# Texts of different lengths (left padding in the batch) and seeds; decoded as one batch.
ROWS = [
    ("你好，欢迎使用语音合成服务。", 1),
    ("hello world", 2),
    ("今天天气很好，我们出去走走吧，顺便买点东西回来。", 3),
    ("the quick brown fox jumps over the lazy dog", 4),
    ("一二三", 5),
    ("测试一下批处理的正确性。", 6),
    ("one more row here, with a longer text than most", 7),
    ("好", 8),
]


@pytest.fixture(scope="module")
def model_on(tiny_weights_config):
    """Loader of the tiny model on (device, dtype), one per pair per module. On CPU float32 it
    is loaded without the transposed GEMM copy the reference uses, so even that pair compares two
    different kernels."""
    loaded = {}

    def get(device: str, dtype: str):
        if (device, dtype) not in loaded:
            cfg = ModelConfig(
                weights=tiny_weights_config,
                device=device,
                dtype=dtype,
                torch_threads=1,
                cpu_dual_layout=False,
                quantize="none",
            )  # the dtype itself (int8: test_quant.py)
            loaded[device, dtype] = load_model(cfg)
        return loaded[device, dtype]

    return get


def decode_rows(model, spk: str) -> list[torch.Tensor]:
    engine = AcousticEngine(model, fixed_chunks(max_rows=len(ROWS)))
    streams = [engine.submit(seg(spk, TOKENS, seed=s, text=t, **NEAR_GREEDY)) for t, s in ROWS]
    engine.run_until_idle()
    assert engine.stats.max_rows == len(ROWS)
    return [drain(s)[1] for s in streams]


@pytest.fixture(scope="module")
def reference_rows(tiny_model, spk) -> list[torch.Tensor]:
    return decode_rows(tiny_model, spk)


def code_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """(T, 4, V-1) logits of every codebook without end-of-speech (masked in these rows), in
    float32 on CPU like the engine's sampling."""
    embed = model.chat.embed
    with torch.inference_mode(), P.cached():
        logits = torch.stack([head(hidden) for head in embed.head_code], 1).float()
    return logits[..., :-1]


def gap(logits: torch.Tensor) -> torch.Tensor:
    """Per token, the smallest gap between best and second-best code over the codebooks."""
    top2 = logits.topk(2, dim=-1).values
    return (top2[..., 0] - top2[..., 1]).min(-1).values


def first(mask: torch.Tensor) -> int:
    idx = mask.nonzero()
    return int(idx[0]) if len(idx) else len(mask)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@device_dtype
def test_same_tokens_as_cpu_float32(device, dtype, model_on, tiny_model, spk, reference_rows, record_property):
    tol_logits, tol_hidden = TOLERANCE[dtype]
    rows = decode_rows(model_on(device, dtype), spk)
    same_tokens, compared, worst_logits, worst_hidden = [], [], 0.0, 0.0
    for i, (ref, got) in enumerate(zip(reference_rows, rows)):
        assert got.shape == ref.shape == (TOKENS, 768) and got.dtype == torch.float32
        assert torch.isfinite(got).all()
        ref_logits, got_logits = code_logits(tiny_model, ref), code_logits(tiny_model, got)
        n_same = first((ref_logits.argmax(-1) != got_logits.argmax(-1)).any(-1))
        # Compare while the inputs were surely the same: up to the first switch of code, and not
        # past a token that either decode may have sampled off its arg-max.
        n = min(n_same, first(torch.minimum(gap(ref_logits), gap(got_logits)) < GREEDY_GAP))
        upto = min(n + 1, TOKENS)  # token n's hidden state came from the first n tokens
        d_logits = float((ref_logits[:upto] - got_logits[:upto]).abs().max())
        d_hidden = float((ref[:upto] - got[:upto]).abs().max())
        assert d_logits <= tol_logits, f"row {i}: logits differ by {d_logits:.2e} within its first {upto} tokens"
        assert d_hidden <= tol_hidden, f"row {i}: hidden states differ by {d_hidden:.2e} within its first {upto} tokens"
        # A switch is allowed only where the reference's two best codes are within the error.
        near_tie = first(gap(ref_logits) < 2 * tol_logits + GREEDY_GAP)
        assert n_same >= near_tie, f"row {i}: code switched at token {n_same}, first near-tie at {near_tie}"
        same_tokens.append(n_same)
        compared.append(upto)
        worst_logits, worst_hidden = max(worst_logits, d_logits), max(worst_hidden, d_hidden)
    # Rows decode in one batch: the comparison must cover decode steps, not only the prefill.
    assert sum(compared) >= 2 * len(ROWS), compared
    for key, value in (
        ("same_tokens", same_tokens),
        ("compared_tokens", compared),
        ("max_logit_diff", float(f"{worst_logits:.3g}")),
        ("max_hidden_diff", float(f"{worst_hidden:.3g}")),
    ):
        record_property(key, value)
    print(
        f"\n{device}/{dtype}: same tokens per row {same_tokens} of {TOKENS}; compared {compared}; "
        f"max |logits diff| {worst_logits:.2e}, max |hidden diff| {worst_hidden:.2e}"
    )


@pytest.mark.gpu
@pytest.mark.timeout(300)
@device_dtype
def test_streamed_audio_matches_one_shot(device, dtype, model_on, spk, record_property):
    """The sliding-window vocoder on the device against one decode of the same hidden states
    (those of a decode in the dtype; the vocoder itself always runs in float32)."""
    model = model_on(device, dtype)
    engine = AcousticEngine(model, fixed_chunks())
    stream = engine.submit(seg(spk, 240, seed=11, text="你好，欢迎使用语音合成服务。" * 2))
    engine.run_until_idle()
    chunks = drain(stream)[0]
    assert sum(c.hidden.shape[0] for c in chunks) == 240 and len(chunks) > 5
    r = streamed_vs_one_shot(VocoderEngine(model), chunks)
    assert r["samples"] == 512 * 240 - 256
    for key in ("snr_db", "worst_edge", "peak"):
        record_property(key, float(f"{r[key]:.4g}"))
    print(
        f"\n{device}/{dtype}: streamed vs one-shot SNR {r['snr_db']:.1f} dB, worst error near a chunk edge "
        f"{r['worst_edge']:.2e} (peak {r['peak']:.3f})"
    )
    assert r["peak"] > 0
    assert r["snr_db"] >= 30.0
    assert r["worst_edge"] <= 0.03 * r["peak"]


def kv_bytes(engine: AcousticEngine) -> int:
    """Bytes of the storages under the running batch's KV buffers (a storage shared by views
    counts once)."""
    storages = {}
    for buf in (*engine.batch.kbuf, *engine.batch.vbuf):
        s = buf.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


@pytest.mark.gpu
@pytest.mark.timeout(300)
@device_dtype
def test_cancel_and_retire_free_kv_memory(device, dtype, model_on, spk, record_property):
    """Cancelled and finished rows give their KV memory back: the engine's buffers shrink to the
    live rows within two re-allocations, and to nothing when idle; on CUDA the allocator's count
    returns to its baseline too."""
    engine = AcousticEngine(model_on(device, dtype), fixed_chunks(max_rows=4))

    def used() -> int:
        if device != "cuda":
            return kv_bytes(engine)
        torch.cuda.synchronize()
        return torch.cuda.memory_allocated()

    # CUDA: what the allocator may still count when idle, far below one row's KV (>= 0.5 MiB here).
    slack = 64 * 1024 if device == "cuda" else 0

    # Warm-up: batches of 4, 3, 2 and 1 rows and a buffer re-growth, so that whatever the kernels
    # create lazily (cuBLAS workspaces, sampling warpers) exists before the baseline is taken.
    lengths = [KV_HEADROOM + 10, KV_HEADROOM + 5, 20, 10]
    warm = [engine.submit(seg(spk, n, seed=90 + n)) for n in lengths]
    engine.run_until_idle()
    assert [drain(s)[1].shape[0] for s in warm] == lengths
    base = used()
    assert kv_bytes(engine) == 0

    streams = [engine.submit(seg(spk, 3000, seed=i)) for i in range(4)]
    for _ in range(20):
        engine.step()
    assert engine.running_rows == 4
    four = used()
    assert four > base and kv_bytes(engine) > 0
    for s in streams[:3]:
        s.cancel()
    steps = 0
    while used() - base > (four - base) / 2 and steps <= 2 * KV_HEADROOM + 2:
        engine.step()
        steps += 1
    one = used()
    assert engine.running_rows == 1 and engine.stats.rows_cancelled == 3
    assert base < one <= base + (four - base) / 2, (
        f"3 of 4 rows cancelled, KV {one - base} of {four - base} bytes after {steps} steps"
    )
    streams[3].cancel()
    engine.run_until_idle()
    assert kv_bytes(engine) == 0 and base <= used() <= base + slack, used() - base

    # Rows that finish (retire) free theirs the same way.
    done = [engine.submit(seg(spk, n, seed=20 + n)) for n in (30, 45, 70)]
    for _ in range(10):
        engine.step()
    assert used() > base
    engine.run_until_idle()
    assert [drain(s)[1].shape[0] for s in done] == [30, 45, 70]
    leftover = used() - base
    assert kv_bytes(engine) == 0 and 0 <= leftover <= slack, leftover
    record_property("idle_bytes_over_baseline", leftover)
    record_property("kv_bytes_4_rows", four - base)
    record_property("kv_bytes_1_row", one - base)
    record_property("steps_to_release", steps)


# Started as the tests with a Ray of their own begin (support.early): its waits overlap theirs.
DRY_RUN = EarlyRun(
    "gpu-dry-run",
    bench_command("gpu", "--dry-run", "--steps", "tests,fidelity,ceiling,serve_2x0.5", "--out", "{out}"),
    timeout_s=540,
)


@pytest.mark.timeout(600)
@pytest.mark.early_start(DRY_RUN)
def test_gpu_check_dry_run():
    """``python -m bench gpu --dry-run``: the GPU check's steps on CPU with tiny sizes (the script
    is tested before a GPU is there). Its Serve step once, with two Acoustic replicas: the other
    variant is the same code with another config (tests/unit/test_bench.py). Starts Ray (a system test)."""
    rc, tail = DRY_RUN.finish()
    assert rc == 0, tail
    out = DRY_RUN.out
    report = json.loads((out / "report.json").read_text())
    assert {k: s["status"] for k, s in report["steps"].items()} == {
        "tests": "ok",
        "fidelity": "ok",
        "ceiling": "ok",
        "serve_2x0.5": "ok",
    }, report["steps"]
    tests = report["tests"]
    assert tests["summary"]["failed"] == tests["summary"]["errors"] == 0
    assert tests["summary"]["passed"] >= 2  # the CPU pairs of the test the dry run selects
    cases = {c["name"]: c for c in tests["cases"]}
    assert cases["test_same_tokens_as_cpu_float32[cpu-bfloat16]"]["outcome"] == "passed"
    assert cases["test_same_tokens_as_cpu_float32[cuda-float16]"]["outcome"] == "skipped"
    # Batch invariance in the device's dtypes (float32 on the dry run's CPU: invariant there).
    fidelity = report["fidelity"]
    assert fidelity["passed"] and {x["path"] for x in fidelity["results"]} == {
        "alone vs batched",
        "ChatTTS vs alone",
        "ChatTTS vs batched",
    }
    assert "## Batch invariance" in (out / "report.md").read_text()
    ceiling = report["ceiling"]
    assert set(ceiling["methods"]["engine"]) == {"1", "2"}
    assert all(b["audio_s_per_s"] > 0 and b["step_ms"] > 0 for b in ceiling["methods"]["engine"].values())
    assert ceiling["first_chunk"]["raw_s"] > 0
    for name in ("serve_2x0.5",):
        serve = report["serve"][name]
        assert set(serve["closed"]) == {"1", "2"}
        for level in serve["closed"].values():
            assert level["completed"] > 0 and level["errors"] == 0
            assert level["audio_s_per_s"] > 0 and level["ttfb_s"]["p50"] > 0
    assert report["serve"]["serve_2x0.5"]["acoustic_replicas"] == 2
    assert (out / "report.md").read_text().startswith("# chattts-serve GPU check")
    assert (out / "report.png").stat().st_size > 10000
