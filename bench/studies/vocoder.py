"""The Vocoder stage alone: audio seconds per second per CPU core, today's path against the optimised one.

Random hidden states (seeded; the vocoder's cost does not depend on their values) are fed as the
Acoustic stage sends them: a first chunk of ``first_chunk_tokens``, then ``chunk_tokens`` at a
time, each ``push``ed into a fresh ``VocoderStream`` per utterance, then ``finish``. One torch
thread, so every figure is per core; time is the thread's CPU time (what a core spends: other
load on a shared box stretches the wall clock, not this), the wall time is recorded beside it.

Each variant is a ``VocoderConfig``: ``today`` (re-decoded left context, float32: ChatTTS's own
modules), each optimisation alone, and the shipped default; repetitions are interleaved and the
median is kept. The split: the Decoder (hidden -> mel), Vocos (mel -> PCM, ISTFT included), the
rest (window bookkeeping, copies). Every encoder of ``AUDIO_FORMATS`` is timed on the default's
PCM, as the stage streams it. SNR: each variant's streamed PCM against today's streamed PCM, and
against a one-shot float32 decode, on the same hidden states.

``--layer-scale S`` sets the Decoder's ConvNeXt layer scales to S: random weights start them at
1e-6, so its 12 blocks are near identity and its receptive field barely shows in the SNR (real
weights learn them); S ~ 0.2-0.5 stresses the streaming with a receptive field that matters.

    python -m bench vocoder                          # full-size random weights, ~3 min on one core
    python -m bench vocoder --reps 1 --utterances 1  # quicker
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path
from typing import Any, Callable, Optional

from ..lib.harness import Harness, logger
from ..lib.report import Col, Doc, Figure, Kind, Panel, fmt, grouped_bars
from ..lib.stats import median

_log = logger("vocoder")

# name -> VocoderConfig fields (today's path first: the reference of speed-ups and SNR).
VARIANTS: dict[str, dict] = {
    "today": {"cache_state": False, "precision": "float32"},
    "bf16 only": {"cache_state": False, "precision": "bfloat16"},
    "carried state only": {"cache_state": True, "precision": "float32"},
    "default": {},
}


class _Timed:
    """A callable that adds its CPU time to ``bucket[key]``."""

    def __init__(self, fn, bucket: dict, key: str):
        self.fn, self.bucket, self.key = fn, bucket, key

    def __call__(self, *a, **kw):
        t0 = time.thread_time()
        try:
            return self.fn(*a, **kw)
        finally:
            self.bucket[self.key] = self.bucket.get(self.key, 0.0) + time.thread_time() - t0


def _instrument(vocoder, bucket: dict) -> Callable[[], None]:
    """Time the Decoder and Vocos inside ``vocoder`` (attributes of this Vocoder and its net only,
    the modules are shared); returns the undo."""
    from types import SimpleNamespace

    decoder, vocos = vocoder.decoder, vocoder.vocos
    if vocoder.net is not None:
        vocoder.net.mel = _Timed(vocoder.net.mel, bucket, "decoder")
        vocoder.net.spectra = _Timed(vocoder.net.spectra, bucket, "vocos")
        vocoder.net.audio = _Timed(vocoder.net.audio, bucket, "vocos")
    if decoder is not None:  # a Vocoder with a net holds no modules (it runs none)
        vocoder.decoder = _Timed(decoder, bucket, "decoder")
        vocoder.vocos = SimpleNamespace(decode=_Timed(vocos.decode, bucket, "vocos"))

    def undo() -> None:
        vocoder.decoder, vocoder.vocos = decoder, vocos
        if vocoder.net is not None:
            for name in ("mel", "spectra", "audio"):
                vars(vocoder.net).pop(name, None)

    return undo


def _chunks(total: int, first: int, size: int) -> list[tuple[int, int]]:
    out, t = [], 0
    while t < total:
        n = min(first if t == 0 else size, total - t)
        out.append((t, t + n))
        t += n
    return out


def stream_once(vocoder, hidden, first: int, size: int, cfg) -> tuple[list, dict]:
    """Stream one utterance; its PCM pieces and the CPU/wall seconds spent."""
    import numpy as np

    bucket: dict = {}
    t0, w0 = time.thread_time(), time.perf_counter()
    vs = vocoder.stream(cfg)
    pieces = [vs.push(hidden[a:b]) for a, b in _chunks(hidden.shape[0], first, size)]
    pieces.append(vs.finish())
    bucket["total"] = time.thread_time() - t0
    bucket["wall"] = time.perf_counter() - w0
    return [p for p in pieces if len(p)] or [np.zeros(0, np.float32)], bucket


def measure(a: argparse.Namespace, report: dict, write) -> None:
    import numpy as np
    import torch

    from serve_app.engine.audio import AUDIO_FORMATS, SAMPLE_RATE, new_encoder
    from serve_app.engine.config import AcousticConfig, ModelConfig, VocoderConfig, WeightsConfig
    from serve_app.engine.vocoder import VocoderEngine
    from serve_app.engine.weights.loading import load_vocoder

    torch.set_num_threads(1)
    parts = load_vocoder(ModelConfig(weights=WeightsConfig(source=a.weights), device="cpu", torch_threads=1))
    if a.layer_scale is not None:
        with torch.no_grad():
            for blk in parts.decoder.decoder.decoder_block:
                blk.weight.fill_(a.layer_scale)
    ac = AcousticConfig()
    first, size = a.first_chunk_tokens or ac.first_chunk_tokens, a.chunk_tokens or ac.chunk_tokens
    gen = torch.Generator().manual_seed(a.seed)
    utts = [torch.randn(a.tokens, 768, generator=gen) for _ in range(a.utterances)]
    audio_s = a.utterances * (a.tokens * 512 - 256) / SAMPLE_RATE
    variants = {name: VocoderConfig(**fields) for name, fields in VARIANTS.items()}
    vocoders = {name: VocoderEngine(parts, cfg) for name, cfg in variants.items()}
    reference = VocoderEngine(parts, VocoderConfig(cache_state=False, precision="float32"))
    report["setup"] = {
        "first_chunk_tokens": first,
        "chunk_tokens": size,
        "tokens": a.tokens,
        "utterances": a.utterances,
        "audio_s": round(audio_s, 2),
        "threads": torch.get_num_threads(),
        "layer_scale": a.layer_scale,
        "variants": {
            n: {
                **c.model_dump(include={"cache_state", "precision"}),
                "dtype": str(vocoders[n].dtype).removeprefix("torch."),
            }
            for n, c in variants.items()
        },
    }
    net = vocoders["default"].net
    if net is not None:
        reach = net.reach_frames()
        report["setup"]["receptive_field_frames_each_side"] = {**reach, "total": sum(reach.values())}
    for v in vocoders.values():  # warm-up: first calls allocate
        stream_once(v, utts[0][: first + size], first, size, v.cfg)
    one_shot = [reference.decode(h) for h in utts]
    runs: dict[str, list[dict]] = {n: [] for n in variants}
    pcm: dict[str, list] = {}
    for rep in range(a.reps):
        for name, v in vocoders.items():
            bucket: dict = {}
            undo = _instrument(v, bucket)
            pieces_all = []
            for h in utts:
                pieces, b = stream_once(v, h, first, size, v.cfg)
                pieces_all.append(pieces)
                for k, x in b.items():
                    bucket[k] = bucket.get(k, 0.0) + x
            undo()
            runs[name].append(bucket)
            pcm[name] = pieces_all
            _log(f"rep {rep + 1}/{a.reps} {name}: {audio_s / bucket['total']:.1f} audio s/s per core")

    def snr(ref, y) -> float:
        err = float(np.sum((ref.astype(np.float64) - y) ** 2))
        return round(10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / max(err, 1e-30)), 1)

    today = np.concatenate([np.concatenate(p) for p in pcm["today"]])
    ref1 = np.concatenate(one_shot)
    results = {}
    for name in variants:
        med = {k: median([r.get(k, 0.0) for r in runs[name]]) for k in ("total", "decoder", "vocos", "wall")}
        y = np.concatenate([np.concatenate(p) for p in pcm[name]])
        results[name] = {
            "audio_s_per_core": round(audio_s / med["total"], 2),
            "decoder_audio_s_per_core": round(audio_s / med["decoder"], 2) if med["decoder"] else None,
            "vocos_audio_s_per_core": round(audio_s / med["vocos"], 2) if med["vocos"] else None,
            "other_share": round(1 - (med["decoder"] + med["vocos"]) / med["total"], 3),
            "wall_audio_s_per_s": round(audio_s / med["wall"], 2),
            "speedup": None,
            "snr_vs_today_db": snr(today, y) if name != "today" else None,
            "snr_vs_one_shot_db": snr(ref1, y),
        }
    base = results["today"]["audio_s_per_core"]
    for r in results.values():
        r["speedup"] = round(r["audio_s_per_core"] / base, 2)
    report["results"] = results
    write()

    # Encoders, on the default's PCM as the stage streams it (same pieces for every path).
    enc = {}
    for fmt_ in AUDIO_FORMATS:
        times = []
        for _ in range(a.reps):
            t0 = time.thread_time()
            for pieces in pcm["default"]:
                e = new_encoder(fmt_)
                for p in pieces:
                    e.write(p)
                e.close()
            times.append(time.thread_time() - t0)
        enc_rate = audio_s / max(median(times), 1e-9)
        enc[fmt_] = {
            "audio_s_per_core": round(enc_rate, 1),
            "stage_today": round(1 / (1 / base + 1 / enc_rate), 2),
            "stage_default": round(1 / (1 / results["default"]["audio_s_per_core"] + 1 / enc_rate), 2),
        }
    report["encoders"] = enc


# ---------------------------------------------------------------------------------- report


def _variant(key: str) -> Callable[[tuple], Any]:
    return lambda x: x[2][key]


VARIANTS = [
    Col("variant", 0),
    Col("cache_state", _variant("cache_state")),
    Col("matmuls", _variant("dtype")),
    Col("stage", lambda x: x[1]["audio_s_per_core"]),
    Col("speed-up", lambda x: f"{fmt(x[1]['speedup'])}x"),
    Col("Decoder", lambda x: x[1]["decoder_audio_s_per_core"]),
    Col("Vocos", lambda x: x[1]["vocos_audio_s_per_core"]),
    Col("other %", lambda x: 100 * x[1]["other_share"], nd=1),
    Col("wall", lambda x: x[1]["wall_audio_s_per_s"]),
    Col("SNR vs today", lambda x: x[1]["snr_vs_today_db"], nd=1),
    Col("SNR vs one-shot", lambda x: x[1]["snr_vs_one_shot_db"], nd=1),
]
ENCODERS = [
    Col("format", 0),
    Col("encoder", lambda x: x[1]["audio_s_per_core"], nd=1),
    Col("stage today", lambda x: x[1]["stage_today"]),
    Col("stage default", lambda x: x[1]["stage_default"]),
]


def to_doc(report: dict) -> Doc:
    m, s = report["meta"], report.get("setup", {})
    doc = Doc(f"Vocoder stage per CPU core, {m['started']}", m["command"])
    doc.add(
        f"weights {m['weights']}, {s.get('utterances')} x {s.get('tokens')} tokens ({s.get('audio_s')} s of audio), "
        f"chunks {s.get('first_chunk_tokens')} then {s.get('chunk_tokens')}, torch threads {s.get('threads')}, "
        f"layer scale {s.get('layer_scale') or 'as loaded'}; median of {m.get('reps')} interleaved runs; "
        f"load average at start {m.get('loadavg_start')}",
        "",
    )
    rf = s.get("receptive_field_frames_each_side")
    if rf:
        doc.add(
            f"Receptive field each side, mel frames (2 per token): Decoder {rf['decoder']}, Vocos {rf['vocos']}, "
            f"ISTFT {rf['istft']}: {rf['total']} frames = {rf['total'] / 2:g} tokens.",
            "",
        )
    doc.add(
        "Audio seconds per CPU second (one thread); SNR of the streamed PCM, dB. `today` runs ChatTTS's modules; "
        "the others the layer-by-layer net (engine/vocoder_net.py, weights packed once for oneDNN), so `carried "
        "state only` and `bf16 only` include the packing.",
    )
    rows = [(name, r, s["variants"][name]) for name, r in report.get("results", {}).items()]
    doc.table(VARIANTS, rows)
    if report.get("encoders"):
        note = "Encoders (the default's PCM, streamed) and the whole stage with each: audio s per CPU s."
        doc.table(ENCODERS, report["encoders"].items(), before=("", note, ""))
    for w in report.get("warnings", []):
        doc.add("", f"warning: {w}")
    if "error" in report:
        doc.add("", f"**The run failed:** `{report['error']}`")
    return doc


def to_figure(report: dict) -> Optional[Figure]:
    results = report.get("results")
    if not results:
        return None
    names = list(results)
    cols = (("audio_s_per_core", "stage"), ("decoder_audio_s_per_core", "Decoder"), ("vocos_audio_s_per_core", "Vocos"))
    panel = Panel("Vocoder: audio seconds per CPU second (one thread)", ylabel="audio s / CPU s", grid="y")
    panel.xticks = (list(range(len(names))), names)
    panel.add(*grouped_bars([results[n] for n in names], cols, 0.27))
    return Figure([panel], size=(8, 4))


KIND = Kind("vocoder.json", to_doc, to_figure, png="vocoder.png", indent=1)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--weights", default="random", choices=["random", "random-tiny"])
    p.add_argument("--tokens", type=int, default=360, help="tokens per utterance (360: 7.7 s of audio)")
    p.add_argument("--utterances", type=int, default=2)
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions (medians)")
    p.add_argument("--first-chunk-tokens", type=int, help="default: AcousticConfig's")
    p.add_argument("--chunk-tokens", type=int, help="default: AcousticConfig's")
    p.add_argument("--layer-scale", type=float, help="set the Decoder's ConvNeXt layer scales (module docstring)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="default bench/results/vocoder-<date>/: vocoder.json, report.md, vocoder.png")


def main(a: argparse.Namespace) -> int:
    out = Path(a.out) if a.out else Path(__file__).parent / "results" / f"vocoder-{dt.date.today().isoformat()}"
    harness = Harness(out, KIND.write, a.argv, weights=a.weights, reps=a.reps)
    with harness:
        measure(a, harness.report, harness.write)
    print(KIND.markdown(harness.report))
    return 0 if "error" not in harness.report else 1
