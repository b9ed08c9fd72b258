"""The model's own ceiling on this box: raw in-process decoding, no serving at all.

For each batch size N, N segments from the corpus (those whose target length is closest to the
corpus mean, so the texts are the traffic's) are decoded together, every row for the same number
of tokens L, then vocoded (ChatTTS Decoder + Vocos) to PCM. Two ways, both timed wall-clock:

* ``chat_infer``: ChatTTS's own ``Chat.infer(texts, skip_refine_text=True, split_text=False)``
  with ``max_new_token = min_new_token = L`` (what a batching server built on ChatTTS would do);
* ``engine``: the project's ``AcousticEngine`` fed the N rows at once and run to the end on the
  calling thread, then one-shot vocoding of each row.

Throughput = seconds of audio produced / wall seconds. The ceiling of a batch size is the best of
both ways and of the repetitions ("the most this model can do on this box").

``first_chunk``: the raw time to first audio of one request alone: the engine at batch 1 until
its first chunk (``first_chunk_tokens``) is vocoded by the same sliding-window vocoder the project
streams with, and ``Chat.infer`` of just ``first_chunk_tokens`` tokens; ``raw_s`` is the smaller.

``--quantize``: also int8 against float32 (``model.quantize``, bench/studies/numerics.py): the engine at
each batch size with the GPT's linear layers swapped between float32, float32 dual layout and
int8, interleaved (decode step time, audio s/s), and the numerics table (near-greedy token
agreement, teacher-forced hidden-state cosine). ``--quantize-only`` runs just that.

    python -m bench ceiling --out ceiling.json [--batches 1,4,8,16] [--reps 2]
    python -m bench ceiling --out int8.json --quantize-only --batches 1,8,16 --reps 3

``python -m bench run`` runs it as a subprocess (its phase "ceiling"); the GPU check's ceiling
step (bench/gpu_steps.py) drives the same ``Ceiling`` on cuda.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import time
from pathlib import Path
from typing import Callable, Optional

from .lib.corpus import SAMPLE_RATE, SAMPLES_PER_TOKEN
from .lib.harness import ints, logger
from .lib.stats import mean, median

_log = logger("ceiling")


class Ceiling:
    def __init__(
        self,
        weights: str = "random",
        threads: Optional[int] = None,
        segments: Optional[dict] = None,
        first_chunk_tokens: int = 12,
        chunk_tokens: int = 24,
        vocoder: Optional[dict] = None,
        device: str = "cpu",
        dtype: str = "float32",
        quantize: str = "auto",
    ):
        import torch

        from serve_app.engine.config import ModelConfig, SegmentConfig, VocoderConfig, WeightsConfig
        from serve_app.engine.planner import Planner
        from serve_app.engine.types import SynthesisOptions
        from serve_app.engine.vocoder import VocoderEngine
        from serve_app.engine.voices import SpeakerSampler
        from serve_app.engine.weights.loading import load_model

        from .lib.corpus import load_corpus

        t0 = time.perf_counter()
        self.model = load_model(
            ModelConfig(
                weights=WeightsConfig(source=weights),
                device=device,
                dtype=dtype,
                torch_threads=threads,
                quantize=quantize,
            )
        )
        self.threads = torch.get_num_threads()
        _log(
            f"loaded {self.model.weights.kind} weights in {time.perf_counter() - t0:.1f}s, torch threads {self.threads}"
        )
        self.chat = self.model.chat
        self.first_chunk_tokens = first_chunk_tokens
        self.chunk_tokens = chunk_tokens
        self.vocoder_cfg = VocoderConfig.model_validate(vocoder or {})
        self.vocoder = VocoderEngine(self.model, self.vocoder_cfg)
        planner = Planner(SegmentConfig.model_validate(segments or {}))
        planner.warmup()
        speakers = SpeakerSampler(self.chat.speaker)  # Chat.infer needs the speaker string itself
        segs = []
        for text in load_corpus():
            plan = planner.plan(text, SynthesisOptions())
            segs += [dataclasses.replace(s, spk_emb=speakers.embedding(plan.voice)) for s in plan.segments]
        self.segments = segs
        self.mean_tokens = round(mean(s.target_tokens for s in segs))

    def pick(self, n: int, tokens: int) -> list:
        """The n segments whose target is closest to ``tokens`` (stable order)."""
        ranked = sorted(range(len(self.segments)), key=lambda i: (abs(self.segments[i].target_tokens - tokens), i))
        return [self.segments[i] for i in ranked[:n]]

    # ---------------------------------------------------------------- throughput

    def run_engine(self, n: int, tokens: int) -> dict:
        import dataclasses

        import torch

        from serve_app.engine.acoustic import AcousticConfig, AcousticEngine

        eng = AcousticEngine(
            self.model,
            AcousticConfig(
                max_rows=max(16, n),
                token_budget=1 << 20,
                first_chunk_tokens=self.first_chunk_tokens,
                chunk_tokens=self.chunk_tokens,
            ),
        )
        reqs = [
            dataclasses.replace(s, max_new_tokens=tokens, target_tokens=tokens, seed=1000 + i)
            for i, s in enumerate(self.pick(n, tokens))
        ]
        t0 = time.perf_counter()
        streams = [eng.submit(r) for r in reqs]
        eng.run_until_idle()
        t_decode = time.perf_counter() - t0
        samples = 0
        for s in streams:
            hidden = torch.cat([c.hidden for c in s])
            samples += len(self.vocoder.decode(hidden))
        wall = time.perf_counter() - t0
        return {
            "wall_s": wall,
            "decode_s": t_decode,
            "audio_s": samples / SAMPLE_RATE,
            "steps": eng.stats.steps,
            "mean_rows": eng.stats.mean_rows,
            "prefill_s": eng.stats.prefill_seconds,
        }

    def run_chat_infer(self, n: int, tokens: int) -> dict:
        from ChatTTS import Chat

        segs = self.pick(n, tokens)
        params = Chat.InferCodeParams(
            prompt=segs[0].prompt,
            spk_emb=segs[0].spk_emb,
            temperature=segs[0].temperature,
            top_P=segs[0].top_p,
            top_K=segs[0].top_k,
            max_new_token=tokens,
            min_new_token=tokens,
            manual_seed=1000,
            show_tqdm=False,
        )
        t0 = time.perf_counter()
        wavs = self.chat.infer(
            [s.text for s in segs],
            skip_refine_text=True,
            do_text_normalization=False,
            do_homophone_replacement=False,
            split_text=False,
            params_infer_code=params,
        )
        wall = time.perf_counter() - t0
        return {"wall_s": wall, "audio_s": sum(len(w.reshape(-1)) for w in wavs) / SAMPLE_RATE}

    @staticmethod
    def best_of(fn: Callable[[int, int], dict], n: int, tokens: int, reps: int, label: str) -> tuple[dict, list[dict]]:
        """``reps`` runs of ``fn(n, tokens)``, each with its ``audio_s_per_s``; the fastest, and all."""
        runs = []
        for r in range(reps):
            res = fn(n, tokens)
            res["audio_s_per_s"] = res["audio_s"] / res["wall_s"]
            runs.append(res)
            _log(
                f"{label} batch {n} rep {r + 1}: {res['audio_s']:.1f}s audio in {res['wall_s']:.1f}s = {res['audio_s_per_s']:.3f} audio s/s"
            )
        return max(runs, key=lambda x: x["audio_s_per_s"]), runs

    def throughput(self, method: str, batches: list[int], tokens: int, reps: int) -> dict:
        fn = {"engine": self.run_engine, "chat_infer": self.run_chat_infer}[method]
        fn(2, 8)  # warm-up (first calls allocate)
        out = {}
        for n in batches:
            best, runs = self.best_of(fn, n, tokens, reps, method)
            out[str(n)] = {
                "batch": n,
                "tokens_per_row": tokens,
                "audio_s_per_s": round(best["audio_s_per_s"], 4),
                # The decode alone (no vocoding): the most a replica whose Vocoder runs elsewhere can give.
                **(
                    {"decode_audio_s_per_s": round(best["audio_s"] / best["decode_s"], 4)}
                    if best.get("decode_s")
                    else {}
                ),
                "audio_s_per_s_runs": [round(x["audio_s_per_s"], 4) for x in runs],
                "wall_s_runs": [round(x["wall_s"], 3) for x in runs],
                "audio_s": round(best["audio_s"], 3),
                "tokens_per_s": round(best["audio_s_per_s"] * SAMPLE_RATE / SAMPLES_PER_TOKEN, 2),
            }
        return out

    def quantize(
        self, batches: list[int], tokens: int, reps: int, numerics_segments: int, tf_tokens: int, agree_tokens: int
    ) -> dict:
        """int8 vs float32 on this model (bench/studies/numerics.py); the GPT is left as loaded."""
        from .studies.numerics import GptRecorder, LinearVariants, compare_numerics, compare_throughput

        if self.model.device.type != "cpu":
            raise ValueError("model.quantize int8 is CPU only")
        gpt = self.chat.gpt.gpt
        variants = LinearVariants(gpt)
        recorder = GptRecorder(gpt, variants)
        loaded = [child for _parent, _name, child in variants.slots]
        try:
            out = compare_throughput(self.run_engine, variants, recorder, batches, tokens, reps)
            if numerics_segments > 0:
                segs = self.pick(numerics_segments, tokens)
                out["numerics"] = compare_numerics(self.model, variants, recorder, segs, tf_tokens, agree_tokens)
        finally:
            recorder.close()
            for (parent, name, _child), module in zip(variants.slots, loaded):
                setattr(parent, name, module)
        return out

    # ---------------------------------------------------------------- first chunk

    def first_chunk(self, reps: int) -> dict:
        import dataclasses

        from ChatTTS import Chat

        from serve_app.engine.acoustic import AcousticConfig, AcousticEngine

        f = self.first_chunk_tokens
        seg = self.pick(1, self.mean_tokens)[0]
        eng = AcousticEngine(self.model, AcousticConfig(first_chunk_tokens=f, chunk_tokens=self.chunk_tokens))
        engine_times = []
        # Driven on this thread, like Chat.infer below: a decode thread here would be a second
        # OpenMP team next to this one's and run throttled (serve_app/engine/threads.py).
        for r in range(reps + 1):  # the first is a warm-up
            req = dataclasses.replace(seg, seed=2000 + r)
            vs = self.vocoder.stream(self.vocoder_cfg)
            t0 = time.perf_counter()
            stream = eng.submit(req)
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
            params = Chat.InferCodeParams(
                prompt=seg.prompt,
                spk_emb=seg.spk_emb,
                temperature=seg.temperature,
                top_P=seg.top_p,
                top_K=seg.top_k,
                max_new_token=f,
                min_new_token=f,
                manual_seed=3000 + r,
                show_tqdm=False,
            )
            t0 = time.perf_counter()
            self.chat.infer(
                [seg.text],
                skip_refine_text=True,
                do_text_normalization=False,
                do_homophone_replacement=False,
                split_text=False,
                params_infer_code=params,
            )
            if r:
                infer_times.append(time.perf_counter() - t0)
        e = median(engine_times)
        c = median(infer_times)
        raw = min(x for x in (e, c) if x is not None)
        _log(f"first chunk ({f} tokens): engine {e and round(e, 3)}s, Chat.infer {c:.3f}s")
        return {
            "tokens": f,
            "text": seg.text,
            "engine_s": e and round(e, 4),
            "engine_s_runs": [round(x, 4) for x in engine_times],
            "chat_infer_s": round(c, 4),
            "chat_infer_s_runs": [round(x, 4) for x in infer_times],
            "raw_s": round(raw, 4),
        }


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True)
    ap.add_argument("--weights", default="random")
    ap.add_argument("--batches", type=ints, default=[1, 4, 8, 16])
    ap.add_argument("--methods", default="engine,chat_infer")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=0, help="tokens per row (0: the corpus mean segment length)")
    ap.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: one per CPU of --cpus, else torch's)"
    )
    ap.add_argument("--cpus", default="", help="run on these CPUs only, e.g. 0 (bench/lib/pinning.py)")
    ap.add_argument("--segments", default="{}", help="the project's args.segments (SegmentConfig) as JSON")
    ap.add_argument("--first-chunk-tokens", type=int, default=12)
    ap.add_argument("--chunk-tokens", type=int, default=24)
    ap.add_argument("--first-chunk-reps", type=int, default=5)
    ap.add_argument("--vocoder", default="{}", help="VocoderConfig as JSON")
    ap.add_argument("--quantize", action="store_true", help="also int8 vs float32 (bench/studies/numerics.py)")
    ap.add_argument("--quantize-only", action="store_true", help="only int8 vs float32 (no methods, no first chunk)")
    ap.add_argument("--numerics-segments", type=int, default=3, help="segments of the int8 numerics table")
    ap.add_argument("--tf-tokens", type=int, default=200, help="teacher-forced positions per segment")
    ap.add_argument("--agree-tokens", type=int, default=100, help="near-greedy tokens compared per segment")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING)
    if args.cpus:
        from .lib.pinning import cpu_set, pin_threads

        cpus = cpu_set(args.cpus, leave_rest=False)
        pin_threads(os.getpid(), cpus)  # before torch starts its threads: they inherit it
        args.threads = args.threads or len(cpus)

    t_start = time.perf_counter()
    # The int8 study swaps float layers for int8 ones in place: it loads them float.
    quantize = "none" if args.quantize or args.quantize_only else "auto"
    c = Ceiling(
        args.weights,
        args.threads,
        json.loads(args.segments),
        args.first_chunk_tokens,
        args.chunk_tokens,
        json.loads(args.vocoder),
        quantize=quantize,
    )
    tokens = args.tokens or c.mean_tokens
    batches = args.batches
    result: dict = {
        "torch_threads": c.threads,
        "tokens_per_row": tokens,
        "weights": c.model.weights.kind,
        "methods": {},
    }
    if args.first_chunk_reps > 0 and not args.quantize_only:
        result["first_chunk"] = c.first_chunk(args.first_chunk_reps)
    for m in [] if args.quantize_only else [x for x in args.methods.split(",") if x]:
        result["methods"][m] = c.throughput(m, batches, tokens, args.reps)
    if result["methods"]:
        result["ceiling"] = {
            str(n): max(result["methods"][m][str(n)]["audio_s_per_s"] for m in result["methods"]) for n in batches
        }
    if args.quantize or args.quantize_only:
        result["quantize"] = c.quantize(
            batches, tokens, args.reps, args.numerics_segments, args.tf_tokens, args.agree_tokens
        )
    result["wall_s"] = round(time.perf_counter() - t_start, 1)
    Path(args.out).write_text(json.dumps(result, indent=2, ensure_ascii=False))
    _log(f"done in {result['wall_s']}s: ceiling {result.get('ceiling')}")
    return 0
