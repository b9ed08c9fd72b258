"""The speech pipeline in one process, over the engine's pieces as the stages use them: the
planner (the TextNormalizer's), a running ``AcousticEngine`` (the Acoustic stage's decode loop)
and the vocoder on a single torch thread, each stream through the engine's ``AudioLoop`` (the
Vocoder stage's loop). For what needs the graph's work without Ray (the CLI's ``say``, bulk
synthesis's actors, tests); it imports torch, so nothing on the Ingress side imports this module.

``LocalPipeline.from_config`` builds and starts all of it (and ``close()`` stops it)."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence

from ..engine.assembly import AudioLoop
from ..engine.config import EngineConfig, VocoderConfig, acoustic_heard_through
from ..engine.decode.streams import aordered_chunks
from ..engine.planner import Planner
from ..engine.threads import TorchThread, on_new_thread
from ..engine.types import Plan, ScriptPart, SynthesisOptions, Voice
from ..engine.vocoder import VocoderEngine
from .interface import AudioItem, SpeechPipeline
from .stream import AudioStream

Refine = Callable[[list[str], int], Awaitable[list[str]]]


class LocalPipeline(SpeechPipeline):
    """``engine``: an ``AcousticEngine``, started (its owner stops it). ``thread``: the torch
    thread the vocoder and the encoders run on. ``vocoder_cfg``: the vocoder streams' settings
    (None: the vocoder's own). ``refine``: ChatTTS's refine_text pass (``engine/refine.py``'s
    ``refine_async``, bound), None where no refiner is loaded. ``model``: the loaded model the
    pieces share, for callers to inspect (None where the caller did not say).

    Built from pieces, it owns none of them (``close()`` does nothing); built by ``from_config``,
    it owns its engine and its thread."""

    def __init__(
        self,
        planner: Planner,
        engine: Any,
        vocoder: VocoderEngine,
        thread: TorchThread,
        vocoder_cfg: Optional[VocoderConfig] = None,
        refine: Optional[Refine] = None,
        model: Any = None,
    ):
        self.planner = planner
        self.engine = engine
        self.vocoder = vocoder
        self.thread = thread
        self.vocoder_cfg = vocoder_cfg
        self.refine = refine
        self.model = model
        self._owned = False  # from_config: close() stops the engine and the thread

    @classmethod
    def from_config(cls, config: EngineConfig = EngineConfig(), model: Any = None) -> "LocalPipeline":
        """Everything in this process from ``config``: the model (``model``, or loaded), the
        planner, an ``AcousticEngine`` (started), the vocoder and its torch thread. The decode
        thread keeps the process's only multi-threaded OpenMP team (``engine/threads.py``): the
        model loads on a thread that exits, and the vocoder is built and runs on one
        single-threaded torch thread. ``close()`` stops the engine and the thread."""
        from ..engine.acoustic import AcousticEngine
        from ..engine.weights.loading import load_model

        if model is None:
            model = on_new_thread(load_model, config.model)
        planner = Planner(config.segments)
        engine = AcousticEngine(model, acoustic_heard_through(config.acoustic, config.vocoder))
        thread = TorchThread("vocoder", threads=1)
        # Built on the thread it runs on: its packing computes, and on the caller's thread (which
        # lives on) that would start a second OpenMP team beside the decode thread's.
        vocoder = thread.call(VocoderEngine, model, config.vocoder)
        engine.start()
        pipeline = cls(planner, engine, vocoder, thread, vocoder_cfg=config.vocoder, model=model)
        pipeline._owned = True
        return pipeline

    def close(self) -> None:
        """Stop the engine and the thread where this pipeline made them (``from_config``); a
        pipeline over a caller's pieces leaves them to that caller."""
        if self._owned:
            self._owned = False
            self.engine.stop()
            self.thread.shutdown()

    async def plan_text(self, text: str, options: SynthesisOptions, voice: Optional[Voice], client: str) -> Plan:
        return self.planner.plan(text, options, voice, client=client)

    async def plan_parts(self, parts: Sequence[ScriptPart], options: SynthesisOptions, client: str) -> Plan:
        return self.planner.plan_script(list(parts), options, client=client)

    async def refine_texts(self, texts: list[str], seed: int) -> list[str]:
        if self.refine is None:
            raise ValueError("refine_text needs a refiner: this pipeline has none")
        return await self.refine(texts, seed)

    async def replan(self, texts: list[str], options: SynthesisOptions, voice: Optional[Voice], client: str) -> Plan:
        return self.planner.plan_texts(texts, options, voice, client=client)

    def audio(self, plan: Plan, response_format: str, flow_ref: Any = None) -> AudioStream:
        """``flow_ref``: ignored (nothing crosses a process here)."""
        return AudioStream(_LocalSource(self, plan, response_format))


class _LocalSource:
    """One plan's rows in the engine (submitted at the first read) through the engine's
    ``AudioLoop``; ``cancel()`` drops the rows at the engine's next step."""

    def __init__(self, local: LocalPipeline, plan: Plan, response_format: str):
        self._local = local
        self._plan = plan
        self._format = response_format
        self._rows: list = []
        self._items = self._run()

    def __aiter__(self) -> AsyncIterator[AudioItem]:
        return self._items

    def cancel(self) -> None:
        for row in self._rows:
            row.cancel()

    async def _hidden(self) -> AsyncIterator[tuple]:
        self._rows = self._local.engine.submit_all(self._plan.segments, loop=asyncio.get_running_loop())
        async for seg, chunk in aordered_chunks(self._rows):  # closed early: the rows are cancelled
            yield seg, chunk.hidden, chunk.final

    def _run(self) -> AsyncIterator[AudioItem]:
        local = self._local
        loop = AudioLoop(local.vocoder, self._plan, self._format, local.vocoder_cfg, local.thread.acall)
        return loop.items(self._hidden())
