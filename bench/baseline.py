"""``python -m bench baseline --port N``: the "before" server of the ChatTTS serving write-ups,
rebuilt as a yardstick (bench/README.md, "run", step 2; ``run`` starts it for its phase "baseline").

FastAPI + uvicorn, one ``Chat.infer`` at a time behind a lock: no batching, no streaming, the whole
WAV in one response. The same weights and the project's own ``Planner``, so its segments, speaker,
seeds and (random weights) lengths are the project's. ``POST /v1/audio/speech``, ``GET /healthz``
(200 once loaded and warm), ``GET /stats``. A request whose client went away is skipped or stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import time
from typing import Optional

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from serve_app.engine.audio import to_int16
from serve_app.engine.threads import TorchThread
from serve_app.engine.wav import wav_header

from .lib.corpus import SAMPLE_RATE
from .lib.reference import chattts_infer

log = logging.getLogger("bench.baseline")


def wav_bytes(pcm: np.ndarray) -> bytes:
    """float32 mono PCM -> a complete 16-bit WAV file (sizes filled in)."""
    data = to_int16(pcm).astype("<i2").tobytes()
    return wav_header(SAMPLE_RATE, len(data)) + data


class BaselineSynth:
    """Text -> one WAV, one ``Chat.infer`` per segment, nothing in parallel."""

    def __init__(
        self,
        weights: str = "random",
        device: str = "cpu",
        segments: Optional[dict] = None,
        threads: Optional[int] = None,
        cache_dir: Optional[str] = None,
    ):
        from serve_app.engine.config import ModelConfig, SegmentConfig, WeightsConfig
        from serve_app.engine.planner import Planner
        from serve_app.engine.voices import SpeakerSampler
        from serve_app.engine.weights.loading import load_model

        wcfg = WeightsConfig(source=weights, cache_dir=cache_dir)
        # ChatTTS as it comes: float32 layers, no int8 (the project's CPU default) and no dual layout.
        self.model = load_model(
            ModelConfig(weights=wcfg, device=device, torch_threads=threads, cpu_dual_layout=False, quantize="none")
        )
        self.chat = self.model.chat
        self.planner = Planner(SegmentConfig.model_validate(segments or {}))
        self.speakers = SpeakerSampler(self.chat.speaker)
        self.planner.warmup()

    def interrupt(self) -> None:
        """Stop the running ``Chat.infer`` (ChatTTS's own interrupt flag) and skip later segments."""
        self._interrupted = True
        self.chat.interrupt()

    def synthesize(
        self, text: str, voice: str = "alloy", seed: Optional[int] = None, speed: float = 1.0
    ) -> tuple[bytes, dict]:
        from serve_app.engine.types import SynthesisOptions

        plan = self.planner.plan(text, SynthesisOptions(voice=voice, seed=seed, speed=speed))
        spk_emb = self.speakers.embedding(plan.voice)
        wavs = []
        tokens = 0
        self._interrupted = False
        for seg in plan.segments:
            if self._interrupted:
                break
            if self.model.is_random and seg.target_tokens:
                n = min(seg.target_tokens, seg.max_new_tokens)
                lo, hi = n, n
            else:  # real weights: stop at end-of-speech, never after the cap
                lo, hi = 0, seg.max_new_tokens
            out = chattts_infer(self.chat, [seg], (lo, hi), spk_emb=spk_emb)
            wavs.append(np.asarray(out[0], dtype=np.float32).reshape(-1))
            tokens += hi
        pcm = np.concatenate(wavs) if wavs else np.zeros(0, np.float32)
        return wav_bytes(pcm), {"segments": len(plan.segments), "tokens": tokens}


def make_app(synth_factory) -> FastAPI:
    state: dict = {"synth": None, "busy": False, "waiting": 0, "served": 0, "skipped": 0, "failed": 0, "busy_s": 0.0}
    lock = asyncio.Lock()
    # Load, warm-up and every infer on one thread, as the project does: asyncio's pool would spread
    # them over threads with an OpenMP team each (serve_app/engine/threads.py), and the yardstick
    # would measure that instead of batching and streaming.
    worker = TorchThread("baseline")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        t0 = time.perf_counter()
        synth = await worker.acall(synth_factory)
        await worker.acall(synth.synthesize, "你好。")  # warm-up before /healthz says ok
        state["synth"] = synth
        log.warning("baseline ready in %.1fs (pid %d)", time.perf_counter() - t0, os.getpid())
        yield

    app = FastAPI(title="chattts baseline (one Chat.infer at a time)", lifespan=lifespan)

    @app.post("/v1/audio/speech")
    async def speech(request: Request):
        body = await request.json()
        text = body.get("input")
        if not isinstance(text, str) or not text.strip():
            return JSONResponse(
                {"error": {"message": "input is required", "type": "invalid_request_error"}}, status_code=400
            )
        state["waiting"] += 1
        try:
            await lock.acquire()
        finally:
            state["waiting"] -= 1
        try:
            if await request.is_disconnected():
                state["skipped"] += 1
                return Response(status_code=499)
            state["busy"] = True
            t0 = time.perf_counter()
            try:
                work = asyncio.ensure_future(
                    worker.acall(
                        state["synth"].synthesize,
                        text,
                        body.get("voice", "alloy"),
                        body.get("seed"),
                        float(body.get("speed", 1.0)),
                    )
                )
                # Not part of the write-ups' server, but harmless for the measurement: when the
                # client has gone (the benchmark cut it), stop decoding for nobody.
                while not work.done():
                    await asyncio.wait([work], timeout=0.25)
                    if not work.done() and await request.is_disconnected():
                        state["synth"].interrupt()
                        state["skipped"] += 1
                        await work
                        return Response(status_code=499)
                audio, info = work.result()
            except Exception as exc:  # noqa: BLE001 - a yardstick: report and go on
                state["failed"] += 1
                log.exception("synthesis failed")
                return JSONResponse({"error": {"message": str(exc), "type": "server_error"}}, status_code=500)
            finally:
                state["busy"] = False
                state["busy_s"] += time.perf_counter() - t0
        finally:
            lock.release()
        state["served"] += 1
        return Response(
            audio,
            media_type="audio/wav",
            headers={"X-Segments": str(info["segments"]), "X-Tokens": str(info["tokens"])},
        )

    @app.get("/healthz")
    async def healthz():
        if state["synth"] is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return {"status": "ok"}

    @app.get("/stats")
    async def stats():
        return {k: v for k, v in state.items() if k != "synth"} | {"pid": os.getpid(), "locked": lock.locked()}

    return app


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--weights", default="random", help="weights source (as the project's model.weights.source)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--segments", default="{}", help="the project's args.segments (SegmentConfig) as JSON: the same segments"
    )
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, all cores)")


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import uvicorn

    app = make_app(lambda: BaselineSynth(args.weights, args.device, json.loads(args.segments), args.threads))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0
