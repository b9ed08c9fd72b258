"""What a speech pipeline is, for every caller that turns text into audio.

    script -> plan (-> refine) -> stream of bytes, segment marks and a summary, cancelled on exit

``plan`` is the one way in: plain text is a script of one part, and the choice between planning
a text (which may be refined: ChatTTS rewrites it, then it is planned again) and planning a
script of several parts (SSML pieces, dialogue turns, never refined: their text is not the
input's) is made here, once, for every implementation; each implementation gives the stages'
steps (``plan_text``, ``plan_parts``, ``refine_texts``, ``replan``) and ``audio``. ``audio``
opens the plan's stream (an ``AudioStream``): its items are encoded ``bytes``, a ``SegmentMark``
once a segment's audio is complete, and a ``StreamSummary`` at the end; leaving it early, on an
error or a cancel stops every stage's work. ``speak`` reads it whole: one file and its summary.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Optional, Sequence, Union

from ..engine.types import Plan, ScriptPart, SegmentMark, StreamSummary, SynthesisOptions, Voice
from ..engine.wav import with_true_length
from .stream import AudioStream

# What a pipeline plans: a text, or a script's parts with their voices resolved.
Source = Union[str, Sequence[ScriptPart]]
AudioItem = Union[bytes, SegmentMark, StreamSummary]


class SpeechPipeline(ABC):
    async def plan(
        self,
        script: Source,
        options: SynthesisOptions,
        voice: Optional[Voice] = None,
        client: str = "",
        refine: bool = False,
    ) -> Plan:
        """The plan of ``script``. ``voice``: resolved by the caller (a text's; a script's parts
        carry their own). ``client``: who asked (the engine's fair admission). ``refine``: a text
        goes through ChatTTS's refine_text pass first (ignored for a script of parts)."""
        if not isinstance(script, str):
            return await self.plan_parts(script, options, client)
        plan = await self.plan_text(script, options, voice, client)
        if refine:
            seed = plan.segments[0].seed if plan.segments else 0
            plan = await self.replan(await self.refine_texts(plan.texts, seed), options, voice, client)
        return plan

    async def speak(self, plan: Plan, response_format: str) -> tuple[bytes, Optional[StreamSummary]]:
        """The plan's audio as one file (a WAV's header then says its true sizes, which a stream
        cannot) and the stream's summary (None if the stream gave none)."""
        parts: list[bytes] = []
        summary = None
        async with self.audio(plan, response_format) as items:
            async for item in items:
                if isinstance(item, bytes):
                    parts.append(item)
                elif isinstance(item, StreamSummary):
                    summary = item
        return with_true_length(b"".join(parts)), summary

    @abstractmethod
    def audio(self, plan: Plan, response_format: str, flow_ref: Optional[Any] = None) -> AudioStream:
        """The plan's audio as a stream of ``AudioItem``. ``flow_ref``: the edge the reader reports
        its progress on (back-pressure, ``pipeline/flow.py``), None for none."""

    # The stages' steps.

    @abstractmethod
    async def plan_text(self, text: str, options: SynthesisOptions, voice: Optional[Voice], client: str) -> Plan: ...

    @abstractmethod
    async def plan_parts(self, parts: Sequence[ScriptPart], options: SynthesisOptions, client: str) -> Plan: ...

    @abstractmethod
    async def refine_texts(self, texts: list[str], seed: int) -> list[str]: ...

    @abstractmethod
    async def replan(self, texts: list[str], options: SynthesisOptions, voice: Optional[Voice], client: str) -> Plan:
        """A plan of refined texts (ChatTTS's own output: not normalised or cut again)."""
