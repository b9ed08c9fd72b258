"""Weights: random builds in ChatTTS's asset layout, the tokenizer, sources and overrides.

Everything goes through serve_app.engine.weights with real ChatTTS/transformers code.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from serve_app.engine.config import ModelConfig, WeightsConfig
from serve_app.engine.weights.loading import load_model
from serve_app.engine.weights.random_weights import (
    CHATTTS_SPECIAL_TOKENS,
    MANIFEST,
    NUM_TEXT_TOKENS,
    build_random_weights,
    build_vocab,
    random_weights_key,
)
from serve_app.engine.weights.sources import resolve_weights

ASSET_FILES = (
    "asset/Vocos.safetensors",
    "asset/DVAE.safetensors",
    "asset/Decoder.safetensors",
    "asset/Embed.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/tokenizer.json",
    "asset/tokenizer/tokenizer_config.json",
)


def tree_hashes(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def tiny_root(tiny_model) -> Path:
    return tiny_model.weights.root


# ------------------------------------------------------------------------------ tokenizer


def test_tokenizer_round_trip(tiny_model):
    hf = tiny_model.chat.tokenizer._tokenizer  # the BertTokenizerFast ChatTTS loaded from asset/tokenizer
    vocab = build_vocab()
    assert len(hf) == NUM_TEXT_TOKENS == 21178
    assert tiny_model.chat.tokenizer.len == 21178

    text = (
        "[Stts][spk_emb][speed_5]你好，欢迎使用语音合成服务。[uv_break]"
        "Hello world, it is ten thirty.[laugh_0][break_6][Ptts]"
    )
    ids = hf.encode(text, add_special_tokens=False)
    tokens = hf.convert_ids_to_tokens(ids)
    # Control tags are single tokens with their vocabulary ids, never split into pieces.
    for tag in ("[Stts]", "[spk_emb]", "[speed_5]", "[uv_break]", "[laugh_0]", "[break_6]", "[Ptts]"):
        assert tokens.count(tag) == 1, (tag, tokens)
        assert ids[tokens.index(tag)] == vocab.index(tag) == hf.convert_tokens_to_ids(tag)
    assert tokens[:3] == ["[Stts]", "[spk_emb]", "[speed_5]"] and tokens[-1] == "[Ptts]"
    assert hf.unk_token_id not in ids
    # CJK characters are one token each.
    assert tokens[3:6] == ["你", "好", "，"]
    # Decoding gives the text back (BERT decoding inserts spaces between CJK chars and tags).
    decoded = hf.decode(ids)
    assert "".join(decoded.split()) == "".join(text.split())
    # ChatTTS reads its structural ids from the tokenizer.
    assert tiny_model.chat.tokenizer.spk_emb_ids == vocab.index("[spk_emb]")
    assert tiny_model.chat.tokenizer.break_0_ids == vocab.index("[break_0]")
    assert tiny_model.chat.tokenizer.eos_token == vocab.index("[Ebreak]")
    # Every ChatTTS special token is a single token.
    for tag in CHATTTS_SPECIAL_TOKENS:
        assert hf.encode(tag, add_special_tokens=False) == [vocab.index(tag)], tag


# ------------------------------------------------------------------------------ layout


def test_built_tree_has_chattts_layout_and_manifest(tiny_model, tiny_root, chattts_cache_dir):
    assert tiny_root.parent == chattts_cache_dir
    assert tiny_root.name == random_weights_key("random-tiny", 0)
    for rel in ASSET_FILES:
        assert (tiny_root / rel).is_file(), rel
        assert (tiny_root / rel).stat().st_size > 0, rel
    # ChatTTS's own asset paths all exist.
    for key, path in tiny_model.weights.asset_paths.items():
        assert Path(path).exists(), (key, path)
    manifest = json.loads((tiny_root / MANIFEST).read_text())
    assert manifest["kind"] == "random-tiny"
    assert manifest["seed"] == 0
    assert manifest["weights_id"] == tiny_model.weights.weights_id == tiny_root.name
    assert manifest["overrides"]["gpt"]["num_hidden_layers"] == 1
    assert tiny_model.is_random and tiny_model.weights.kind == "random"
    assert tiny_model.weights.source == "random-tiny"


def test_tiny_gpt_has_one_layer_and_hidden_768(tiny_model, tiny_root):
    cfg = json.loads((tiny_root / "asset/gpt/config.json").read_text())
    assert cfg["num_hidden_layers"] == 1
    assert cfg["hidden_size"] == 768
    gpt = tiny_model.chat.gpt.gpt
    assert gpt.config.num_hidden_layers == 1
    assert len(gpt.layers) == 1
    assert gpt.config.hidden_size == 768
    # The speaker statistics are tied to 768.
    assert tiny_model.chat.speaker.dim == 768


def test_same_kind_and_seed_gives_identical_files(tmp_path, tiny_root):
    rng = torch.get_rng_state()
    a = build_random_weights("random-tiny", tmp_path / "a")
    # Building does not disturb the caller's random state.
    assert torch.equal(rng, torch.get_rng_state())
    assert a != tiny_root and a.name == tiny_root.name
    ha, h_session = tree_hashes(a), tree_hashes(tiny_root)
    assert set(ha) >= {*ASSET_FILES, MANIFEST}
    assert ha == h_session
    # A second call finds the tree and does not rebuild it.
    mtime = (a / MANIFEST).stat().st_mtime_ns
    assert build_random_weights("random-tiny", tmp_path / "a") == a
    assert (a / MANIFEST).stat().st_mtime_ns == mtime
    # Another seed is other weights (and another cache key).
    b = build_random_weights("random-tiny", tmp_path / "a", seed=1)
    assert b != a
    hb = tree_hashes(b)
    assert hb["asset/gpt/model.safetensors"] != ha["asset/gpt/model.safetensors"]
    assert hb["asset/Vocos.safetensors"] != ha["asset/Vocos.safetensors"]
    assert hb["asset/tokenizer/tokenizer.json"] == ha["asset/tokenizer/tokenizer.json"]


# ------------------------------------------------------------------------------ sources


def test_env_var_overrides_configured_source(monkeypatch, tiny_root, chattts_cache_dir):
    # Configured for the hub; the env var switches to random-tiny without touching the network.
    cfg = WeightsConfig(source="huggingface", cache_dir=str(chattts_cache_dir))
    monkeypatch.setenv("CHATTTS_WEIGHTS", "random-tiny")
    assert cfg.resolved().source == "random-tiny"
    resolved = resolve_weights(cfg)
    assert resolved.source == "random-tiny"
    assert resolved.kind == "random"
    assert resolved.root == tiny_root
    # CHATTTS_WEIGHTS_PATH supplies the path for source=local.
    monkeypatch.setenv("CHATTTS_WEIGHTS", "local")
    monkeypatch.setenv("CHATTTS_WEIGHTS_PATH", str(tiny_root))
    resolved = resolve_weights(cfg)
    assert (resolved.source, resolved.root, resolved.kind) == ("local", tiny_root, "random")
    # Without the override the configuration stands.
    monkeypatch.delenv("CHATTTS_WEIGHTS")
    monkeypatch.delenv("CHATTTS_WEIGHTS_PATH")
    assert cfg.resolved().source == "huggingface"


def test_local_source_loads_built_tree(tiny_root, tiny_model):
    model = load_model(
        ModelConfig(weights=WeightsConfig(source="local", path=str(tiny_root)), device="cpu", quantize="none")
    )
    assert model.weights.source == "local"
    assert model.weights.kind == "random"  # from the manifest
    assert model.is_random
    assert model.weights.weights_id == tiny_model.weights.weights_id
    # The manifest's size overrides were applied: the 1-layer GPT loaded.
    assert len(model.chat.gpt.gpt.layers) == 1
    # Same weights as the session model.
    a = model.chat.gpt.gpt.state_dict()
    b = tiny_model.chat.gpt.gpt.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # The asset/ directory itself is accepted too.
    assert resolve_weights(WeightsConfig(source="local", path=str(tiny_root / "asset"))).root == tiny_root


def test_local_source_without_assets_is_a_clear_error(tmp_path):
    empty = tmp_path / "no-weights-here"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no ChatTTS asset directory") as err:
        load_model(ModelConfig(weights=WeightsConfig(source="local", path=str(empty)), device="cpu"))
    assert str(empty) in str(err.value)
    with pytest.raises(FileNotFoundError):
        resolve_weights(WeightsConfig(source="local", path=str(tmp_path / "missing")))
    with pytest.raises(ValueError, match="needs a path"):
        resolve_weights(WeightsConfig(source="local"))


# ------------------------------------------------------------------------------ concurrency

# Each builder imports everything first, then waits for the other one, so both call
# build_random_weights at the same moment.
_BUILDER = """
import sys, time
from pathlib import Path
import torch, transformers, ChatTTS, vocos  # noqa: F401 - import before the race starts
from serve_app.engine.weights.random_weights import build_random_weights
cache, me, other = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
me.touch()
deadline = time.monotonic() + 120
while not other.exists():
    if time.monotonic() > deadline:
        sys.exit("the other builder never started")
    time.sleep(0.002)
print(build_random_weights("random-tiny", cache))
"""


@pytest.mark.timeout(180)
def test_concurrent_builds_in_two_processes(tmp_path, tiny_root):
    cache = tmp_path / "cache"
    ready = [tmp_path / "ready-0", tmp_path / "ready-1"]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BUILDER, str(cache), str(ready[i]), str(ready[1 - i])],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=170) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    paths = {Path(out.strip().splitlines()[-1]) for out, _ in outs}
    assert len(paths) == 1
    (final,) = paths
    assert final.parent == cache and final.name == tiny_root.name
    # Exactly one of them built; the other waited on the lock and found the finished tree.
    built = [err for _, err in outs if "built random-tiny ChatTTS weights" in err]
    assert len(built) == 1, [err[-500:] for _, err in outs]
    # One final tree, no temporary directories left (the lock file may stay).
    entries = sorted(os.listdir(cache))
    assert [e for e in entries if not e.startswith(".")] == [final.name]
    assert not [e for e in entries if ".tmp-" in e], entries
    assert all(e == final.name or e.endswith(".lock") for e in entries), entries
    assert tree_hashes(final) == tree_hashes(tiny_root)
    # The result loads (and is not rebuilt).
    mtime = (final / MANIFEST).stat().st_mtime_ns
    t0 = time.perf_counter()
    model = load_model(ModelConfig(weights=WeightsConfig(source="random-tiny", cache_dir=str(cache)), device="cpu"))
    assert model.weights.root == final and model.is_random
    assert (final / MANIFEST).stat().st_mtime_ns == mtime
    assert time.perf_counter() - t0 < 60


def test_vocoder_stage_loads_only_decoder_and_vocos(tiny_model, tiny_weights_config):
    """``load_vocoder`` builds the Decoder and Vocos alone from the same assets: the same audio
    as the full ``Chat``'s modules, without a GPT in the process."""
    from serve_app.engine.weights.loading import load_vocoder

    parts = load_vocoder(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1))
    full = tiny_model.vocoder_weights()
    hidden = torch.randn(1, 768, 10, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        a = full.vocos.decode(full.decoder(hidden.clone()))
        b = parts.vocos.decode(parts.decoder(hidden.clone()))
    assert torch.equal(a, b)
    assert parts.weights.weights_id == tiny_model.weights.weights_id


def test_acoustic_stage_loads_the_gpts_part_alone(tiny_model, tiny_weights_config):
    """``load_model(audio=False)`` builds ChatTTS's Embed, GPT, Speaker and tokenizer the way
    ``Chat._load`` does, from the same assets: the same tensors, prompts and weights id as the
    full ``Chat``'s, without its audio modules."""
    cfg = ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1, quantize="none")  # as tiny_model
    gpt_only = load_model(cfg, audio=False)
    full, part = tiny_model.chat, gpt_only.chat
    assert not any(hasattr(part, n) for n in ("decoder", "vocos", "dvae"))
    for a, b in ((full.gpt, part.gpt), (full.embed, part.embed)):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    assert torch.equal(full.speaker.std, part.speaker.std) and torch.equal(full.speaker.mean, part.speaker.mean)
    text = full.speaker.decorate_code_prompts(["你好，hello 123。"], "[speed_5]", None, None)
    a = full.tokenizer.encode(text, full.config.gpt.num_vq, device=full.device_gpt)
    b = part.tokenizer.encode(text, part.config.gpt.num_vq, device=part.device_gpt)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert asdict(part.config) == asdict(full.config) and part.device_gpt == full.device_gpt
    assert gpt_only.weights.weights_id == tiny_model.weights.weights_id
    assert part.RefineTextParams is full.RefineTextParams


_VOCODER_STAGE = """
import sys
from serve_app.engine.clips import load_voice_encoder
from serve_app.engine.config import ModelConfig, WeightsConfig
from serve_app.engine.weights.loading import load_vocoder
cfg = ModelConfig(weights=WeightsConfig(source="random-tiny", cache_dir=sys.argv[1]), device="cpu", torch_threads=1)
load_vocoder(cfg)
encoder = load_voice_encoder(cfg)
encoder.speaker_for_seed(2222)
heavy = ("transformers", "ChatTTS", "ChatTTS.model", "ChatTTS.model.gpt", "vector_quantize_pytorch", "torch._dynamo")
print(sorted(m for m in heavy if m in sys.modules))
import numpy as np
encoder.encode(np.sin(np.arange(48000, dtype=np.float32) / 9))  # the first clip loads the quantiser for real
print(sorted(m for m in ("vector_quantize_pytorch", "torch._dynamo") if m in sys.modules))
import ChatTTS  # the real package afterwards, reusing the modules loaded on their own
from ChatTTS.model import DVAE
import ChatTTS.model.dvae as dvae
print(DVAE is dvae.DVAE and hasattr(ChatTTS, "Chat"))
"""


_ACOUSTIC_STAGE = """
import sys
from serve_app.engine.config import ModelConfig, WeightsConfig
from serve_app.engine.refine import TextRefiner
from serve_app.engine.weights.loading import load_model
cfg = ModelConfig(weights=WeightsConfig(source="random-tiny", cache_dir=sys.argv[1]), device="cpu", torch_threads=1)
model = load_model(cfg, audio=False)
heavy = ("ChatTTS", "ChatTTS.model.dvae", "vocos", "vector_quantize_pytorch", "einx", "numba")
print(sorted(m for m in heavy if m in sys.modules))
print(len(TextRefiner(model).refine(["你好"], seed=1)))  # refine imports the rest of ChatTTS, once
import ChatTTS.model.gpt as gpt
print(type(model.chat.gpt) is gpt.GPT and hasattr(sys.modules["ChatTTS"], "Chat"))
"""


def _stage_lines(script: str, tiny_root: Path) -> list[str]:
    """A stage's loading script in a fresh interpreter: the last three lines it printed."""
    out = subprocess.run(
        [sys.executable, "-c", script, str(tiny_root.parent)],
        capture_output=True,
        text=True,
        timeout=110,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-3:]


@pytest.mark.timeout(120)
def test_acoustic_stage_never_imports_the_audio_modules(tiny_root):
    """The Acoustic stage's loader takes ChatTTS's GPT, embed, speaker and tokenizer modules
    without the package's ``__init__`` files, which import the DVAE (vector_quantize_pytorch,
    einx), Vocos and the text normaliser's numba. Refining text, the one call that needs
    ``Chat``'s own defaults, imports the rest then and shares the modules already loaded."""
    assert _stage_lines(_ACOUSTIC_STAGE, tiny_root) == ["[]", "1", "True"]


@pytest.mark.timeout(120)
def test_vocoder_stage_never_imports_the_gpt_or_transformers(tiny_root):
    """The Vocoder stage's loaders take ChatTTS's DVAE, speaker and config modules without the
    package's ``__init__`` files, which import the GPT and transformers (~100 MiB of RSS), and
    without the DVAE quantiser's vector_quantize_pytorch (einx, torch._dynamo, triton: ~150 MiB)
    until a clip is encoded; a later ``import ChatTTS`` still works and shares those modules."""
    lines = _stage_lines(_VOCODER_STAGE, tiny_root)
    assert lines == ["[]", "['torch._dynamo', 'vector_quantize_pytorch']", "True"]


def test_a_deferred_package_is_imported_at_the_first_call(monkeypatch):
    """``chattts_modules(defer=...)``'s stand-in: taking a name imports nothing, calling it imports
    the real package and calls its name; a submodule import through it fails (what makes
    ``chattts_modules`` fall back to a plain import)."""
    import importlib

    from serve_app.engine.weights.chattts import _Deferred

    monkeypatch.delitem(sys.modules, "colorsys", raising=False)
    stub = _Deferred("colorsys")
    monkeypatch.setitem(sys.modules, "colorsys", stub)
    from colorsys import rgb_to_hsv  # what ChatTTS's dvae does with vector_quantize_pytorch

    monkeypatch.delitem(sys.modules, "colorsys")
    assert "colorsys" not in sys.modules
    assert rgb_to_hsv(1.0, 0.0, 0.0) == (0.0, 1.0, 1.0)
    assert sys.modules["colorsys"] is not stub
    with pytest.raises(AttributeError):
        _ = stub.__path__
    monkeypatch.setitem(sys.modules, "colorsys", stub)
    with pytest.raises(ImportError):
        importlib.import_module("colorsys.sub")


@pytest.mark.skipif(not Path("/proc/self/maps").is_file(), reason="reads /proc/self/maps")
def test_int8_gpt_keeps_no_tensor_in_the_checkpoints_mapping(tiny_weights_config):
    """After int8 replaced the GPT's linear layers, what is left of the float GPT (norms) is
    copied off the checkpoint's file mapping, so the mapping (720 MiB at full size, all of it
    resident once read) goes with the float weights."""
    from serve_app.engine.weights.loading import load_model

    def in_mapping(model) -> list:
        mapped = []
        for line in Path("/proc/self/maps").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 6 and parts[5].endswith(".safetensors"):
                mapped.append(tuple(int(x, 16) for x in parts[0].split("-")))
        tensors = list(model.chat.gpt.gpt.parameters()) + list(model.chat.gpt.gpt.buffers())
        assert tensors
        return [t for t in tensors if any(lo <= t.data_ptr() < hi for lo, hi in mapped)]

    model = load_model(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1, quantize="int8"))
    assert model.quantize == "int8" and in_mapping(model) == []
    # float32 GPT layers as loaded are views of the checkpoint (what the check above would find).
    plain = load_model(
        ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1, quantize="none", cpu_dual_layout=False)
    )
    # (at least every layer's seven linear weights)
    assert plain.quantize == "none" and len(in_mapping(plain)) >= 7 * plain.chat.gpt.gpt.config.num_hidden_layers
