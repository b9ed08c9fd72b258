"""One way to prepare a request, for every door (HTTP speech and dialogue, WebSocket sessions,
jobs, bulk rows, the CLI's ``say``):

    prepare(request, caller) -> Prepared(admitted, script)

admission first (``admission.py``: model, length, priority, voice, lexicon; the busy switch and a
stream slot where the door streams), then the request's script (``script.py``: its instructions,
SSML parsed into parts, a dialogue's turns, every voice resolved for the caller), with the
admitted lexicon's entries in its options. What a door plans is then ``Prepared.plan``: the
script through the door's ``SpeechPipeline``. A door that takes no text up front (a WebSocket
session: its text streams in) gets a script of options alone and plans each cut with them.

Which door refuses what (the same error everywhere it is refused): every door admits and reads
instructions, SSML and stored voices but a WebSocket session (its start names no text, so no
instructions or SSML) and bulk rows (no voice store: a stored voice's name is 400
``voice_not_found`` as for an unknown one; no lexicons).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Optional

from ..callers import Caller
from ..engine.types import Plan, SynthesisOptions, Voice
from ..settings import VoiceStoreConfig
from ..storage.voices import ANONYMOUS, MemoryVoiceStore, VoiceCatalog
from .admission import Admission, Admitted
from .interface import SpeechPipeline
from .script import Script, ThreadVoices, dialogue_script, speech_script


@dataclass
class Prepared:
    """A request past admission, as its script."""

    admitted: Admitted
    script: Script

    @property
    def caller(self) -> Caller:
        return self.admitted.caller

    @property
    def voice(self) -> Voice:
        return self.admitted.voice

    @property
    def options(self) -> SynthesisOptions:
        return self.script.options

    async def plan(self, pipeline: SpeechPipeline, refine: bool = False) -> Plan:
        """The script's plan through ``pipeline`` (``refine``: ChatTTS's refine_text pass first;
        a script of parts is never refined)."""
        return await pipeline.plan(self.script.source, self.options, self.voice, self.caller.id, refine)

    async def plan_text(self, pipeline: SpeechPipeline, text: str) -> Plan:
        """A cut of text that streams in (a session's), planned with the prepared options."""
        return await pipeline.plan(text, self.options, self.voice, self.caller.id)


def _chars(req: Any) -> Optional[int]:
    """What counts against the door's length limit: a script's characters (a job's or a
    dialogue's turns), else its input; None for a request without text (a session's start)."""
    if hasattr(req, "script_chars"):
        return req.script_chars
    text = getattr(req, "input", None)
    return None if text is None else len(text)


class Preparation:
    """``admission``: the door's admission step (its voices, stream slots, busy switch and
    lexicons). ``max_chars``: the length limit (``ingress.max_input_chars``, a job's
    ``jobs.max_input_chars``), which also bounds an SSML document's text."""

    def __init__(self, admission: Admission, max_chars: int):
        self.admission = admission
        self.max_chars = max_chars

    async def prepare(
        self,
        req: Any,
        caller: Caller,
        *,
        stream: bool = False,
        priority: bool = True,
        off_loop: bool = False,
    ) -> Prepared:
        """Admit ``req`` for ``caller``, then read its script. ``stream``: the busy switch and a
        stream slot, held when this returns (released on every failure). ``priority``: check the
        request's priority against the key's (a job's is the service's). ``off_loop``: the script
        is read on a worker thread (a job's input may be a book; each distinct voice is still
        resolved once, on this loop)."""
        # A job's 100,000 turns are summed off the loop too.
        chars = await asyncio.to_thread(_chars, req) if off_loop else _chars(req)
        param = "turns" if getattr(req, "turns", None) is not None and hasattr(req, "script_chars") else "input"
        admitted = await self.admission.admit(
            caller,
            req.model,
            req.voice,
            req.lexicon,
            chars=None if chars is None else (chars, self.max_chars, param),
            priority=req.priority if priority else None,
            stream=stream,
        )
        try:
            script = await self._script(req, admitted, off_loop)
        except BaseException:
            admitted.release()
            raise
        script.options = admitted.with_lexicon(script.options)
        return Prepared(admitted, script)

    async def _script(self, req: Any, admitted: Admitted, off_loop: bool) -> Script:
        if getattr(req, "input", None) is None:  # text streams in later: its options alone
            return Script(req.to_options())
        voices: Any = self.admission.voices
        if off_loop:
            voices = ThreadVoices(voices, asyncio.get_running_loop())
        build = (
            dialogue_script(req, voices, admitted.caller, self.max_chars)
            if getattr(req, "turns", None) is not None
            else speech_script(req, admitted.voice, voices, admitted.caller, self.max_chars)
        )
        if off_loop:
            return await asyncio.to_thread(asyncio.run, build)
        return await build


# Who asks in a process of its own (the CLI's ``say``, bulk synthesis): the operator, with no
# stream slot to count.
OFFLINE_CALLER = Caller(id="offline", owner=ANONYMOUS, max_priority=10, max_streams=0, max_voices=None, admin=True)


def offline_preparation(max_chars: int) -> Preparation:
    """The preparation of a door without the service's stores (``say``, bulk rows): built-in
    voices, ``seed:<n>`` and speaker strings (a stored voice's name is 400 ``voice_not_found``,
    as an unknown one), no lexicons, no stream slots."""
    return Preparation(Admission(VoiceCatalog(MemoryVoiceStore(VoiceStoreConfig()))), max_chars)
