"""The speech pipeline over the Serve stages' handles: the TextNormalizer plans (and plans a
refined text again), the Acoustic stage refines, the Vocoder streams (it pulls hidden states
from the Acoustic stage itself). What HTTP speech and dialogue, WebSocket sessions and the job
runner speak through."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..engine.types import Plan, ScriptPart, SynthesisOptions, Voice
from .flow import AckedStream, FlowRef
from .interface import SpeechPipeline
from .stream import AudioStream


class HandlesPipeline(SpeechPipeline):
    """``normalizer``, ``vocoder``, ``acoustic``: the stages' handles (``acoustic`` only for
    refine_text: a caller that never refines may pass None)."""

    def __init__(self, normalizer: Any, vocoder: Any, acoustic: Any = None):
        self.normalizer = normalizer
        self.vocoder = vocoder
        self.acoustic = acoustic

    async def plan_text(self, text: str, options: SynthesisOptions, voice: Optional[Voice], client: str) -> Plan:
        return await self.normalizer.plan.remote(text, options, voice, client=client)

    async def plan_parts(self, parts: Sequence[ScriptPart], options: SynthesisOptions, client: str) -> Plan:
        return await self.normalizer.plan_script.remote(parts, options, client=client)

    async def refine_texts(self, texts: list[str], seed: int) -> list[str]:
        return await self.acoustic.refine.remote(texts, seed)

    async def replan(self, texts: list[str], options: SynthesisOptions, voice: Optional[Voice], client: str) -> Plan:
        return await self.normalizer.replan.remote(texts, options, voice, client=client)

    def audio(self, plan: Plan, response_format: str, flow_ref: Optional[FlowRef] = None) -> AudioStream:
        """The Vocoder's stream of ``plan``; with ``flow_ref``, reported as its byte blocks are taken."""
        gen = self.vocoder.options(stream=True).stream.remote(plan, response_format, flow_ref)
        if flow_ref is not None:
            gen = AckedStream(gen, flow_ref, counts=lambda item: isinstance(item, bytes))
        return AudioStream(gen)
