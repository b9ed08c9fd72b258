"""The CPU dual-layout linear layers (serve_app/engine/linear.py) on real ChatTTS modules."""

from __future__ import annotations

import torch
from torch import nn

from serve_app.engine.linear import DualLayoutLinear, use_dual_layout

ROWS = 12


def test_dual_layout_matches_linear_for_every_row_count():
    torch.manual_seed(0)
    for bias in (False, True):
        lin = nn.Linear(48, 80, bias=bias)
        dual = DualLayoutLinear(lin)
        for rows in range(1, ROWS):
            for shape in ((rows, 48), (rows, 1, 48), (1, rows, 48)):
                x = torch.randn(*shape)
                torch.testing.assert_close(dual(x), lin(x), rtol=1e-5, atol=1e-5)
    # Each row's result is the same, bit for bit, whatever the rows beside it.
    x = torch.randn(ROWS, 48)
    whole = dual(x)
    assert all(torch.equal(dual(x[i : i + 1]), whole[i : i + 1]) for i in range(ROWS))
    assert all(torch.equal(dual(x[:n]), whole[:n]) for n in range(2, ROWS))
    # It shares the parameters (not copies), so a loaded state dict still describes the model.
    assert dual.weight is lin.weight and dual.bias is lin.bias
    assert "weight_t" not in dual.state_dict()


def test_loaded_cpu_gpt_uses_dual_layout_and_gives_the_same_hidden_states(tiny_model, tiny_weights_config):
    from serve_app.engine.config import ModelConfig
    from serve_app.engine.weights.loading import load_model

    gpt = tiny_model.chat.gpt.gpt
    duals = [m for m in gpt.modules() if isinstance(m, DualLayoutLinear)]
    assert duals and not any(type(m) is nn.Linear for m in gpt.modules())
    plain = load_model(
        ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1, cpu_dual_layout=False, quantize="none")
    )
    plain_gpt = plain.chat.gpt.gpt
    assert not any(isinstance(m, DualLayoutLinear) for m in plain_gpt.modules())
    # Same weights, so the same forward for batches on of one and several rows.
    hidden = gpt.config.hidden_size
    for rows in (1, 2, 8):
        emb = torch.randn(rows, 7, hidden)
        with torch.inference_mode():
            a = gpt(inputs_embeds=emb).last_hidden_state
            b = plain_gpt(inputs_embeds=emb).last_hidden_state
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_use_dual_layout_replaces_nested_linears_only_once():
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2)))
    assert use_dual_layout(net) == 3
    assert use_dual_layout(net) == 0
    x = torch.randn(5, 4)
    assert net(x).shape == (5, 2)
