"""ChatTTS weights: find real ones, or build random ones in ChatTTS's own asset layout.

Every source ends in the same call, ``ChatTTS.Chat._load(**asset_paths)``, so random weights
exercise exactly the loading code that real weights do. ``Chat.load(source="custom")`` is not
used for them because it checks the SHA-256 sums of the published assets.

Random weights (``random`` full size, ``random-tiny`` with a 1-layer GPT and shallow decoder and
vocoder) are built once per (kind, seed, layout version) into the cache directory, under a file
lock and with an atomic rename, so replicas starting together neither clash nor read a
half-written tree. A manifest ``chattts_serve.json`` beside ``asset/`` records the config
overrides the tiny variant needs; real weights have no manifest and load with ChatTTS's defaults.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Optional

from filelock import FileLock

from .config import ModelConfig, WeightsConfig
from .heap import fix_mmap_threshold

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

WeightsKind = Literal["real", "random"]


@dataclass(frozen=True)
class ResolvedWeights:
    """Where the assets are and what they are."""

    source: str  # the source that was actually used
    root: Path  # directory holding asset/
    kind: WeightsKind
    weights_id: str  # stable id of these weights (cache keys use it)
    overrides: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def asset_paths(self) -> dict[str, str]:
        (config,) = chattts_modules("config.config")
        return {k: str(self.root / v) for k, v in asdict(config.Path()).items()}


# --------------------------------------------------------------------------- random weights


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


def _apply_overrides(config: Any, overrides: dict[str, dict[str, Any]]) -> None:
    """Set attributes on ChatTTS's nested Config dataclasses from dotted paths."""
    for dotted, values in overrides.items():
        target = config
        for part in dotted.split("."):
            target = getattr(target, part)
        for key, value in values.items():
            if not hasattr(target, key):
                raise KeyError(f"ChatTTS config {dotted} has no field {key!r}")
            setattr(target, key, value)


def chattts_modules(*names: str, defer: tuple[str, ...] = ()) -> list[Any]:
    """ChatTTS's modules by dotted name under the package (``"model.dvae"``, ``"config"``),
    imported without running ``ChatTTS/__init__.py`` and ``ChatTTS/model/__init__.py``: those
    import the GPT and with it transformers, ~230 MiB of RSS in a process that never runs the GPT
    (the Vocoder stage). The two packages stand in as bare namespaces while the modules load and
    go again, so a later ``import ChatTTS`` runs them for real and reuses the modules loaded
    here. Where ChatTTS is already imported, or its layout differs, a plain import.

    ``defer``: top-level packages those modules import but this process may never call, each
    replaced while they load by a stand-in whose names construct through the real package,
    imported at the first call. ``model.dvae`` imports ``vector_quantize_pytorch`` for the DVAE
    encoder's quantiser, which imports einx and with it ``torch._dynamo`` and triton (~150 MiB
    of RSS), while the Decoder is a DVAE without a quantiser. A module that needs more of a
    deferred package at import time (a submodule, a base class) makes this a plain import."""
    import importlib
    import importlib.util
    import sys
    import types

    def plain() -> list[Any]:
        return [importlib.import_module(f"ChatTTS.{n}") for n in names]

    if "ChatTTS" in sys.modules:
        return plain()
    spec = importlib.util.find_spec("ChatTTS")
    if spec is None or not spec.submodule_search_locations:
        return plain()
    root = Path(list(spec.submodule_search_locations)[0])
    stubs: dict[str, types.ModuleType] = {}
    for pkg, path in (("ChatTTS", root), ("ChatTTS.model", root / "model")):
        stub = types.ModuleType(pkg)
        stub.__path__ = [str(path)]
        stub.__package__ = pkg
        stubs[pkg] = sys.modules[pkg] = stub
    for pkg in defer:
        if pkg not in sys.modules:
            stubs[pkg] = sys.modules[pkg] = _Deferred(pkg)
    try:
        return [importlib.import_module(f"ChatTTS.{n}") for n in names]
    except Exception:  # noqa: BLE001 - another ChatTTS layout: import it the usual way
        for n in [m for m in sys.modules if m.startswith("ChatTTS.")]:
            del sys.modules[n]
        for pkg, stub in stubs.items():
            if sys.modules.get(pkg) is stub:
                del sys.modules[pkg]
        stubs.clear()
        return plain()
    finally:
        for pkg, stub in stubs.items():
            if sys.modules.get(pkg) is stub:
                del sys.modules[pkg]


class _Deferred(ModuleType):
    """A stand-in for a package (``chattts_modules(defer=...)``): ``from pkg import Name`` gives a
    function that imports the real package on its first call and calls its ``Name``."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        pkg = self.__name__

        def construct(*args: Any, **kwargs: Any) -> Any:
            import importlib

            return getattr(importlib.import_module(pkg), name)(*args, **kwargs)

        construct.__name__ = construct.__qualname__ = name
        return construct


def _fresh_chattts_config(overrides: dict[str, dict[str, Any]]) -> Any:
    """A ChatTTS Config with overrides applied; its nested defaults are shared class-level
    instances, so deep-copy before touching them."""
    import copy

    (config,) = chattts_modules("config.config")
    cfg = copy.deepcopy(config.Config())
    _apply_overrides(cfg, overrides)
    return cfg


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
    if kind == "random":
        return {}
    raise ValueError(f"not a random weights kind: {kind!r}")


def build_random_weights(kind: str, cache_dir: Path, seed: int = 0) -> Path:
    """Build (once) and return the root of random weights of ``kind``.

    Concurrent callers (processes or threads) serialise on a lock file; the tree is written to a
    temporary sibling and renamed into place, so a reader sees all of it or nothing.
    """
    from .quiet import quiet_libraries

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


# --------------------------------------------------------------------------- resolving a source


def _asset_root(path: Path) -> Path:
    """Accept either the directory holding asset/ or asset/ itself."""
    path = path.expanduser()
    if (path / "asset").is_dir():
        return path
    if path.name == "asset" and path.is_dir():
        return path.parent
    raise FileNotFoundError(f"no ChatTTS asset directory under {path}")


def _hub_snapshot() -> Optional[Path]:
    """The newest cached snapshot of 2Noise/ChatTTS, as ChatTTS's own loader finds it."""
    hf_home = Path(os.getenv("HF_HOME", Path.home() / ".cache" / "huggingface"))
    snaps = hf_home / "hub" / "models--2Noise--ChatTTS" / "snapshots"
    if not snaps.is_dir():
        return None
    found = [p for p in snaps.iterdir() if (p / "asset" / "gpt").is_dir()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


def _download_from_hub(timeout_s: float) -> Optional[Path]:
    """ChatTTS's download (snapshot_download of the published files), bounded in time."""
    os.environ.setdefault("HF_HUB_ETAG_TIMEOUT", str(int(timeout_s)))
    os.environ.setdefault("HF_HUB_DOWNLOAD_TIMEOUT", str(int(timeout_s)))
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(
            repo_id="2Noise/ChatTTS", allow_patterns=["*.yaml", "*.json", "*.safetensors"]
        )
    except Exception as exc:  # noqa: BLE001 - any hub failure means "not available"
        log.warning("ChatTTS weights not reachable on the hub: %s", exc.__class__.__name__)
        return None
    return Path(path)


def _real_weights_id(root: Path) -> str:
    h = hashlib.sha256()
    for rel in ("asset/gpt/config.json", "asset/gpt/model.safetensors", "asset/Decoder.safetensors"):
        p = root / rel
        h.update(rel.encode())
        if p.is_file():
            st = p.stat()
            h.update(f"{st.st_size}:{int(st.st_mtime)}".encode())
    return "real-" + h.hexdigest()[:12]


def _from_root(root: Path, source: str) -> ResolvedWeights:
    manifest = root / MANIFEST
    if manifest.is_file():
        m = json.loads(manifest.read_text())
        return ResolvedWeights(source, root, "random", m["weights_id"], m.get("overrides", {}))
    return ResolvedWeights(source, root, "real", _real_weights_id(root))


def resolve_weights(cfg: WeightsConfig) -> ResolvedWeights:
    """Find (or build) the weights a config asks for. Applies the CHATTTS_WEIGHTS override."""
    cfg = cfg.resolved()
    src = cfg.source
    if src in ("random", "random-tiny"):
        return _from_root(build_random_weights(src, cfg.cache_path, cfg.seed), src)
    if src == "local":
        if not cfg.path:
            raise ValueError("weights source 'local' needs a path")
        return _from_root(_asset_root(Path(cfg.path)), "local")
    if src == "huggingface":
        snap = _hub_snapshot() or _download_from_hub(cfg.hub_timeout_s)
        if snap is None:
            raise RuntimeError("ChatTTS weights are neither in the hub cache nor downloadable")
        return _from_root(_asset_root(snap), "huggingface")
    # auto: local path, hub cache, hub, then random (loudly).
    if cfg.path:
        with contextlib.suppress(FileNotFoundError):
            return _from_root(_asset_root(Path(cfg.path)), "local")
        log.warning("weights path %s has no ChatTTS assets; trying the hub", cfg.path)
    snap = _hub_snapshot()
    if snap is None and not os.environ.get("HF_HUB_OFFLINE"):
        snap = _download_from_hub(cfg.hub_timeout_s)
    if snap is not None:
        return _from_root(_asset_root(snap), "huggingface")
    log.warning(
        "NO REAL ChatTTS WEIGHTS FOUND: serving RANDOM weights (noise, not speech). "
        "Put real weights in the hub cache or set weights.path / CHATTTS_WEIGHTS_PATH."
    )
    return _from_root(build_random_weights("random", cfg.cache_path, cfg.seed), "random")


# --------------------------------------------------------------------------- loading


def own_tensors(module: Any) -> None:
    """Copy every parameter and buffer of ``module`` into memory of its own. transformers loads a
    safetensors checkpoint as views of the file's mapping, and one such view left alive keeps the
    whole mapping, every page read once resident: after int8 replaces the GPT's linear layers its
    norms alone kept the 720 MiB float32 file in the Acoustic process's RSS."""
    import torch

    copies: dict[int, Any] = {}  # a tensor shared by two modules stays shared
    with torch.no_grad():
        for sub in module.modules():
            for table, wrap in ((sub._parameters, True), (sub._buffers, False)):
                for name, t in list(table.items()):
                    if t is not None:
                        if id(t) not in copies:
                            c = t.detach().clone()
                            copies[id(t)] = torch.nn.Parameter(c, requires_grad=t.requires_grad) if wrap else c
                        table[name] = copies[id(t)]


def release_free_memory() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``; elsewhere nothing).
    Loading frees far more than it keeps (state dicts copied into modules, float weights packed
    or quantized, modules dropped) and glibc keeps freed chunks below its mmap threshold mapped:
    ~100 MiB of the Acoustic replica's RSS after loading (bench/README.md, "Memory")."""
    import ctypes
    import ctypes.util
    import gc

    gc.collect()
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)


def select_device(name: str) -> "Any":
    import torch

    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        return torch.device("cpu")
    return torch.device(name)


@dataclass
class LoadedModel:
    """A loaded ChatTTS ``Chat`` plus what the engine needs to know about it."""

    chat: Any  # ChatTTS.Chat
    weights: ResolvedWeights
    device: Any  # torch.device
    dtype: Any  # torch.dtype of the GPT
    load_seconds: float
    torch_threads: int = 1  # intra-op threads load_model applied (each torch thread applies it too)
    quantize: str = "none"  # model.quantize in effect (engine/quant.py)

    @property
    def is_random(self) -> bool:
        return self.weights.kind == "random"

    def vocoder_weights(self) -> "VocoderWeights":
        return VocoderWeights(self.chat.decoder, self.chat.vocos, self.device, self.weights)

    def drop_audio_modules(self) -> None:
        """Free the Decoder, Vocos and DVAE: a process that only runs the GPT (the Acoustic
        stage) keeps none of them. ``Chat._load`` always loads all of them."""
        for name in ("decoder", "vocos", "dvae"):
            if hasattr(self.chat, name):
                delattr(self.chat, name)
        release_free_memory()


@dataclass
class VocoderWeights:
    """What turns hidden states into audio: ChatTTS's Decoder (hidden -> mel) and Vocos."""

    decoder: Any  # ChatTTS.model.DVAE (decoder only)
    vocos: Any  # vocos.Vocos
    device: Any  # torch.device of the decoder
    weights: ResolvedWeights


def load_vocoder(cfg: ModelConfig) -> VocoderWeights:
    """Load only the Decoder and Vocos (the vocoder stage needs nothing else: no GPT, no DVAE
    encoder, no tokenizer), built the way ``Chat._load`` builds them, from the same asset files."""
    import torch
    from vocos import Vocos
    from vocos.pretrained import instantiate_class

    from .quiet import quiet_libraries

    quiet_libraries()
    fix_mmap_threshold(cfg.mmap_threshold_bytes)
    torch.set_num_threads(cfg.torch_threads or torch.get_num_threads())
    # Not ChatTTS's GPT (nor transformers), nor the DVAE encoder's quantiser (vector_quantize_pytorch).
    dvae, io = chattts_modules("model.dvae", "utils.io", defer=("vector_quantize_pytorch",))
    DVAE, load_safetensors = dvae.DVAE, io.load_safetensors
    weights = resolve_weights(cfg.weights)
    device = select_device(cfg.device)
    config = _fresh_chattts_config(weights.overrides)
    paths = weights.asset_paths
    with torch.no_grad():
        vocos = Vocos(
            feature_extractor=instantiate_class(args=(), init=asdict(config.vocos.feature_extractor)),
            backbone=instantiate_class(args=(), init=asdict(config.vocos.backbone)),
            head=instantiate_class(args=(), init=asdict(config.vocos.head)),
        )
        # ChatTTS keeps Vocos on CPU for mps (its complex ISTFT crashes there).
        vocos = vocos.to("cpu" if device.type == "mps" else device).eval()
        vocos.load_state_dict(load_safetensors(paths["vocos_ckpt_path"]))
        # ``coef`` is a buffer of the checkpoint: the value passed here is overwritten on load.
        decoder = DVAE(decoder_config=asdict(config.decoder), dim=config.decoder.idim, device=device)
        decoder.load_pretrained(paths["decoder_ckpt_path"], device)
    return VocoderWeights(decoder.eval(), vocos, device, weights)


def load_model(cfg: ModelConfig, logger: Optional[logging.Logger] = None) -> LoadedModel:
    """Resolve the weights and load them with ChatTTS's own ``Chat._load``."""
    import torch
    import ChatTTS

    from .quiet import quiet_libraries

    quiet_libraries()
    fix_mmap_threshold(cfg.mmap_threshold_bytes)
    # Always call it, even to keep the default (OMP_NUM_THREADS): besides the count it turns off
    # MKL's dynamic threading, which otherwise rebuilds OpenMP teams at every MKL/non-MKL
    # boundary (pytorch#13757) and slows every GPT step (bench/README.md, "Measurements behind
    # code choices").
    threads = cfg.torch_threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    weights = resolve_weights(cfg.weights)
    device = select_device(cfg.device)
    chat = ChatTTS.Chat(logger or logging.getLogger("ChatTTS"))
    # Chat's nested config defaults are class-level singletons: overriding them in place would
    # leak into every later Chat, so the overrides go onto a private deep copy.
    chat.config = _fresh_chattts_config(weights.overrides) if weights.overrides else chat.config
    ok = chat._load(device=device, compile=False, **weights.asset_paths)
    if not ok:
        raise RuntimeError(f"ChatTTS failed to load weights from {weights.root}")
    dtype = getattr(torch, cfg.dtype)
    if dtype != torch.float32:
        if device.type == "cpu":
            log.warning("dtype %s on CPU is slow; consider float32", cfg.dtype)
        chat.gpt.gpt.to(dtype=dtype)
    quantize = cfg.quantize_on(device)
    if quantize != "none":
        from .quant import quantize_gpt

        quantize = quantize_gpt(chat.gpt.gpt, quantize, device)
        if quantize != "none":
            own_tensors(chat.gpt.gpt)  # what int8 left (norms): off the checkpoint's mapping
    if quantize != "none":
        # Cache keys include the weights id: quantized weights decode to different audio.
        weights = replace(weights, weights_id=f"{weights.weights_id}+{quantize}")
    elif cfg.cpu_dual_layout and device.type == "cpu" and dtype == torch.float32:
        from .linear import use_dual_layout

        use_dual_layout(chat.gpt.gpt)
    release_free_memory()
    elapsed = time.perf_counter() - t0
    log.info("loaded %s weights (%s) on %s in %.1fs", weights.kind, weights.source, device, elapsed)
    return LoadedModel(chat, weights, device, dtype, elapsed, threads, quantize)
