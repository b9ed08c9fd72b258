"""The Vocoder's fast path (engine/vocoder_net.py): carried convolution state and bf16 matmuls
against today's path (re-decoded left context, float32, ChatTTS's modules), chunking
invariance, and the fallbacks (no oneDNN linear op, no native bf16, no GPU)."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch
from support.audio import snr_db

from serve_app.engine import vocoder as vocoder_mod
from serve_app.engine.config import VocoderConfig
from serve_app.engine.vocoder import VocoderEngine, resolve_precision, window_ends

TODAY = VocoderConfig(cache_state=False, precision="float32")
TOKENS = 150


@pytest.fixture(scope="module")
def hidden() -> torch.Tensor:
    return torch.randn(TOKENS, 768, generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def stressed(tiny_model):
    """A copy of the tiny Decoder/Vocos whose Decoder blocks count: random weights start their
    layer scales at 1e-6 (near identity), real weights learn them; 0.5 makes the receptive field
    (and so what streaming cuts) matter."""
    parts = copy.deepcopy(tiny_model.vocoder_weights())
    with torch.no_grad():
        for blk in parts.decoder.decoder.decoder_block:
            blk.weight.fill_(0.5)
    return parts


def stream(
    vocoder: VocoderEngine, hidden: torch.Tensor, sizes: list[int], cfg: VocoderConfig | None = None
) -> np.ndarray:
    vs = vocoder.stream(cfg)
    out, t, i = [], 0, 0
    while t < hidden.shape[0]:
        n = sizes[min(i, len(sizes) - 1)]
        out.append(vs.push(hidden[t : t + n]))
        t, i = t + n, i + 1
    out.append(vs.finish())
    return np.concatenate(out)


SHIPPED = [12, 24]  # AcousticConfig: first_chunk_tokens, then chunk_tokens


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
@pytest.mark.parametrize("weights", ["loaded", "stressed"])
def test_carried_state_is_todays_audio(tiny_model, stressed, hidden, precision, weights):
    parts = tiny_model if weights == "loaded" else stressed
    today = stream(VocoderEngine(parts, TODAY), hidden, SHIPPED)
    cfg = VocoderConfig(cache_state=True, precision=precision)
    y = stream(VocoderEngine(parts, cfg), hidden, SHIPPED)
    assert len(y) == len(today) == 512 * TOKENS - 256
    print(f"\n{weights} {precision}: SNR vs today {snr_db(today, y):.1f} dB")
    assert snr_db(today, y) >= 30.0
    # And no further from the one-shot decode than today's stream is (within 1 dB), or past 50 dB:
    # there bf16's own rounding (~60 dB here) is the floor, not what streaming cuts.
    one_shot = VocoderEngine(parts, TODAY).decode(hidden)
    assert snr_db(one_shot, y) >= min(snr_db(one_shot, today) - 1.0, 50.0)


def test_bf16_alone_and_one_shot(tiny_model, hidden):
    ref = VocoderEngine(tiny_model, TODAY).decode(hidden)
    fast = VocoderEngine(tiny_model, VocoderConfig(cache_state=False, precision="bfloat16"))
    assert fast.net is not None
    assert snr_db(ref, fast.decode(hidden)) >= 40.0
    assert snr_db(ref, stream(fast, hidden, SHIPPED)) >= 30.0


@pytest.mark.parametrize("sizes", [[TOKENS], [8], [12, 24], [30], [5, 41, 9], [1]])
def test_chunking_invariance(tiny_model, stressed, hidden, sizes):
    """However the hidden states are cut, the stream is the same audio, bit for bit: its windows
    end at token positions set by the tokens alone (``window_ends``), each with the same right
    context, whatever arrived when."""
    for parts in (tiny_model, stressed):
        v = VocoderEngine(parts, VocoderConfig(cache_state=True, precision="float32"))
        ref = stream(v, hidden, [TOKENS])
        y = stream(v, hidden, sizes)
        assert len(y) == 512 * TOKENS - 256
        assert np.array_equal(ref, y)
        one_shot = VocoderEngine(parts, TODAY).decode(hidden)
        assert snr_db(one_shot, ref) >= 30.0  # the sliding window's own error, far above the bound


def test_chunking_invariance_without_carried_state(tiny_model, hidden):
    """The same for the path that decodes its left context again (ChatTTS's own modules)."""
    v = VocoderEngine(tiny_model, TODAY)
    ref = stream(v, hidden, [TOKENS])
    assert np.array_equal(ref, stream(v, hidden, [5, 41, 9]))


def test_windows_are_new_tokens_and_hold_back(tiny_model, hidden):
    """Windows ramp 8, 8, 16, then 24 tokens, each decoded with its hold-back: the first audio
    needs the first chunk (12) only, and nothing but the hold-back is decoded twice."""
    cfg = VocoderConfig()
    v = VocoderEngine(tiny_model, cfg)
    windows: list[int] = []
    v.on_decode = windows.append
    stream(v, hidden, SHIPPED)
    hold = cfg.hold_back_tokens
    assert windows[:5] == [8 + hold, 8 + hold, 16 + hold, 24 + hold, 24 + hold]
    assert list(itertools.islice(window_ends(8, 24), 5)) == [8, 16, 32, 56, 80]
    assert sum(windows) <= TOKENS + len(windows) * hold  # nothing else decoded twice


def test_fallback_without_onednn_linear(tiny_model, hidden, monkeypatch):
    packed = VocoderEngine(tiny_model, VocoderConfig(precision="float32"))
    assert packed.net.dec_blocks[0].pw1.packed is not None or not torch.backends.mkldnn.is_available()
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
    plain = VocoderEngine(tiny_model, VocoderConfig(precision="float32"))
    assert plain.net.dec_blocks[0].pw1.packed is None and plain.net.head.packed is None
    assert snr_db(stream(packed, hidden, SHIPPED), stream(plain, hidden, SHIPPED)) >= 60.0


def test_precision_auto(monkeypatch):
    monkeypatch.setattr(vocoder_mod, "cpu_has_native_bf16", lambda: False)
    assert resolve_precision("auto", torch.device("cpu")) == torch.float32  # emulated bf16 is slower
    monkeypatch.setattr(vocoder_mod, "cpu_has_native_bf16", lambda: True)
    assert resolve_precision("auto", torch.device("cpu")) == torch.bfloat16
    assert resolve_precision("float32", torch.device("cpu")) == torch.float32


def test_device_option(tiny_model, hidden):
    v = VocoderEngine(tiny_model, VocoderConfig(device="auto"))
    assert v.device.type == ("cuda" if torch.cuda.is_available() else "cpu")
    y = stream(v, hidden, SHIPPED)
    assert len(y) == 512 * TOKENS - 256
    assert snr_db(stream(VocoderEngine(tiny_model, TODAY), hidden, SHIPPED), y) >= 30.0
    with pytest.raises(ValueError):
        VocoderConfig(device="tpu")
    with pytest.raises(ValueError):
        VocoderConfig(precision="float16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(tiny_model, hidden):
    cpu = stream(VocoderEngine(tiny_model, TODAY), hidden, SHIPPED)
    for precision in ("float32", "bfloat16"):
        v = VocoderEngine(tiny_model, VocoderConfig(device="cuda", precision=precision))
        assert v.net.device.type == "cuda"
        assert snr_db(cpu, stream(v, hidden, SHIPPED)) >= 30.0


def test_the_net_serves_every_call_and_the_modules_go(tiny_weights_config, hidden):
    """With the net, the Vocoder keeps no reference to ChatTTS's Decoder and Vocos: once the
    loader's result is dropped (the Vocoder stage) their float32 weights are freed. A one-shot
    decode is the net's too, as close to the modules as the net's streams are."""
    import gc
    import weakref

    from serve_app.engine.config import ModelConfig
    from serve_app.engine.weights.loading import load_vocoder

    parts = load_vocoder(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1))
    ref = VocoderEngine(parts, TODAY).decode(hidden)  # no net: the modules themselves
    modules = [weakref.ref(parts.decoder), weakref.ref(parts.vocos)]
    for precision in ("float32", "bfloat16"):
        v = VocoderEngine(parts, VocoderConfig(precision=precision))
        assert v.net is not None and v.decoder is None and v.vocos is None
        assert snr_db(ref, v.decode(hidden)) >= (60.0 if precision == "float32" else 40.0)
    del parts
    gc.collect()
    assert [m() for m in modules] == [None, None]
    assert len(v.decode(hidden)) == 512 * TOKENS - 256
