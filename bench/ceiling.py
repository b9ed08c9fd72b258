"""``python -m bench ceiling``: the model alone in-process, no serving: audio s/s by batch size and
the first chunk's time (bench/README.md, "run", step 1).

Per batch size N, the N corpus segments nearest the corpus mean length, every row decoded for the
same L tokens and vocoded to PCM, two ways: ``chat_infer`` (ChatTTS's own ``Chat.infer``,
bench/lib/reference.py) and ``engine`` (the project's ``AcousticEngine`` run to the end on this
thread, then one-shot vocoding; with its step time, and on a GPU its peak memory). The ceiling of a
batch size is the best of the ways and repetitions. ``first_chunk``: one request alone until its
first chunk is audio (the engine with the streaming vocoder, and ``Chat.infer`` of just that many
tokens); ``raw_s`` is the smaller. The JSON is written after every measurement, so a run stopped
early (the GPU check's deadline) keeps what it measured. ``run`` and ``gpu`` run it as a subprocess.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Callable, Optional

from .lib.corpus import SAMPLE_RATE, SAMPLES_PER_TOKEN
from .lib.harness import ints, logger
from .lib.reference import chattts_infer
from .lib.report import write_json
from .lib.stats import mean, median

_log = logger("ceiling")


class Ceiling:
    def __init__(
        self,
        weights: str = "random",
        threads: Optional[int] = None,
        args: Optional[dict] = None,
        device: str = "cpu",
        dtype: str = "float32",
    ):
        """``args``: the deployed Serve config's args (segments, acoustic chunk sizes, vocoder), so
        the ceiling cuts and vocodes as the project does."""
        import torch

        from serve_app.engine.config import ModelConfig, WeightsConfig
        from serve_app.engine.planner import Planner
        from serve_app.engine.types import SynthesisOptions
        from serve_app.engine.vocoder import VocoderEngine
        from serve_app.engine.voices import SpeakerSampler
        from serve_app.engine.weights.loading import load_model
        from serve_app.settings import AppConfig

        from .lib.corpus import load_corpus

        app = AppConfig.model_validate(args or {})
        t0 = time.perf_counter()
        cfg = ModelConfig(weights=WeightsConfig(source=weights), device=device, dtype=dtype, torch_threads=threads)
        self.model = load_model(cfg)
        self.load_s = time.perf_counter() - t0
        self.threads = torch.get_num_threads()
        self.cuda = self.model.device.type == "cuda"
        _log(f"loaded {self.model.weights.kind} weights in {self.load_s:.1f}s, torch threads {self.threads}")
        self.chat = self.model.chat
        self.first_chunk_tokens, self.chunk_tokens = app.acoustic.first_chunk_tokens, app.acoustic.chunk_tokens
        self.vocoder_cfg = app.vocoder
        self.vocoder = VocoderEngine(self.model, self.vocoder_cfg)
        planner = Planner(app.segments)
        planner.warmup()
        speakers = SpeakerSampler(self.chat.speaker)  # Chat.infer needs the speaker string itself
        self.segments = []
        for text in load_corpus():
            plan = planner.plan(text, SynthesisOptions())
            self.segments += [dataclasses.replace(s, spk_emb=speakers.embedding(plan.voice)) for s in plan.segments]
        self.mean_tokens = round(mean(s.target_tokens for s in self.segments))

    def pick(self, n: int, tokens: int) -> list:
        """The n segments whose target is closest to ``tokens`` (stable order)."""
        ranked = sorted(range(len(self.segments)), key=lambda i: (abs(self.segments[i].target_tokens - tokens), i))
        return [self.segments[i] for i in ranked[:n]]

    def engine(self, max_rows: int = 16):
        from serve_app.engine.acoustic import AcousticConfig, AcousticEngine

        cfg = AcousticConfig(
            max_rows=max_rows,
            token_budget=1 << 20,
            first_chunk_tokens=self.first_chunk_tokens,
            chunk_tokens=self.chunk_tokens,
        )
        return AcousticEngine(self.model, cfg)

    # ---------------------------------------------------------------- throughput

    def run_engine(self, n: int, tokens: int) -> dict:
        import torch

        eng = self.engine(max(16, n))
        reqs = [
            dataclasses.replace(s, max_new_tokens=tokens, target_tokens=tokens, seed=1000 + i)
            for i, s in enumerate(self.pick(n, tokens))
        ]
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        streams = [eng.submit(r) for r in reqs]
        eng.run_until_idle()
        decode_s = time.perf_counter() - t0
        samples = sum(len(self.vocoder.decode(torch.cat([c.hidden for c in s]))) for s in streams)
        steps = eng.stats.steps
        return {
            "wall_s": time.perf_counter() - t0,
            "decode_s": decode_s,
            "audio_s": samples / SAMPLE_RATE,
            "steps": steps,
            "step_ms": round(1000 * decode_s / steps, 3) if steps else None,
            "mean_rows": round(eng.stats.mean_rows, 2),
            "prefill_s": round(eng.stats.prefill_seconds, 3),
            "peak_gpu_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if self.cuda else None,
        }

    def run_chat_infer(self, n: int, tokens: int) -> dict:
        t0 = time.perf_counter()
        wavs = chattts_infer(self.chat, self.pick(n, tokens), (tokens, tokens), seed=1000)
        return {"wall_s": time.perf_counter() - t0, "audio_s": sum(len(w.reshape(-1)) for w in wavs) / SAMPLE_RATE}

    def batch(self, method: str, n: int, tokens: int, reps: int) -> dict:
        """``reps`` runs of one way at batch ``n``: the fastest run's figures, and every run's speed."""
        fn: Callable[[int, int], dict] = {"engine": self.run_engine, "chat_infer": self.run_chat_infer}[method]
        runs = []
        for r in range(reps):
            res = fn(n, tokens)
            res["audio_s_per_s"] = res["audio_s"] / res["wall_s"]
            runs.append(res)
            _log(f"{method} batch {n} rep {r + 1}: {res['audio_s']:.1f}s audio in {res['wall_s']:.1f}s")
        best = max(runs, key=lambda x: x["audio_s_per_s"])
        return {
            **{k: v for k, v in best.items() if k not in ("audio_s_per_s", "wall_s", "decode_s", "audio_s")},
            "batch": n,
            "tokens_per_row": tokens,
            "audio_s_per_s": round(best["audio_s_per_s"], 4),
            # The decode alone (no vocoding): the most a replica whose Vocoder runs elsewhere can give.
            **({"decode_audio_s_per_s": round(best["audio_s"] / best["decode_s"], 4)} if best.get("decode_s") else {}),
            "audio_s_per_s_runs": [round(x["audio_s_per_s"], 4) for x in runs],
            "wall_s_runs": [round(x["wall_s"], 3) for x in runs],
            "audio_s": round(best["audio_s"], 3),
            "tokens_per_s": round(best["audio_s_per_s"] * SAMPLE_RATE / SAMPLES_PER_TOKEN, 2),
        }

    # ---------------------------------------------------------------- first chunk

    def first_chunk(self, reps: int) -> dict:
        f = self.first_chunk_tokens
        seg = self.pick(1, self.mean_tokens)[0]
        eng = self.engine()
        engine_times = []
        # Driven on this thread, like Chat.infer below: a decode thread here would be a second
        # OpenMP team next to this one's and run throttled (serve_app/engine/threads.py).
        for r in range(reps + 1):  # the first is a warm-up
            vs = self.vocoder.stream(self.vocoder_cfg)
            t0 = time.perf_counter()
            stream = eng.submit(dataclasses.replace(seg, seed=2000 + r))
            dt = None
            while dt is None and not stream.ended:
                eng.step()
                for chunk in stream.poll():
                    pcm = vs.push(chunk.hidden)
                    if chunk.final:
                        pcm = vs.finish()
                    if len(pcm):
                        dt = time.perf_counter() - t0
                        break
            stream.cancel()
            eng.run_until_idle()
            if r and dt is not None:
                engine_times.append(dt)
        infer_times = []
        for r in range(reps + 1):
            t0 = time.perf_counter()
            chattts_infer(self.chat, [seg], (f, f), seed=3000 + r)
            if r:
                infer_times.append(time.perf_counter() - t0)
        e, c = median(engine_times), median(infer_times)
        _log(f"first chunk ({f} tokens): engine {e and round(e, 3)}s, Chat.infer {c:.3f}s")
        return {
            "tokens": f,
            "text": seg.text,
            "engine_s": e and round(e, 4),
            "engine_s_runs": [round(x, 4) for x in engine_times],
            "chat_infer_s": round(c, 4),
            "chat_infer_s_runs": [round(x, 4) for x in infer_times],
            "raw_s": round(min(x for x in (e, c) if x is not None), 4),
        }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="the JSON file")
    ap.add_argument("--weights", default="random")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--batches", type=ints, default=[1, 4, 8, 16])
    ap.add_argument("--methods", default="engine,chat_infer")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=0, help="tokens per row (0: the corpus mean segment length)")
    ap.add_argument("--threads", type=int, help="torch threads (default: one per CPU of --cpus, else torch's)")
    ap.add_argument("--cpus", default="", help="run on these CPUs only, e.g. 0 (bench/lib/pinning.py)")
    ap.add_argument("--args", default="{}", help="the Serve config's args as JSON (segments, acoustic, vocoder)")
    ap.add_argument("--first-chunk-reps", type=int, default=5)


def main(a: argparse.Namespace) -> int:
    import torch

    if a.cpus:
        from .lib.pinning import cpu_set, pin_threads

        cpus = cpu_set(a.cpus, leave_rest=False)
        pin_threads(os.getpid(), cpus)  # before torch starts its threads: they inherit it
        a.threads = a.threads or len(cpus)
    t_start = time.perf_counter()
    c = Ceiling(a.weights, a.threads, json.loads(a.args), a.device, a.dtype)
    tokens = a.tokens or c.mean_tokens
    out = Path(a.out)
    result: dict = {
        "device": str(c.model.device),
        "dtype": a.dtype,
        "weights": c.model.weights.kind,
        "torch_threads": c.threads,
        "tokens_per_row": tokens,
        "load_s": round(c.load_s, 1),
        "gpu_name": torch.cuda.get_device_name() if c.cuda else None,
        "weights_gpu_mib": round(torch.cuda.memory_allocated() / 2**20, 1) if c.cuda else None,
        "methods": {},
    }
    write_json(result, out)
    if a.first_chunk_reps > 0:
        result["first_chunk"] = c.first_chunk(a.first_chunk_reps)
        write_json(result, out)
    for m in [x for x in a.methods.split(",") if x]:
        {"engine": c.run_engine, "chat_infer": c.run_chat_infer}[m](2, 8)  # warm-up (first calls allocate)
        result["methods"][m] = {}
        for n in a.batches:
            result["methods"][m][str(n)] = c.batch(m, n, tokens, a.reps)
            write_json(result, out)
    if result["methods"]:
        by_method = result["methods"].values()
        result["ceiling"] = {str(n): max(m[str(n)]["audio_s_per_s"] for m in by_method) for n in a.batches}
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    write_json(result, out)
    _log(f"done in {result['wall_s']}s: ceiling {result.get('ceiling')}")
    return 0
