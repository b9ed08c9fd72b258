"""Loading weights: the whole ``Chat`` through ChatTTS's own ``Chat._load`` (``load_model``), or
only what one stage runs, built with ChatTTS's classes the way ``Chat._load`` builds them from the
same asset files: the GPT stage's Embed, GPT, Speaker and tokenizer (``load_model(audio=False)``),
the vocoder stage's Decoder and Vocos (``load_vocoder``); then dtype, int8 and the CPU layout of
the GPT, and the memory care around them (tensors off the checkpoint's mapping, free heap pages
back to the OS).

Apart from finding the weights (``sources.py``), which it calls first."""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Optional

from ..config import ModelConfig
from ..heap import fix_mmap_threshold
from .chattts import _fresh_chattts_config, chattts_modules
from .sources import ResolvedWeights, resolve_weights

log = logging.getLogger(__name__)


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

    chat: Any  # ChatTTS.Chat, or a GptChat (load_model(audio=False))
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

    from ..quiet import quiet_libraries

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


@dataclass
class GptChat:
    """The part of ChatTTS's ``Chat`` the GPT stage runs (prompt building, prefill, decode, refine),
    built by ``load_model(audio=False)``: no DVAE, Decoder or Vocos, and none of the modules only
    they and ``Chat`` import (the DVAE quantiser's vector_quantize_pytorch with einx, Vocos, numba
    for the text normaliser). Full size on 2 cores: 0.7 s less CPU to load (6.3 -> 5.5 s) and
    1111 MiB of RSS once loaded against the whole ``Chat``'s 1386."""

    config: Any  # ChatTTS Config (a private copy)
    device: Any
    device_gpt: Any
    embed: Any  # ChatTTS Embed
    gpt: Any  # ChatTTS GPT
    speaker: Any  # ChatTTS Speaker
    tokenizer: Any  # ChatTTS Tokenizer

    @property
    def RefineTextParams(self) -> Any:  # noqa: N802 - Chat's name for it
        """ChatTTS's refine defaults, from ``Chat`` itself: the first refine imports the rest of
        ChatTTS (once, on the refine thread), reusing the modules loaded here."""
        import ChatTTS

        return ChatTTS.Chat.RefineTextParams


def _load_gpt_chat(weights: ResolvedWeights, device: Any, logger: logging.Logger) -> GptChat:
    """``Chat._load``'s Embed, GPT, Speaker and tokenizer steps (ChatTTS 0.2.5), alone."""
    config = _fresh_chattts_config(weights.overrides)
    gpt_mod, embed_mod, speaker_mod, tokenizer_mod = chattts_modules(
        "model.gpt", "model.embed", "model.speaker", "model.tokenizer"
    )
    paths = weights.asset_paths
    device_gpt = device if "mps" not in str(device) else select_device("cpu")
    embed = embed_mod.Embed(
        config.embed.hidden_size, config.embed.num_audio_tokens, config.embed.num_text_tokens, config.embed.num_vq
    )
    embed.load_pretrained(paths["embed_path"], device=device)
    embed = embed.to(device)
    gpt = gpt_mod.GPT(
        gpt_config=asdict(config.gpt),
        embed=embed,
        device=device,
        device_gpt=device_gpt,
        logger=logger,
    ).eval()
    gpt.load_pretrained(paths["gpt_ckpt_path"], paths["embed_path"])
    gpt.prepare(compile=False)
    speaker = speaker_mod.Speaker(config.gpt.hidden_size, config.spk_stat, device)
    tokenizer = tokenizer_mod.Tokenizer(paths["tokenizer_path"])
    return GptChat(config, device, device_gpt, embed, gpt, speaker, tokenizer)


def load_model(cfg: ModelConfig, logger: Optional[logging.Logger] = None, *, audio: bool = True) -> LoadedModel:
    """Resolve the weights and load them with ChatTTS's own ``Chat._load``; ``audio=False``: only
    the GPT's part (``GptChat``), for a process that never vocodes (the Acoustic stage)."""
    import torch

    from ..quiet import quiet_libraries

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
    logger = logger or logging.getLogger("ChatTTS")
    if audio:
        import ChatTTS

        chat = ChatTTS.Chat(logger)
        # Chat's nested config defaults are class-level singletons: overriding them in place would
        # leak into every later Chat, so the overrides go onto a private deep copy.
        chat.config = _fresh_chattts_config(weights.overrides) if weights.overrides else chat.config
        ok = chat._load(device=device, compile=False, **weights.asset_paths)
        if not ok:
            raise RuntimeError(f"ChatTTS failed to load weights from {weights.root}")
    else:
        with torch.no_grad():
            chat = _load_gpt_chat(weights, device, logger)
    dtype = getattr(torch, cfg.dtype)
    if dtype != torch.float32:
        if device.type == "cpu":
            log.warning("dtype %s on CPU is slow; consider float32", cfg.dtype)
        chat.gpt.gpt.to(dtype=dtype)
    quantize = cfg.quantize_on(device)
    if quantize != "none":
        from ..quant import quantize_gpt

        quantize = quantize_gpt(chat.gpt.gpt, quantize, device)
        if quantize != "none":
            own_tensors(chat.gpt.gpt)  # what int8 left (norms): off the checkpoint's mapping
    if quantize != "none":
        # Cache keys include the weights id: quantized weights decode to different audio.
        weights = replace(weights, weights_id=f"{weights.weights_id}+{quantize}")
    elif cfg.cpu_dual_layout and device.type == "cpu" and dtype == torch.float32:
        from ..linear import use_dual_layout

        use_dual_layout(chat.gpt.gpt)
    release_free_memory()
    elapsed = time.perf_counter() - t0
    log.info("loaded %s weights (%s) on %s in %.1fs", weights.kind, weights.source, device, elapsed)
    return LoadedModel(chat, weights, device, dtype, elapsed, threads, quantize)
