"""One admission step for every front door (HTTP speech and dialogue, WebSocket sessions, jobs):
the checks a request passes before any synthesis work, in one order, each door asking for the
steps it takes.

    model -> length -> priority -> voice -> lexicon -> busy switch -> stream slot

What comes out (``Admitted``): the caller's voice resolved (built in, or its own stored one: an
unknown or another key's is 400 ``voice_not_found`` here, before any work), its lexicon's
pronunciations (the request's, else the key's default; None with lexicons off) and, when asked
for, a stream slot: held, or being taken while the door plans (its round trip overlaps the plan's),
and given back by ``release()`` on every failure until the stream that owns it takes it over.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..callers import Caller, Slot, StreamSlots, check_priority, hold_slot
from ..engine.text.lexicon import Pronunciations
from ..engine.types import SynthesisOptions, Voice
from ..errors import APIError
from ..protocol import MODEL_IDS
from ..storage.lexicons import LexiconBook
from ..storage.voices import VoiceCatalog


def check_model(model: str) -> None:
    if model not in MODEL_IDS:
        raise APIError(
            404,
            f"model {model!r} does not exist; use one of {', '.join(MODEL_IDS)}",
            param="model",
            code="model_not_found",
        )


def check_length(chars: int, limit: int, param: str = "input") -> None:
    if chars > limit:
        raise APIError(413, f"input is {chars} characters; the limit is {limit}", param=param, code="input_too_long")


def release_when_taken(taking: "asyncio.Future[Slot]") -> None:
    """A stream slot being taken for a request that failed: given back once it is held (a refusal
    or a failed take holds nothing; its exception is retrieved here)."""

    def done(t: asyncio.Future) -> None:
        if not t.cancelled() and t.exception() is None:
            t.result().release()

    if taking.done():
        done(taking)
    else:
        taking.add_done_callback(done)


@dataclass
class Admitted:
    """A request past admission. ``pronunciations`` is what its options get (``with_lexicon``)
    when lexicons are on; ``slot``/``taking``: its stream slot, held or being taken."""

    caller: Caller
    voice: Voice
    pronunciations: Optional[Pronunciations] = None
    lexicons: bool = False  # the lexicon step ran (lexicons are on)
    slot: Optional[Slot] = None
    taking: Optional["asyncio.Future[Slot]"] = field(default=None, repr=False)

    def with_lexicon(self, options: SynthesisOptions) -> SynthesisOptions:
        """``options`` with the admitted lexicon's entries (unchanged with lexicons off)."""
        if not self.lexicons or self.pronunciations == options.pronunciations:
            return options
        return options.model_copy(update={"pronunciations": self.pronunciations})

    async def held(self) -> Slot:
        """The stream slot once taken (a refusal raises here); its owner releases it, whatever
        happens to this wait."""
        if self.slot is None and self.taking is not None:
            self.slot = await asyncio.shield(self.taking)
        assert self.slot is not None, "no stream slot was asked for"
        return self.slot

    def hand_over(self) -> Slot:
        """The held slot, now the stream's to release (``release()`` no longer touches it)."""
        slot = self.slot
        assert slot is not None, "no stream slot is held"
        self.slot = self.taking = None
        return slot

    def release(self) -> None:
        """Give the slot back: held now, or once it is taken. Idempotent."""
        slot, taking, self.slot, self.taking = self.slot, self.taking, None, None
        if slot is not None:
            slot.release()
        elif taking is not None:
            release_when_taken(taking)


class Admission:
    """``voices``: the voice store's catalog; ``slots``: the application's stream slots;
    ``busy``: raises 429 while the acoustic queue is past the busy switch; ``lexicons``: the lexicon
    store (None: lexicons off; set once the Ingress has it)."""

    def __init__(
        self,
        voices: VoiceCatalog,
        slots: Optional[StreamSlots] = None,
        busy: Callable[[], None] = lambda: None,
        lexicons: Optional[LexiconBook] = None,
    ):
        self.voices = voices
        self.slots = slots
        self.busy = busy
        self.lexicons = lexicons

    async def admit(
        self,
        caller: Caller,
        model: str,
        voice: str,
        lexicon: Optional[str] = None,
        *,
        chars: Optional[tuple[int, int, str]] = None,
        priority: Optional[int] = None,
        stream: bool = False,
    ) -> Admitted:
        """The steps in order. ``chars``: (characters, limit, param) for the length check;
        ``priority``: checked against the key's (None: the door sets its own); ``stream``: the busy
        switch, then a stream slot, held when this returns."""
        check_model(model)
        if chars is not None:
            check_length(*chars)
        if priority is not None:
            check_priority(caller, priority)
        admitted = Admitted(caller, await self.voices.resolve(voice, caller.owner, admin=caller.admin))
        if self.lexicons is not None:  # another key's lexicon answers as a missing one
            admitted.pronunciations = await self.lexicons.pronunciations(lexicon, caller.owner, caller.admin)
            admitted.lexicons = True
        if stream:
            self.take_stream(admitted)
            try:
                await admitted.held()
            except BaseException:
                admitted.release()
                raise
        return admitted

    def take_stream(self, admitted: Admitted) -> "asyncio.Future[Slot]":
        """The busy switch, then start taking the caller's stream slot (``admitted.held()`` waits
        for it; ``admitted.release()`` gives it back, taken or not)."""
        self.busy()
        assert self.slots is not None, "this door has no stream slots"
        admitted.taking = asyncio.ensure_future(hold_slot(self.slots, admitted.caller))
        return admitted.taking
