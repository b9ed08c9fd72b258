"""Hidden states -> PCM: ChatTTS's Decoder (hidden -> mel) and Vocos (mel -> 24 kHz audio).

Streaming decodes a sliding window instead of ChatTTS's "re-decode everything so far" (O(n^2)):
each decode sees the new tokens plus ``left_context_tokens`` already-emitted tokens before them,
and ``hold_back_tokens`` after them as right context, emitted by the next window or at the end.
Only the samples of the tokens between the context and the hold-back are emitted, so the
streamed audio matches a one-shot decode of the same hidden states (the convolutions' receptive
field beyond the context only adds a small error) and every window is bounded in size: total
work grows linearly with the utterance.

Windows end at fixed token positions (``window_ends``: 8, 16, 32, 56, 80, ... by default), each
decoded with exactly ``hold_back_tokens`` of right context, whatever chunks the hidden states
came in: a window's audio depends on its tokens alone, so the same tokens give the same audio,
bit for bit, under any load, through any door (a stream cut into small chunks or a whole
segment at once). Small windows first: the first audio needs 12 tokens, and the listener's
next 171 ms come 8 tokens later.

One GPT token = 2 mel frames = 512 samples; a one-shot decode of T tokens gives 512*T - 256
samples (Vocos's centred ISTFT), and so does the concatenated stream.

With ``cache_state`` (the default) a window does not decode its left context again: every
convolution carries its last input frames from the window before (engine/vocoder_net.py), so a
window is its new tokens plus the hold-back. ``precision`` bfloat16 runs the MLP matmuls in
bf16. ``cache_state=False, precision="float32"`` is the path above, on ChatTTS's own modules.
"""

from __future__ import annotations

import copy
import threading
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator, Optional

import numpy as np
import torch

from .config import VocoderConfig
from .pacing import SAMPLES_PER_TOKEN
from .vocoder_net import NetState, StreamingNet
from .weights.loading import LoadedModel, VocoderWeights, release_free_memory, select_device


@lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """bf16 dot-product instructions (x86 avx512_bf16 / AMX, Arm bf16): bf16 matmuls are ~3.6x the
    float32 rate there (bench vocoder), emulated elsewhere (slower than float32). Linux flags only."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    flags = set(text.split())
    return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})


def resolve_precision(precision: str, device: torch.device) -> torch.dtype:
    if precision == "auto":
        if device.type == "cuda":
            native = torch.cuda.is_bf16_supported()
        else:
            native = device.type == "cpu" and cpu_has_native_bf16()
        precision = "bfloat16" if native else "float32"
    return getattr(torch, precision)


class VocoderEngine:
    """Stateless decode of hidden states; safe to share between streams (one lock per call)."""

    def __init__(self, model: LoadedModel | VocoderWeights, config: VocoderConfig = VocoderConfig()):
        parts = model.vocoder_weights() if isinstance(model, LoadedModel) else model
        self.cfg = config
        self.weights = parts.weights
        self.decoder = parts.decoder
        self.vocos = parts.vocos
        self.device = parts.device
        if config.device is not None and select_device(config.device) != torch.device(parts.device):
            # Copies: the model's own modules stay where they are (another stage may use them).
            self.device = select_device(config.device)
            self.decoder = copy.deepcopy(parts.decoder).to(self.device)
            self.vocos = copy.deepcopy(parts.vocos).to(self.device)
        # Vocos runs on CPU for mps/npu in ChatTTS; follow the module's own device.
        self.vocos_device = next(self.vocos.parameters()).device
        self.dtype = resolve_precision(config.precision, self.vocos_device)
        # The layer-by-layer net (engine/vocoder_net.py) runs where Vocos runs (it holds both).
        self.net: Optional[StreamingNet] = None
        if config.cache_state or self.dtype != torch.float32:
            self.net = StreamingNet(self.decoder, self.vocos, self.vocos_device, self.dtype)
            # The net holds its own (packed) weights and serves every call, one-shot decodes
            # included: the modules' float32 weights (~150 MB at full size) go once nothing else
            # holds them (the Vocoder stage's loader does not; an in-process Chat still does).
            self.decoder = self.vocos = None
            release_free_memory()
        self._lock = threading.Lock()
        # Called with the tokens of every decode call (an observer: metrics, tests of the window).
        self.on_decode: Optional[Callable[[int], None]] = None

    @torch.inference_mode()
    def decode(self, hidden: torch.Tensor) -> np.ndarray:
        """One-shot decode of (T, 768) hidden states -> float32 PCM of 512*T - 256 samples."""
        if hidden.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        if self.net is not None:
            return self.window(hidden, NetState(), None)
        x = hidden.to(self.device, torch.float32).T.unsqueeze(0)  # (1, 768, T)
        with self._lock:
            if self.on_decode is not None:
                self.on_decode(int(hidden.shape[0]))
            mel = self.decoder(x)  # (1, 100, 2T)
            wav = self.vocos.decode(mel.to(self.vocos_device))
        return wav[0].float().cpu().numpy()

    def window(self, hidden: torch.Tensor, state: NetState, emit_tokens: Optional[int]) -> np.ndarray:
        """One window of a stream with carried ``state`` (StreamingNet.window)."""
        assert self.net is not None
        with self._lock:
            if self.on_decode is not None:
                self.on_decode(int(hidden.shape[0]))
            wav = self.net.window(hidden, state, emit_tokens)
        return wav.float().cpu().numpy()

    def stream(self, config: Optional[VocoderConfig] = None) -> "VocoderStream":
        return VocoderStream(self, config or self.cfg)


def window_ends(first: int, size: int) -> Iterator[int]:
    """Where a segment's windows end, in tokens from its start: ``first``, then windows that
    double from ``first`` up to ``size`` (8, 8, 16, 24, 24, ... tokens: ends 8, 16, 32, 56, 80)."""
    end, step = first, first
    while True:
        yield end
        end += step
        step = min(size, step * 2)


class VocoderStream:
    """Per-stream sliding-window state: ``push`` hidden chunks, ``finish`` at the end."""

    def __init__(self, vocoder: VocoderEngine, cfg: VocoderConfig):
        self.vocoder = vocoder
        self.cfg = cfg
        self._hidden: Optional[torch.Tensor] = None  # tokens kept: left context + not yet emitted
        self._offset = 0  # absolute index of self._hidden[0]
        self._emitted = 0  # absolute index of the first token not yet emitted
        self._total = 0  # tokens received
        self._ends = window_ends(cfg.min_window_tokens, cfg.window_tokens)
        self._next_end = next(self._ends)  # where the next window ends
        self.samples_out = 0
        self._state = NetState() if cfg.cache_state and vocoder.net is not None else None
        # Tokens kept before the next window: none when the convolutions carry their state.
        self._context = 0 if self._state is not None else cfg.left_context_tokens

    def _append(self, hidden: torch.Tensor) -> None:
        hidden = hidden.detach().to("cpu", torch.float32)
        self._hidden = hidden if self._hidden is None else torch.cat([self._hidden, hidden])
        self._total += hidden.shape[0]

    def push(self, hidden: torch.Tensor) -> np.ndarray:
        """Add (n, 768) hidden states; returns the PCM of every window complete now (its end and
        its right context received; maybe none)."""
        if hidden.shape[0]:
            self._append(hidden)
        out = []
        while self._total >= self._next_end + self.cfg.hold_back_tokens:
            out.append(self._decode_until(self._next_end, final=False))
            self._next_end = next(self._ends)
        if not out:
            return np.zeros(0, dtype=np.float32)
        return out[0] if len(out) == 1 else np.concatenate(out)

    def finish(self) -> np.ndarray:
        """Emit everything left (the last window, to the segment's end)."""
        if self._total == self._emitted:
            return np.zeros(0, dtype=np.float32)
        return self._decode_until(self._total, final=True)

    def _decode_until(self, end: int, final: bool) -> np.ndarray:
        start = self._emitted
        ctx_start = max(self._offset, start - self._context)
        # Exactly hold_back_tokens of right context (decoded, not emitted): never more, so the
        # window's audio does not depend on how much had arrived when it was decoded.
        win_end = self._total if final else end + self.cfg.hold_back_tokens
        window = self._hidden[ctx_start - self._offset : win_end - self._offset]
        if self._state is not None:
            out = self.vocoder.window(window, self._state, None if final else end - start)
        else:
            wav = self.vocoder.decode(window)
            a = (start - ctx_start) * SAMPLES_PER_TOKEN
            b = len(wav) if final else (end - ctx_start) * SAMPLES_PER_TOKEN
            out = wav[a:b]
        self._emitted = end
        # Keep only what the next window needs as left context.
        keep_from = max(self._offset, end - self._context)
        self._hidden = self._hidden[keep_from - self._offset :]
        self._offset = keep_from
        self.samples_out += len(out)
        return out
