"""int8 GPT linear layers on CPU (serve_app/engine/quant.py, ``model.quantize: int8``) on real
ChatTTS modules with tiny random weights; no Ray."""

from __future__ import annotations

import logging

import pytest
import torch
from pydantic import ValidationError
from support.engine import fixed_chunks
from torch import nn

from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import ModelConfig
from serve_app.engine.linear import DualLayoutLinear
from serve_app.engine.quant import Int8Linear, quantize_gpt, quantize_linears
from serve_app.engine.types import SegmentRequest
from serve_app.engine.voices import speaker_from_seed
from serve_app.engine.weights.loading import load_model

TEXT = "你好，欢迎使用语音合成服务。"


@pytest.fixture(scope="module")
def int8_model(tiny_weights_config):
    return load_model(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1, quantize="int8"))


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (y - ref).norm(dim=-1) / ref.norm(dim=-1)


def test_int8_linear_is_close_per_row_and_independent_of_the_batch():
    torch.manual_seed(0)
    for bias in (False, True):
        lin = nn.Linear(96, 160, bias=bias)
        q = Int8Linear(lin)
        # Rows of very different magnitudes: each gets its own activation scale.
        x = torch.randn(4, 3, 96) * torch.tensor([1e-3, 1.0, 30.0, 1e3])[:, None, None]
        y = q(x)
        assert y.shape == (4, 3, 160)
        assert float(rel_err(y, lin(x).detach()).max()) < 0.02
        # A row's result does not depend on what it is batched with (bit for bit).
        for i in range(4):
            for j in range(3):
                assert torch.equal(q(x[i, j][None]), y[i, j][None])
    assert not list(q.parameters())  # the float weight is not kept


def test_quantize_linears_replaces_plain_and_dual_layout_linears():
    net = nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Sequential(DualLayoutLinear(nn.Linear(16, 16)), nn.Linear(16, 4))
    )
    x = torch.randn(5, 8)
    ref = net(x).detach()
    assert quantize_linears(net) == 3
    assert quantize_linears(net) == 0
    assert sum(isinstance(m, Int8Linear) for m in net.modules()) == 3
    assert float(rel_err(net(x), ref).max()) < 0.05


def test_loaded_tiny_gpt_int8_has_quantized_linears_and_its_own_weights_id(int8_model, tiny_model):
    gpt = int8_model.chat.gpt.gpt
    n_layers = gpt.config.num_hidden_layers
    quantized = [name for name, m in gpt.named_modules() if isinstance(m, Int8Linear)]
    # q, k, v, o and gate, up, down in every decoder layer; nothing float left there.
    assert len(quantized) == 7 * n_layers
    assert {name.rsplit(".", 1)[1] for name in quantized} == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert not any(isinstance(m, (nn.Linear, DualLayoutLinear)) for m in gpt.modules())
    # ChatTTS's Embed (code embeddings and heads) stays float.
    assert all(isinstance(m, nn.Linear) for m in int8_model.chat.embed.head_code)
    assert int8_model.quantize == "int8" and tiny_model.quantize == "none"
    # Cached audio is keyed by the weights id, so int8 and float32 never share entries.
    assert int8_model.weights.weights_id == tiny_model.weights.weights_id + "+int8"


def test_int8_hidden_states_follow_float32_teacher_forced(int8_model, tiny_model):
    """Both GPTs read the same token sequence (a text prompt, then audio codes) and their hidden
    states agree at every position. Full size (bench/README.md) gives ~0.99 too, on random weights."""
    chat = tiny_model.chat
    torch.manual_seed(3)
    ids, _attention, text_mask = chat.tokenizer.encode([f"[Stts]{TEXT}[Ptts]"], 4)
    prompt = chat.embed(ids, text_mask)  # (1, P, 768)
    codes = torch.randint(0, chat.config.gpt.num_audio_tokens - 1, (1, 96, 4))
    audio = torch.stack([chat.embed.emb_code[q](codes[..., q]) for q in range(4)], 2).sum(2)
    emb = torch.cat([prompt, audio], 1)
    with torch.inference_mode():
        ref = tiny_model.chat.gpt.gpt(inputs_embeds=emb).last_hidden_state[0]
        y = int8_model.chat.gpt.gpt(inputs_embeds=emb).last_hidden_state[0]
    cos = torch.nn.functional.cosine_similarity(y, ref, dim=-1)
    assert cos.shape == (emb.shape[1],)
    print(
        f"\nint8 vs float32 hidden cosine over {len(cos)} positions: min {float(cos.min()):.5f}, mean {float(cos.mean()):.5f}"
    )
    assert float(cos.min()) >= 0.99
    assert not torch.equal(y, ref)  # it did run the int8 layers


def expected_chunks(n: int, first: int, size: int) -> list[int]:
    out = [min(first, n)]
    while sum(out) < n:
        out.append(min(size, n - sum(out)))
    return out


def test_engine_decodes_int8_rows_with_the_right_chunks_alone_or_batched(int8_model, tiny_model):
    engine = AcousticEngine(int8_model, fixed_chunks(first_chunk_tokens=5, chunk_tokens=8))
    spk = int8_model.chat.speaker
    reqs = [
        SegmentRequest(text=TEXT, spk_emb=speaker_from_seed(spk, 10 + i), seed=i, max_new_tokens=n, target_tokens=n)
        for i, n in enumerate((23, 9, 30))
    ]
    alone = []
    for req in reqs:
        stream = engine.submit(req)
        engine.run_until_idle()
        chunks = list(stream)
        n = req.target_tokens
        assert [c.hidden.shape[0] for c in chunks] == expected_chunks(n, 5, 8)
        assert chunks[-1].final and not any(c.final for c in chunks[:-1])
        hidden = torch.cat([c.hidden for c in chunks])
        assert hidden.shape == (n, 768) and bool(torch.isfinite(hidden).all())
        alone.append(hidden)
    # Per-row activation scales: a row decodes to the same hidden states inside a batch.
    streams = [engine.submit(r) for r in reqs]
    engine.run_until_idle()
    assert engine.stats.max_rows == 3
    for a, s in zip(alone, streams):
        b = torch.cat([c.hidden for c in s])
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=0)
    engine.stop()


def test_int8_is_refused_or_ignored_off_cpu(caplog):
    with pytest.raises(ValidationError, match="quantize int8 is for device cpu"):
        ModelConfig(device="cuda", quantize="int8")
    with pytest.raises(ValidationError, match="quantize int8"):
        ModelConfig(device="mps", quantize="int8")
    with pytest.raises(ValidationError, match="float32"):
        ModelConfig(device="cpu", dtype="bfloat16", quantize="int8")
    assert ModelConfig(device="auto", quantize="int8").quantize == "int8"
    # device auto that finds a GPU: load_model passes the resolved device; nothing is replaced.
    net = nn.Sequential(nn.Linear(4, 4))
    with caplog.at_level(logging.WARNING, logger="serve_app.engine.quant"):
        assert quantize_gpt(net, "int8", torch.device("cuda")) == "none"
    assert type(net[0]) is nn.Linear
    assert "ignored on cuda" in caplog.text
    assert quantize_gpt(net, "none", torch.device("cpu")) == "none" and type(net[0]) is nn.Linear
    assert quantize_gpt(net, "int8", torch.device("cpu")) == "int8" and isinstance(net[0], Int8Linear)


def test_auto_is_int8_on_cpu_in_float32_only():
    """The CPU default (``quantize: auto``): int8 GPT layers where the GPT runs on CPU in float32,
    none on a GPU or in another dtype; explicit values stay as set."""
    import torch

    from serve_app.engine.config import ModelConfig

    assert ModelConfig().quantize == "auto"
    assert ModelConfig().quantize_on(torch.device("cpu")) == "int8"
    assert ModelConfig().quantize_on(torch.device("cuda")) == "none"
    assert ModelConfig(dtype="bfloat16").quantize_on(torch.device("cpu")) == "none"
    assert ModelConfig(quantize="none").quantize_on(torch.device("cpu")) == "none"
    assert ModelConfig(device="cuda").quantize == "auto"  # auto is fine with a GPU
