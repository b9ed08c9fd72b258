"""A request as the planner's script: OpenAI's ``instructions`` applied to the options, SSML
parsed into parts, a dialogue's turns into parts, every voice resolved for the caller.

Built where the request is prepared (``prepare.py``), not in the TextNormalizer: the voices an
SSML ``<voice name>`` or a turn names may be the caller's own (the voice store is the door's),
and a malformed document is a 400 before anything is queued. The planner then cuts every part
into segments that all decode together (``Planner.plan_script``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

from ..callers import Caller
from ..engine.styles import StyleResult, header_value, resolve_instructions
from ..engine.text.ssml import SsmlBreak, SsmlText, parse_ssml
from ..engine.types import ScriptPart, SynthesisOptions, Voice
from ..protocol import DialogueRequest, JobRequest, SpeechRequest
from ..storage.voices import VoiceCatalog


@dataclass
class Script:
    """What the planner gets, and what the answer says about it (response headers)."""

    options: SynthesisOptions
    text: str = ""  # a plain text's input (planned as one); unused with parts
    parts: Optional[list[ScriptPart]] = None  # None: plain text
    voices: list[Voice] = field(default_factory=list)  # every voice the script speaks in (the cache key)
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def source(self) -> Union[str, Sequence[ScriptPart]]:
        """What the pipeline plans: the parts, else the text."""
        return self.parts if self.parts is not None else self.text


class ThreadVoices:
    """The voice catalog as a script builder running on a worker thread's own loop sees it: each
    distinct (name, owner) resolved once, on the door's loop (where the voice store's clients
    live), and the same ``Voice`` object handed back every time after (so a job keeps each voice
    once, found by identity, never re-serialised per part)."""

    def __init__(self, catalog: VoiceCatalog, loop: asyncio.AbstractEventLoop):
        self.catalog = catalog
        self.loop = loop
        self.known: dict[tuple[str, str, bool], Voice] = {}

    async def resolve(self, voice: Optional[str], owner: str, admin: bool = False) -> Voice:
        key = (voice or "", owner, admin)
        if key not in self.known:
            fut = asyncio.run_coroutine_threadsafe(self.catalog.resolve(voice, owner, admin=admin), self.loop)
            self.known[key] = await asyncio.wrap_future(fut)
        return self.known[key]


def styled(options: SynthesisOptions, *instructions: Optional[str]) -> tuple[SynthesisOptions, StyleResult]:
    """``options`` with the tags and speed ``instructions`` ask for (the request's own prompt tags
    win); several are read in order, the later winning a control both set."""
    style = resolve_instructions(*instructions)
    if not any(instructions):
        return options, style
    return options.model_copy(
        update={"prompt": style.merged_prompt(options.prompt), "speed": style.apply_speed(options.speed)}
    ), style


def style_headers(styles: list[StyleResult]) -> dict[str, str]:
    applied = [a for s in styles for a in s.applied]
    ignored = [i for s in styles for i in s.ignored]
    out = {}
    if applied:
        out["X-Style-Applied"] = header_value(dict.fromkeys(applied))
    if ignored:
        out["X-Style-Ignored"] = header_value(dict.fromkeys(ignored))
    return out


async def _ssml_parts(
    text: str,
    options: SynthesisOptions,
    voice: Voice,
    resolve,
    max_chars: int,
    speaker: Optional[str] = None,
    turn: Optional[int] = None,
    pause_before: float = 0.0,
) -> tuple[list[ScriptPart], list[Voice], tuple[str, ...]]:
    doc = parse_ssml(text, lang=options.lang, max_chars=max_chars)
    parts: list[ScriptPart] = []
    voices: list[Voice] = []
    named: dict[str, Voice] = {}
    pause = pause_before
    for piece in doc.pieces:
        if isinstance(piece, SsmlBreak):
            pause += piece.seconds
            continue
        assert isinstance(piece, SsmlText)
        v = voice
        if piece.voice is not None:
            if piece.voice not in named:
                named[piece.voice] = await resolve(piece.voice)
                voices.append(named[piece.voice])
            v = named[piece.voice]
        parts.append(
            ScriptPart(
                piece.text,
                v,
                speed=options.speed * piece.rate,
                prompt=options.prompt,
                span=piece.span,
                pause_before=pause,
                speaker=piece.voice or speaker,
                turn=turn,
            )
        )
        pause = 0.0
    if pause and parts:  # a break at the end: silence after the last part
        parts.append(ScriptPart("", voice, pause_before=pause, turn=turn))
    return parts, voices, doc.unsupported


async def speech_script(
    req: Union[SpeechRequest, JobRequest], voice: Voice, voices: VoiceCatalog, caller: Caller, max_chars: int
) -> Script:
    """A speech request's (or a job's) script: its options with its instructions; parts when it is SSML."""
    options, style = styled(req.to_options(), req.instructions)
    script = Script(options, text=req.input, headers=style_headers([style]))
    if req.is_ssml:

        async def resolve(name: str) -> Voice:
            return await voices.resolve(name, caller.owner, admin=caller.admin)

        script.parts, script.voices, unsupported = await _ssml_parts(req.input, options, voice, resolve, max_chars)
        if unsupported:
            script.headers["X-SSML-Unsupported"] = header_value(unsupported)
    return script


async def dialogue_script(
    req: Union[DialogueRequest, JobRequest], voices: VoiceCatalog, caller: Caller, max_chars: int
) -> Script:
    """A dialogue's script (a request's or a job's turns): every turn's parts in its own voice
    (and instructions), ``pause_s`` between turns, each segment naming its speaker and turn."""
    base = req.to_options()
    parts: list[ScriptPart] = []
    used: list[Voice] = []
    styles: list[StyleResult] = []
    unsupported: list[str] = []
    known: dict[str, Voice] = {}  # each name resolved once (a job's script may have many turns)
    for i, turn in enumerate(req.turns):
        if turn.voice not in known:
            known[turn.voice] = await voices.resolve(turn.voice, caller.owner, admin=caller.admin)
        voice = known[turn.voice]
        used.append(voice)
        # Two texts, each within its own field's bound; joined they could pass the reader's bound.
        options, style = styled(base, req.instructions, turn.instructions)
        styles.append(style)
        pause = req.pause_s if i else 0.0
        if SpeechRequest(input=turn.input).is_ssml:
            more, named, odd = await _ssml_parts(
                turn.input,
                options,
                voice,
                lambda name: voices.resolve(name, caller.owner, admin=caller.admin),
                max_chars,
                speaker=turn.voice,
                turn=i,
                pause_before=pause,
            )
            parts += more
            used += named
            unsupported += odd
        else:
            parts.append(
                ScriptPart(
                    turn.input,
                    voice,
                    speed=options.speed,
                    prompt=options.prompt,
                    offset=0,
                    pause_before=pause,
                    speaker=turn.voice,
                    turn=i,
                )
            )
    script = Script(base, parts=parts, voices=used, headers=style_headers(styles))
    if unsupported:
        script.headers["X-SSML-Unsupported"] = header_value(dict.fromkeys(unsupported))
    return script
