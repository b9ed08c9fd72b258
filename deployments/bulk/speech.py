"""The speech actors of a batch, as a Ray Data callable class: each actor loads the model once and
speaks its rows through the speech pipeline every front door uses (``serve_app.pipeline``), in
one process (``LocalPipeline``): each row prepared as the API prepares a request (instructions,
SSML, voices), planned, decoded in one continuously batched ``AcousticEngine``, vocoded and
encoded through the same ``AudioLoop`` as the service's Vocoder stage.

A call takes a block of rows and speaks them all at once: their segments decode together, the
longest submitted first (the rows still decoding when a call's queue runs dry are short ones).
An actor runs ``CALLS_PER_ACTOR`` calls at a time (Ray Data's threads, one event loop of the
actor's), so the next call's rows fill the batch while the last ones of a call finish.

Why a row's audio does not depend on its neighbours: on CPU, in both precisions, decoding is
batch-invariant (a row's hidden states are bit-identical alone and in any batch: README, "Batch
invariance"), so the same row is the same file in every run, resumed or not, whatever else its
call held. On a GPU (bfloat16) the kernels change with the batch's shape and nothing promises
that yet, as for the service.

A row that fails becomes an ``error`` row (``permanent`` where planning refused it: its own text
or options) and the others go on.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pyarrow as pa

from deployments.bulk.config import MAX_TEXT_CHARS, BatchRow
from deployments.bulk.rows import ERROR, TODO, VOICED, audio_stem, error_reason

log = logging.getLogger(__name__)


class SpeechStage:
    def __init__(self, engine: dict):
        from serve_app.engine.config import EngineConfig
        from serve_app.pipeline.local import LocalPipeline
        from serve_app.pipeline.prepare import offline_preparation

        t0 = time.perf_counter()
        self.pipeline = LocalPipeline.from_config(EngineConfig.model_validate(engine))
        self.preparation = offline_preparation(MAX_TEXT_CHARS)
        self.pipeline.planner.warmup()  # the text front end's tables, before the first row
        weights = self.pipeline.model.weights
        self.weights = f"{weights.kind}:{weights.weights_id}"
        # The rows of every call are awaited on this one loop: the engine's streams post to it.
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="bulk-loop", daemon=True).start()
        log.info("speech actor ready in %.1f s on %s", time.perf_counter() - t0, self.pipeline.model.device)

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = [BatchRow.model_validate_json(r) for r in batch.column("row").to_pylist()]
        out = asyncio.run_coroutine_threadsafe(self._speak_all(rows), self.loop).result()
        return pa.Table.from_pylist(out, schema=VOICED)

    async def _speak_all(self, rows: list[BatchRow]) -> list[dict]:
        planned = [await self._plan(row) for row in rows]
        # Longest first (then input order), each stream's rows submitted as its task starts.
        order = sorted(
            (i for i, p in enumerate(planned) if not isinstance(p, dict)), key=lambda i: (-_tokens(planned[i]), i)
        )
        spoken = await asyncio.gather(*(self._speak(rows[i], planned[i]) for i in order))
        out: list[Any] = list(planned)
        for i, row in zip(order, spoken):
            out[i] = row
        return out

    async def _plan(self, row: BatchRow) -> Any:
        """The row's plan, or its error row (refused for what it holds: permanent)."""
        from serve_app.pipeline.prepare import OFFLINE_CALLER

        try:
            prepared = await self.preparation.prepare(row.request(), OFFLINE_CALLER)
            return await prepared.plan(self.pipeline)
        except Exception as exc:  # noqa: BLE001 - any failure is this row's, reported with it
            return _error(row, error_reason(exc), permanent=True)

    async def _speak(self, row: BatchRow, plan: Any) -> dict:
        from serve_app.engine.voices import effective_seed

        try:
            audio, summary = await self.pipeline.speak(plan, row.response_format)
        except Exception as exc:  # noqa: BLE001 - this row fails (it may pass in another run), the others go on
            log.exception("speaking %s failed", row.id)
            return _error(row, error_reason(exc), permanent=False)
        return {
            "id": row.id,
            "status": TODO,
            "reason": None,
            "permanent": False,
            "name": f"{audio_stem(row.id)}.{row.response_format}",
            "format": row.response_format,
            "text": row.text,
            "normalized_text": " ".join(plan.texts),
            "voice": plan.voice.name,
            "seed": effective_seed(plan.voice, row.seed),
            "speed": row.speed,
            "segments_count": len(plan.segments),
            "weights": self.weights,
            "audio": audio,
            "seconds": summary.audio_seconds if summary is not None else 0.0,
        }


def _tokens(plan: Any) -> int:
    return sum(min(s.target_tokens or s.max_new_tokens, s.max_new_tokens) for s in plan.segments)


def _error(row: BatchRow, reason: str, permanent: bool) -> dict:
    return {"id": row.id, "text": row.text, "status": ERROR, "reason": reason, "permanent": permanent}
