"""Vocoder/Encoder stage (CPU): drives one stream end to end.

It pulls the request's hidden-state chunks from the Acoustic stage, decodes them with the
sliding-window vocoder (ChatTTS Decoder + Vocos) and encodes them with one encoder per stream,
yielding bytes as they are made. Per-stream state (vocoder window, encoder) lives here, so the
GPU replica only ever does GPT work.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import AsyncIterator, Union

import numpy as np
import torch
from ray import serve
from ray.serve.handle import DeploymentHandle

from serve_app import metrics
from serve_app.engine.acoustic import HiddenChunk
from serve_app.engine.audio import SAMPLE_RATE
from serve_app.engine.config import ModelConfig, VocoderConfig
from serve_app.engine.pipeline import AudioAssembler, Plan
from serve_app.engine.threads import TorchThread
from serve_app.engine.vocoder import Vocoder as VocoderEngine
from serve_app.engine.weights import load_model

log = logging.getLogger("ray.serve")

# After the first bytes (sent at once: time to first audio), bytes are merged up to this size
# before they leave: fewer, larger RPC messages.
MIN_YIELD_BYTES = 2048


@dataclass
class StreamSummary:
    """The last item of a ``Vocoder.stream``: what the ingress logs and reports."""

    audio_seconds: float
    segments: int
    batch_rows: int  # rows in the acoustic batch when this request's first chunk was decoded
    vocode_seconds: float
    encode_seconds: float


# Vocoding a chunk is a few ms of CPU; a replica serves many streams (target 8 ongoing each).
@serve.deployment(
    ray_actor_options={"num_cpus": 0.5},
    max_ongoing_requests=32,
    autoscaling_config={"min_replicas": 1, "max_replicas": 4, "target_ongoing_requests": 8},
)
class Vocoder:
    def __init__(self, acoustic: DeploymentHandle, model: dict | None = None, vocoder: dict | None = None):
        t0 = time.perf_counter()
        self.acoustic = acoustic
        self.cfg = VocoderConfig.model_validate(vocoder or {})
        # All torch work of this replica on one thread, one OpenMP team (engine/threads.py).
        self._torch_thread = TorchThread("vocoder")
        loaded = self._torch_thread.call(load_model, ModelConfig.model_validate(model or {}))
        # Only the decoder and Vocos are used here: drop the GPT to save memory.
        for name in ("gpt", "dvae"):
            if hasattr(loaded.chat, name):
                delattr(loaded.chat, name)
        self.weights = loaded.weights
        self.vocoder = VocoderEngine(loaded, self.cfg)
        self._torch_thread.call(self.vocoder.decode, torch.zeros(8, 768))  # warm-up: first conv/ISTFT calls allocate
        log.info("Vocoder ready in %.1fs", time.perf_counter() - t0)

    async def stream(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        """Encoded audio bytes as they are made, then one ``StreamSummary``."""
        t0 = time.perf_counter()
        assembler = AudioAssembler(self.vocoder, response_format, self.cfg)
        chunks = self.acoustic.options(stream=True).stream.remote(plan.segments)
        pending = b""
        done = False
        sent_first = False
        batch_rows = 0
        try:
            async for wire in chunks:
                batch_rows = batch_rows or wire.batch_rows
                chunk = HiddenChunk(
                    hidden=torch.from_numpy(np.asarray(wire.hidden, dtype=np.float32)),
                    index=0,
                    start_token=0,
                    final=wire.final,
                    finish_reason=wire.finish_reason,
                )
                # Decoding is CPU-bound: keep it off the replica's event loop.
                pending += await self._torch_thread.acall(assembler.feed, wire.segment, chunk)
                if pending and (not sent_first or len(pending) >= MIN_YIELD_BYTES):
                    yield pending
                    pending = b""
                    sent_first = True
            done = True
            pending += await self._torch_thread.acall(assembler.close)
            if pending:
                yield pending
            seconds = assembler.samples / SAMPLE_RATE
            elapsed = time.perf_counter() - t0
            metrics.inc("tts_audio_seconds_total", seconds)
            if seconds > 0:
                metrics.observe("tts_rtf", elapsed / seconds)
            metrics.observe("tts_stage_seconds", assembler.vocode_seconds, stage="vocode")
            metrics.observe("tts_stage_seconds", assembler.encode_seconds, stage="encode")
            yield StreamSummary(seconds, len(plan.segments), batch_rows, assembler.vocode_seconds, assembler.encode_seconds)
        finally:
            if not done:  # the caller went away or a stage failed: stop the decode too
                chunks.cancel()

    async def synthesize(self, plan: Plan, response_format: str) -> bytes:
        return b"".join([b async for b in self.stream(plan, response_format) if isinstance(b, bytes)])
