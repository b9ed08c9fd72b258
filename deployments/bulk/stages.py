"""The model stages of a batch, as Ray Data callable classes (each actor loads its model once):

- ``AcousticStage``: the GPT. A call takes one group: the segments of all its rows are queued in
  the actor's ``AcousticEngine`` (longest first), then the engine runs until they are all
  decoded, on the actor's torch thread, with nothing else in it. So the batches a group's rows
  decode in depend on the group alone: the same rows decode to the same hidden states in every
  run (continuous batching within the group; the next group's call is already queued at the
  actor by Ray Data). Emits one row per synthesised row (its hidden states, float16 as the
  service sends them between its stages), and the group's errors.
- ``VocodeStage``: Decoder + Vocos and the audio encoder (CPU), through the same
  ``AudioAssembler`` as the service's Vocoder stage.

A row that fails here becomes an ``error`` row and the others go on.
"""

from __future__ import annotations

import logging
import pickle
import time
from typing import Any

import pyarrow as pa

from deployments.bulk.rows import (
    DECODED,
    ERROR,
    HIDDEN_SIZE,
    TODO,
    VOICED,
    Group,
    error_reason,
    hidden_bytes,
    split_hidden,
)

log = logging.getLogger(__name__)


class AcousticStage:
    def __init__(self, model: dict, acoustic: dict):
        from serve_app.engine.acoustic import AcousticEngine
        from serve_app.engine.config import AcousticConfig, ModelConfig
        from serve_app.engine.threads import TorchThread, on_new_thread
        from serve_app.engine.weights.loading import load_model

        t0 = time.perf_counter()
        # Loaded on a thread that exits; every decode step runs on one long-lived thread, which
        # keeps the process's only OpenMP team (engine/threads.py).
        self.model = on_new_thread(load_model, ModelConfig.model_validate(model))
        self.model.drop_audio_modules()  # the vocoder actors vocode
        self.engine = AcousticEngine(self.model, AcousticConfig.model_validate(acoustic))
        self.torch = TorchThread("acoustic", threads=self.model.torch_threads)
        self.weights = f"{self.model.weights.kind}:{self.model.weights.weights_id}"
        log.info("acoustic actor ready in %.1f s on %s", time.perf_counter() - t0, self.model.device)

    def __call__(self, batch: pa.Table) -> pa.Table:
        out: list[dict] = []
        for blob in batch.column("group").to_pylist():
            out += self.torch.call(self._decode, pickle.loads(blob))
        return pa.Table.from_pylist(out, schema=DECODED)

    def _decode(self, group: Group) -> list[dict]:
        import torch

        from serve_app.engine.errors import EngineError

        rows = group.planned
        jobs = [(i, j, seg) for i, r in enumerate(rows) if r["status"] == TODO for j, seg in enumerate(r["segments"])]
        # Longest first (then input order: the same order every run): the rows still decoding when
        # the queue runs dry are short ones, so the batch thins out only briefly at the end.
        jobs.sort(
            key=lambda job: (-min(job[2].target_tokens or job[2].max_new_tokens, job[2].max_new_tokens), job[0], job[1])
        )
        failed: dict[int, str] = {}
        streams: list[tuple[int, int, Any]] = []
        try:
            for i, j, seg in jobs:
                streams.append((i, j, self.engine.submit(seg)))
        except EngineError as exc:  # a queue limit (BatchConfig sizes the queue for a group): its rows fail
            for _, _, stream in streams:
                stream.cancel()
            self.engine.run_until_idle()  # cancelled rows leave at admission
            return [_error_row(r, r.get("reason") or error_reason(exc)) for r in rows if not r["done"]]
        self.engine.run_until_idle()
        hidden: dict[int, dict[int, Any]] = {}
        for i, j, stream in streams:
            try:
                chunks = list(stream)  # all there: the engine is idle
            except EngineError as exc:
                failed.setdefault(i, f"synthesis_failed: {exc}")
                continue
            h = torch.cat([c.hidden for c in chunks]) if chunks else torch.zeros(0, HIDDEN_SIZE)
            hidden.setdefault(i, {})[j] = h.numpy().astype("float16")
        out = []
        for i, r in enumerate(rows):
            if r["done"]:
                continue  # decoded so that its group's other rows decode as in the run that wrote it
            if r["status"] != TODO or i in failed:
                out.append(_error_row(r, r.get("reason") or failed[i]))
                continue
            parts = hidden[i]
            data, lengths = hidden_bytes([parts[j] for j in sorted(parts)])
            out.append({**_passed(r), "weights": self.weights, "hidden": data, "lengths": lengths})
        return out


def _passed(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in ("segments", "done")}


def _error_row(r: dict, reason: str) -> dict:
    """An error row; ``permanent`` only where planning refused the row (an engine failure may pass)."""
    return {
        "id": r["id"],
        "text": r.get("text"),
        "status": ERROR,
        "reason": reason,
        "permanent": bool(r.get("permanent")),
    }


class VocodeStage:
    def __init__(self, model: dict, vocoder: dict):
        import torch

        from serve_app.engine.config import ModelConfig, VocoderConfig
        from serve_app.engine.threads import TorchThread
        from serve_app.engine.vocoder import Vocoder
        from serve_app.engine.weights.loading import load_vocoder

        self.cfg = VocoderConfig.model_validate(vocoder)
        # All torch work of this actor on one thread with one torch thread (engine/threads.py).
        self.torch = TorchThread("vocoder", threads=1)
        parts = self.torch.call(load_vocoder, ModelConfig.model_validate(model))
        self.vocoder = Vocoder(parts, self.cfg)
        self.torch.call(self.vocoder.decode, torch.zeros(8, HIDDEN_SIZE))  # first conv/ISTFT calls allocate

    def __call__(self, batch: pa.Table) -> pa.Table:
        out = []
        for r in batch.to_pylist():
            hidden, lengths = r.pop("hidden", None), r.pop("lengths", None)
            if r["status"] == TODO:
                try:
                    data, seconds = self.torch.call(self._audio, hidden, lengths, r)
                    r.update(audio=data, seconds=seconds)
                except Exception as exc:  # noqa: BLE001 - this row fails, the batch goes on
                    log.exception("vocoding %s failed", r["id"])
                    r.update(
                        status=ERROR,
                        reason=f"synthesis_failed: vocoder: {exc.__class__.__name__}: {exc}",
                        permanent=False,
                    )
            out.append(r)
        return pa.Table.from_pylist(out, schema=VOICED)

    def _audio(self, hidden: bytes, lengths: list[int], r: dict) -> tuple[bytes, float]:
        import numpy as np
        import torch

        from serve_app.engine.audio import SAMPLE_RATE
        from serve_app.engine.pipeline import AudioAssembler
        from serve_app.engine.wav import with_true_length

        assembler = AudioAssembler(
            self.vocoder,
            r["format"],
            self.cfg,
            pauses=r["pauses"],
            gain_db=r["gain_db"] or 0.0,
            lead_in=r["lead_in"] or 0.0,
            loudness=r["loudness"],
        )
        data = b""
        for j, part in enumerate(split_hidden(hidden, lengths)):
            # Each segment whole, in one window: nothing streams, and the assembler ends it at once.
            data += assembler.feed(j, torch.from_numpy(np.asarray(part, dtype=np.float32)), True)
        data += assembler.close()
        return with_true_length(data), assembler.samples / SAMPLE_RATE
