"""Random weights with ChatTTS's architecture: ``random`` (full size), ``random-tiny`` (a
1-layer GPT, shallow decoder and vocoder) and ``random-deep`` (every real depth and head layout
at small widths), every module built by ChatTTS's own classes from a
seed, a BERT tokenizer of the real vocabulary's size and special tokens, written in ChatTTS's
asset layout with a manifest.

Apart from finding weights (``sources.py``) and loading them (``loading.py``): random weights
load through the same path as real ones, so only building them lives here."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

from filelock import FileLock

from .chattts import _fresh_chattts_config

log = logging.getLogger(__name__)

MANIFEST = "chattts_serve.json"
LAYOUT_VERSION = 1
NUM_TEXT_TOKENS = 21178

# Size overrides of ChatTTS's Config for the tiny variant. The GPT keeps hidden size 768:
# the speaker statistics (spk_stat) and the decoder input are tied to it. One layer: a step
# reads every weight, and a layer's are most of the step's time (4 of 8 ms on a 2-core box),
# which every test that speaks pays; the code across layers has its own multi-layer tests
# (tests/unit/test_decode_parts.py).
TINY_OVERRIDES: dict[str, dict[str, Any]] = {
    "gpt": {"num_hidden_layers": 1, "intermediate_size": 1024},
    "decoder": {"n_layer": 2},
    "dvae.decoder": {"n_layer": 2},
    "dvae.encoder": {"n_layer": 2},
    "vocos.backbone.init_args": {"num_layers": 2, "intermediate_dim": 512},
}

# Size overrides for the deep test variant: ChatTTS's real depths and head layout (the GPT's 20
# layers of 12 heads, the decoders' 12 blocks, Vocos' 8), narrow where width is free (the MLPs
# and the convolution blocks' hidden size). What runs between layers, across steps and in the
# decode loop's numerics (int8 rounding compounding over 20 layers) is tested at the real depth.
DEEP_OVERRIDES: dict[str, dict[str, Any]] = {
    "gpt": {"intermediate_size": 256},
    "decoder": {"hidden": 128},
    "dvae.decoder": {"hidden": 128},
    "dvae.encoder": {"hidden": 128},
    "vocos.backbone.init_args": {"intermediate_dim": 256},
}

# ChatTTS's control and structure tokens (they are added tokens of its BERT tokenizer, never split).
CHATTTS_SPECIAL_TOKENS: list[str] = (
    ["[Sbreak]", "[Pbreak]", "[Stts]", "[Ptts]", "[Ebreak]", "[Sasr]", "[Pasr]", "[Easr]"]
    + ["[spk_emb]", "[empty_spk]", "[music]", "[pure]", "[uv_break]", "[v_break]", "[lbreak]"]
    + [f"[break_{i}]" for i in range(8)]
    + [f"[laugh_{i}]" for i in range(3)]
    + [f"[oral_{i}]" for i in range(10)]
    + [f"[speed_{i}]" for i in range(10)]
)
BERT_SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def build_vocab() -> list[str]:
    """A 21178-entry BERT vocabulary: specials, ASCII, CJK, word pieces, ChatTTS's tokens.

    The real vocabulary is bert-base-chinese plus ChatTTS's tokens; this one has the same size
    and the same special tokens, so tokenizing a Chinese/English text behaves alike.
    """
    vocab: list[str] = list(BERT_SPECIAL_TOKENS)
    ascii_chars = [chr(c) for c in range(33, 127)]
    vocab += ascii_chars
    vocab += ["##" + c for c in ascii_chars if c.isalnum()]
    vocab += [chr(c) for c in range(0x3001, 0x3012)]  # CJK punctuation 、。〈〉《》「」『』【】
    vocab += [chr(c) for c in range(0xFF01, 0xFF5F) if not chr(c).isalnum()]  # full-width punct.
    vocab += [chr(c) for c in range(0x4E00, 0x9FA6)]  # CJK unified ideographs
    seen = set(vocab)
    vocab += [t for t in CHATTTS_SPECIAL_TOKENS if t not in seen]
    n_fill = NUM_TEXT_TOKENS - len(vocab)
    if n_fill < 0:
        raise AssertionError(f"vocabulary too large: {len(vocab)}")
    vocab += [f"[unused{i}]" for i in range(n_fill)]
    return vocab


def _save_tokenizer(directory: Path) -> None:
    from transformers import BertTokenizerFast

    vocab = {tok: i for i, tok in enumerate(build_vocab())}
    tok = BertTokenizerFast(vocab=vocab, do_lower_case=False, tokenize_chinese_chars=True)
    # Registering them as additional special tokens keeps their ids (they are in the vocab)
    # and stops the BERT pre-tokenizer from splitting "[uv_break]" into pieces.
    tok.add_special_tokens({"additional_special_tokens": CHATTTS_SPECIAL_TOKENS})
    if len(tok) != NUM_TEXT_TOKENS:
        raise AssertionError(f"tokenizer has {len(tok)} entries, expected {NUM_TEXT_TOKENS}")
    tok.save_pretrained(str(directory))


def _write_random_assets(asset: Path, overrides: dict[str, dict[str, Any]], seed: int) -> None:
    import torch
    from ChatTTS.model import DVAE, Embed
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaModel
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    cfg = _fresh_chattts_config(overrides)
    asset.mkdir(parents=True)

    def save(module: torch.nn.Module, name: str) -> None:
        state = {k: v.detach().contiguous().clone() for k, v in module.state_dict().items()}
        save_file(state, str(asset / name))

    # Module constructors draw from torch's global RNG: fork it so building never disturbs the
    # caller's random state, and seed it so a (kind, seed) always gives the same weights.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vocos = Vocos(
            feature_extractor=instantiate_class(args=(), init=asdict(cfg.vocos.feature_extractor)),
            backbone=instantiate_class(args=(), init=asdict(cfg.vocos.backbone)),
            head=instantiate_class(args=(), init=asdict(cfg.vocos.head)),
        )
        save(vocos, "Vocos.safetensors")
        dvae = DVAE(
            decoder_config=asdict(cfg.dvae.decoder),
            encoder_config=asdict(cfg.dvae.encoder),
            vq_config=asdict(cfg.dvae.vq),
            dim=cfg.dvae.decoder.idim,
        )
        save(dvae, "DVAE.safetensors")
        decoder = DVAE(decoder_config=asdict(cfg.decoder), dim=cfg.decoder.idim)
        # Both DVAEs share one coefficient vector in the real assets (the loader passes it on).
        decoder.coef.copy_(dvae.coef)
        save(decoder, "Decoder.safetensors")
        embed = Embed(
            cfg.embed.hidden_size,
            cfg.embed.num_audio_tokens,
            cfg.embed.num_text_tokens,
            cfg.embed.num_vq,
        )
        save(embed, "Embed.safetensors")
        g = asdict(cfg.gpt)
        llama_cfg = LlamaConfig(
            hidden_size=g["hidden_size"],
            intermediate_size=g["intermediate_size"],
            num_attention_heads=g["num_attention_heads"],
            num_key_value_heads=g["num_attention_heads"],
            num_hidden_layers=g["num_hidden_layers"],
            max_position_embeddings=g["max_position_embeddings"],
            # ChatTTS deletes embed_tokens after loading (it embeds with Embed): keep it tiny.
            vocab_size=8,
            use_cache=False,
        )
        gpt = LlamaModel(llama_cfg)
        gpt.save_pretrained(str(asset / "gpt"))
    _save_tokenizer(asset / "tokenizer")


def random_weights_key(kind: str, seed: int) -> str:
    blob = json.dumps(
        {"kind": kind, "seed": seed, "layout": LAYOUT_VERSION, "overrides": _overrides_for(kind)},
        sort_keys=True,
    )
    return f"{kind}-s{seed}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _overrides_for(kind: str) -> dict[str, dict[str, Any]]:
    if kind == "random-tiny":
        return TINY_OVERRIDES
    if kind == "random-deep":
        return DEEP_OVERRIDES
    if kind == "random":
        return {}
    raise ValueError(f"not a random weights kind: {kind!r}")


def build_random_weights(kind: str, cache_dir: Path, seed: int = 0) -> Path:
    """Build (once) and return the root of random weights of ``kind``.

    Concurrent callers (processes or threads) serialise on a lock file; the tree is written to a
    temporary sibling and renamed into place, so a reader sees all of it or nothing.
    """
    from ..quiet import quiet_libraries

    quiet_libraries()
    overrides = _overrides_for(kind)
    key = random_weights_key(kind, seed)
    cache_dir = Path(cache_dir)
    final = cache_dir / key
    if (final / MANIFEST).is_file():
        return final
    cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(cache_dir / f".{key}.lock"):
        if (final / MANIFEST).is_file():  # another process built it while we waited
            return final
        tmp = cache_dir / f".{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        t0 = time.perf_counter()
        try:
            _write_random_assets(tmp / "asset", overrides, seed)
            manifest = {
                "kind": kind,
                "seed": seed,
                "layout": LAYOUT_VERSION,
                "overrides": overrides,
                "weights_id": key,
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
            if final.exists():  # a stale, incomplete tree without manifest
                shutil.rmtree(final)
            os.rename(tmp, final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        log.warning(
            "built %s ChatTTS weights (RANDOM, not a real voice) in %.1fs at %s",
            kind,
            time.perf_counter() - t0,
            final,
        )
    return final
