"""A job's script built off the event loop: the collector held off while it is made, and the
parts as a job stores them (each distinct voice once). (The builder on a worker thread resolves
voices through ``pipeline/script.py``'s ``ThreadVoices``.)
"""

from __future__ import annotations

import gc
from typing import Any

from ..engine.types import ScriptPart, Voice
from ..storage.jobs import JobPart


class CollectorDeferred:
    """The cyclic garbage collector held off while a submission builds its script: a full
    collection walks every live object with the GIL held (100,000 turns in models, parts and
    chunks are millions: 50-100 ms a walk, several walks as they are made) and so stalls the
    loop from any thread. What a build leaves is frozen when the last build ends (``gc.freeze``
    moves it out of the collector's walks at no cost: the first young collection after would
    otherwise walk it all at once) and unfrozen when the last submission is answered, by when
    reference counting has freed it. Nested: counts of the builds and submissions inside."""

    building = 0
    submitting = 0
    disabled_here = False
    frozen_here = False

    def __enter__(self) -> None:
        cls = type(self)
        if cls.building == 0 and gc.isenabled():
            gc.disable()
            cls.disabled_here = True
        cls.building += 1

    def __exit__(self, *exc: Any) -> None:
        cls = type(self)
        cls.building -= 1
        if cls.building == 0 and cls.disabled_here:
            cls.disabled_here = False
            gc.freeze()
            cls.frozen_here = True
            gc.enable()

    @classmethod
    def submission(cls, start: bool) -> None:
        """A submission begins (``start``) or is answered."""
        cls.submitting += 1 if start else -1
        if cls.submitting == 0 and cls.frozen_here:
            cls.frozen_here = False
            gc.unfreeze()


def emptied(*lists: list) -> None:
    """Each list emptied from its end one item at a time, on a worker thread: a list of 100,000
    models (or of 500 chunks of 200 segments each) freed at once is one C call that holds the
    GIL for tens of milliseconds, and the loop cannot run meanwhile. Between items the
    interpreter can hand the GIL over; one item is bounded by the request's limits."""
    for items in lists:
        while items:
            items.pop()


def job_parts(parts: list[ScriptPart]) -> tuple[list[Voice], list[JobPart]]:
    """A script's parts as a job stores them: each distinct voice once (the job's
    ``script_voices``), each part naming its voice by index there. A voice is found by identity
    first (the parts of one resolved voice share its object), by its fields only the first time
    an object is seen: a clip voice's tens of kilobytes are never copied or encoded per part."""
    by_object: dict[int, int] = {}
    by_fields: dict[tuple, int] = {}
    table: list[Voice] = []
    out: list[JobPart] = []
    for part in parts:
        v = part.voice
        n = by_object.get(id(v))  # the parts hold every voice alive: an id is not reused meanwhile
        if n is None:
            n = by_fields.setdefault((v.name, v.seed, v.spk_emb, v.spk_smp, v.txt_smp), len(table))
            if n == len(table):
                table.append(v)
            by_object[id(v)] = n
        out.append(
            JobPart(
                text=part.text,
                voice=n,
                speed=part.speed,
                prompt=part.prompt,
                offset=part.offset,
                span=part.span,
                pause_before=part.pause_before,
                speaker=part.speaker,
                turn=part.turn,
            )
        )
    return table, out
