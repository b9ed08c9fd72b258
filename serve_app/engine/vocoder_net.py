"""The Vocoder's fast path: ChatTTS's Decoder and Vocos run layer by layer, streaming.

Today's sliding window (vocoder.py, ``cache_state=False``) decodes every window from scratch,
``left_context_tokens`` already-emitted tokens included: at the shipped chunk sizes 44 tokens
are decoded for every 24 emitted. Here every convolution keeps the last frames of its input
(its left reach: 1 to 6 frames) from the window before, as do the ISTFT's overlap-add (two
spectral frames), so a window decodes only its new tokens plus the held-back ones (28 for 24).
The carried frames were computed with the right context that window had (the hold-back), as
the samples already emitted were; the left context is no longer cut at 16 tokens (the
Decoder's receptive field is ~37 tokens each side).

Layout: time-major (frames, channels) throughout, so the pointwise layers (the ConvNeXt MLPs:
~95% of the FLOPs) are plain GEMMs, and every convolution is one GEMM over its taps
(depthwise ones a few multiply-adds). ``matmul_dtype`` bfloat16 runs those MLP GEMMs in
bfloat16 (fp32 accumulation; ~3.6x the fp32 GEMM rate on a CPU with avx512_bf16); the
residual stream, the norms, the convolutions and the ISTFT head stay float32 (the head's
phases and log-magnitudes are too sensitive for bf16).

Pure torch, so the same code runs on CPU and CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

HOP = 256  # samples per mel frame; one GPT token = 2 frames
ISTFT_CARRY = 2  # spectral frames carried for the overlap-add (frame f spans f*HOP +- 512)


@dataclass
class NetState:
    """A stream's carried frames: per convolution its input's last ``reach`` frames, and the
    ISTFT's last spectral frames. Empty at the start (zero padding, as a one-shot decode)."""

    convs: dict[int, torch.Tensor] = field(default_factory=dict)
    spec: Optional[torch.Tensor] = None
    frames: int = 0  # frames emitted so far (absolute index of the next window's first frame)


class _Conv:
    """Conv1d in time-major layout, with its left state: depthwise as k multiply-adds (faster
    than conv1d on a transposed copy), otherwise one GEMM over the taps side by side."""

    def __init__(self, conv: torch.nn.Conv1d, device, depthwise: bool = False):
        self.k = conv.kernel_size[0]
        self.d = conv.dilation[0]
        self.reach = self.d * (self.k // 2)
        w = conv.weight.detach().to(device, torch.float32)  # (Cout, Cin/groups, k)
        self.depthwise = depthwise
        if depthwise:
            self.w = w[:, 0, :].T.contiguous()  # (k, C)
            self.b = None if conv.bias is None else conv.bias.detach().to(device, torch.float32)
        else:  # (Cout, k*Cin), input columns tap-major
            self.lin = _Linear(w.permute(0, 2, 1).reshape(w.shape[0], -1), conv.bias, device)

    def __call__(self, x: torch.Tensor, state: NetState, key: int, keep: int) -> torch.Tensor:
        """x (T, C) -> (T, Cout); the left ``reach`` frames come from ``state`` (zeros at first),
        the right ones are zeros (the window's end); the input frames ending at ``keep`` are kept."""
        r, n = self.reach, x.shape[0]
        if r == 0:
            return self.lin(x)
        left = state.convs.get(key)
        if left is None:
            left = x.new_zeros(r, x.shape[1])
        xp = torch.cat([left, x, x.new_zeros(r, x.shape[1])])
        state.convs[key] = xp[keep : keep + r].clone()  # input frames [keep - r, keep)
        if not self.depthwise:
            return self.lin(torch.cat([xp[j * self.d : j * self.d + n] for j in range(self.k)], dim=1))
        y = xp[0:n] * self.w[0]
        for j in range(1, self.k):
            y.addcmul_(xp[j * self.d : j * self.d + n], self.w[j])
        return y if self.b is None else y.add_(self.b)


class _Linear:
    """x @ w.T + b (then GELU with ``gelu``) in ``dtype``. On CPU the weight is packed once into
    oneDNN's blocked layout (the ops inductor uses for frozen weights): F.linear reorders it at
    every call, and a window's ~40 weight matrices (75 MB in bf16) do not stay in cache, so at
    a window's 50-100 rows that costs ~1.2-1.6x the GEMMs (bench vocoder). Falls back to F.linear
    where the op is missing or disagrees."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        device: torch.device,
        dtype: torch.dtype = torch.float32,
        gelu: bool = False,
    ):
        self.w = weight.detach().to(device, dtype).contiguous()  # (out, in)
        self.dtype = dtype
        self.b = None if bias is None else bias.detach().to(device, dtype)
        self.gelu = gelu
        self.packed = None
        if device.type == "cpu" and torch.backends.mkldnn.is_available():
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(self.w, 64)
                x = torch.randn(3, self.w.shape[1], dtype=dtype)
                with torch.inference_mode():
                    ok = torch.allclose(self._packed(x, packed).float(), self._plain(x).float(), rtol=0.02, atol=0.02)
                self.packed = packed if ok else None
                if ok:
                    self.w = None  # the packed copy serves every call (a bf16 copy is ~75 MB in all)
            except (RuntimeError, AttributeError):  # no oneDNN linear ops in this build
                self.packed = None

    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.w, self.b)
        return F.gelu(y) if self.gelu else y

    def _packed(self, x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(
            x, packed, self.b, "gelu" if self.gelu else "none", [], "none" if self.gelu else ""
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(self.dtype)
        return self._plain(x) if self.packed is None else self._packed(x, self.packed)


class _Block:
    """ConvNeXt block (ChatTTS's and Vocos's are the same maths): x + scale * MLP(LN(dwconv(x)))."""

    def __init__(self, blk: torch.nn.Module, device, mm_dtype: torch.dtype):
        self.dw = _Conv(blk.dwconv, device, depthwise=True)
        self.ln = (blk.norm.weight.detach().to(device), blk.norm.bias.detach().to(device), blk.norm.eps)
        self.pw1 = _Linear(blk.pwconv1.weight, blk.pwconv1.bias, device, mm_dtype, gelu=True)
        self.pw2 = _Linear(blk.pwconv2.weight, blk.pwconv2.bias, device, mm_dtype)
        scale = blk.gamma if hasattr(blk, "gamma") else blk.weight  # Vocos: gamma; ChatTTS: weight
        self.scale = None if scale is None else scale.detach().to(device, torch.float32)

    def __call__(self, x: torch.Tensor, state: NetState, key: int, keep: int) -> torch.Tensor:
        y = self.dw(x, state, key, keep)
        y = F.layer_norm(y, y.shape[-1:], self.ln[0], self.ln[1], self.ln[2])
        y = self.pw2(self.pw1(y)).float()
        return x.add_(y * self.scale) if self.scale is not None else x.add_(y)


class StreamingNet:
    """Decoder + Vocos as time-major layers with carried state (module docstring)."""

    def __init__(
        self,
        decoder: torch.nn.Module,
        vocos: torch.nn.Module,
        device: torch.device,
        matmul_dtype: torch.dtype = torch.float32,
    ):
        dev = torch.device(device)
        self.device = dev
        dd = decoder.decoder  # DVAEDecoder
        self.dec_in = [_Conv(dd.conv_in[0], dev), _Conv(dd.conv_in[2], dev)]
        self.dec_blocks = [_Block(b, dev, matmul_dtype) for b in dd.decoder_block]
        self.dec_out = _Conv(dd.conv_out, dev)
        self.out_conv = _Conv(decoder.out_conv, dev)
        self.coef = decoder.coef.detach().to(dev, torch.float32).view(1, -1)  # (1, 100)
        bb = vocos.backbone
        self.embed = _Conv(bb.embed, dev)
        self.norm = (bb.norm.weight.detach().to(dev), bb.norm.bias.detach().to(dev), bb.norm.eps)
        self.voc_blocks = [_Block(b, dev, matmul_dtype) for b in bb.convnext]
        self.final_norm = (
            bb.final_layer_norm.weight.detach().to(dev),
            bb.final_layer_norm.bias.detach().to(dev),
            bb.final_layer_norm.eps,
        )
        head = vocos.head
        self.head = _Linear(head.out.weight, head.out.bias, dev)
        istft = head.istft
        self.n_fft, self.hop = istft.n_fft, istft.hop_length
        if self.hop != HOP or istft.padding != "center":
            raise ValueError(f"unsupported Vocos head: hop {self.hop}, padding {istft.padding}")
        self.istft_window = istft.window.detach().to(dev, torch.float32)

    def reach_frames(self) -> dict[str, int]:
        """Each side's receptive field in mel frames (2 per token): the Decoder's, Vocos's convolutions'."""
        dec = sum(c.reach for c in self.dec_in + [self.dec_out, self.out_conv]) + sum(
            b.dw.reach for b in self.dec_blocks
        )
        return {
            "decoder": dec,
            "vocos": self.embed.reach + sum(b.dw.reach for b in self.voc_blocks),
            "istft": self.n_fft // 2 // self.hop,
        }

    def mel(self, hidden: torch.Tensor, state: NetState, keep: int) -> torch.Tensor:
        """(T, 768) hidden -> (2T, 100) mel frames (ChatTTS's Decoder)."""
        x = hidden.reshape(-1, 384)  # token t -> frames 2t, 2t+1 (halves of its 768 channels)
        x = F.gelu(self.dec_in[0](x, state, 0, keep))
        x = self.dec_in[1](x, state, 1, keep)
        for i, blk in enumerate(self.dec_blocks):
            x = blk(x, state, 10 + i, keep)
        x = self.dec_out(x, state, 2, keep)
        return self.out_conv(x, state, 3, keep).mul_(self.coef)

    def spectra(self, mel: torch.Tensor, state: NetState, keep: int) -> torch.Tensor:
        """(F, 100) mel -> (F, 513) complex spectra (Vocos's backbone and head, before the ISTFT)."""
        x = self.embed(mel, state, 4, keep)
        x = F.layer_norm(x, x.shape[-1:], *self.norm[:2], self.norm[2])
        for i, blk in enumerate(self.voc_blocks):
            x = blk(x, state, 100 + i, keep)
        x = F.layer_norm(x, x.shape[-1:], *self.final_norm[:2], self.final_norm[2])
        x = self.head(x)
        mag, p = x.chunk(2, dim=1)
        mag = torch.exp(mag).clip(max=1e2)
        return torch.complex(mag * torch.cos(p), mag * torch.sin(p))

    def audio(self, spec: torch.Tensor, state: NetState, emit_frames: Optional[int]) -> torch.Tensor:
        """Overlap-add of the window's spectra (after the carried ones) -> the samples of frames
        [state.frames, state.frames + emit_frames) (None: to the end, the last window)."""
        carried = 0 if state.spec is None else state.spec.shape[0]
        s = spec if state.spec is None else torch.cat([state.spec, spec])
        wav = torch.istft(s.T.unsqueeze(0), self.n_fft, self.hop, self.n_fft, self.istft_window, center=True)[0]
        a = carried * self.hop
        if emit_frames is not None:
            end = carried + emit_frames
            state.spec = s[end - ISTFT_CARRY : end].clone() if end >= ISTFT_CARRY else s[:end].clone()
            return wav[a : end * self.hop]
        return wav[a:]

    @torch.inference_mode()
    def window(self, hidden: torch.Tensor, state: NetState, emit_tokens: Optional[int]) -> torch.Tensor:
        """Decode (T, 768) hidden states that follow the stream's emitted ones; emit the samples of
        their first ``emit_tokens`` (None: all, the stream's end) and carry the state past them."""
        x = hidden.to(self.device, torch.float32)
        keep = 2 * (x.shape[0] if emit_tokens is None else emit_tokens)
        spec = self.spectra(self.mel(x, state, keep), state, keep)
        wav = self.audio(spec, state, None if emit_tokens is None else keep)
        state.frames += keep
        return wav

    def decode(self, hidden: torch.Tensor) -> torch.Tensor:
        """One-shot decode (a fresh state, everything emitted)."""
        return self.window(hidden, NetState(), None)
