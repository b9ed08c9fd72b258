"""Pronunciation lexicons users own, shared by the Ingress replicas (the voice store's pattern).

A lexicon is one JSON document (``StoredLexicon``: a name, its entries, its owner) under a
generated id (``lex_`` + 24 hex digits, checked by ``LEXICON_ID_RE`` before it is used anywhere).
Every read takes the owner it reads for: another owner's id reads exactly like a missing one
(an admin key reads every owner's). Each owner holds at most ``max_lexicons_per_key``, the
store at most ``max_lexicons``; entries and their sizes are bounded when a lexicon is made
(``LexiconStoreConfig``). An owner may have a default lexicon (made with ``default: true``; the
newest such wins), applied to its requests that name none.

Backends (``args.lexicons.backend``, by default the voices' own): ``memory`` (one process),
``directory`` (one JSON file per lexicon and an index, atomic renames and a file lock) and
``redis`` (Lua scripts keep the quota check and the write atomic). A backend failure is a 503,
never a silent miss.

``LexiconBook`` resolves a request's ``lexicon`` (an id, ``none``, or nothing: the owner's
default) into the ``Pronunciations`` the TextNormalizer applies (``engine/text/lexicon.py``).
The anonymous owner (every caller where keys are off) has no default lexicon: one caller's would
change everyone's speech, so ``default: true`` needs an API key.
"""

from __future__ import annotations

from typing import Optional

from ...engine.text.lexicon import Pronunciations
from ...engine.text.pinyin import syllable_table
from ...errors import APIError
from ...settings import LexiconStoreConfig
from ..factory import open_store
from .model import LEXICON_ID_RE, StoredLexicon, lexicon_not_found, parse_create
from .store import DirectoryLexiconStore, LexiconStore, MemoryLexiconStore, RedisLexiconStore

__all__ = [
    "LEXICON_ID_RE",
    "DirectoryLexiconStore",
    "LexiconBook",
    "LexiconStore",
    "MemoryLexiconStore",
    "RedisLexiconStore",
    "StoredLexicon",
    "check_syllables",
    "lexicon_not_found",
    "make_lexicon_store",
    "parse_create",
]


def make_lexicon_store(cfg: LexiconStoreConfig) -> LexiconStore:
    """``cfg`` resolved already (``LexiconStoreConfig.resolved``: no backend left to the voices')."""
    backends = {"memory": MemoryLexiconStore, "directory": DirectoryLexiconStore, "redis": RedisLexiconStore}
    return open_store(backends, cfg, cfg.backend or "directory")


def check_syllables(lexicon: StoredLexicon) -> None:
    """400 for a pinyin syllable no character reads (the table is built once, at the replica's
    start: ``LexiconsAPI``; blocking either way, call it off the event loop)."""
    table = syllable_table()
    for i, entry in enumerate(lexicon.entries):
        for syllable in (entry.pinyin or "").split():
            if syllable not in table:
                raise APIError(
                    400,
                    f"entries.{i}: no character reads {syllable!r} (toned pinyin such as hang2, ü as v)",
                    param=f"entries.{i}",
                    code="invalid_lexicon",
                )


class LexiconBook:
    """What a request's ``lexicon`` means for one owner."""

    def __init__(self, store: LexiconStore):
        self.store = store

    async def pronunciations(self, ref: Optional[str], owner: str, admin: bool = False) -> Optional[Pronunciations]:
        """``ref``: a lexicon id (the owner's; an admin: anyone's), ``none``, or None (the owner's
        default, if any). Another owner's id answers as a missing one: 400 ``lexicon_not_found``."""
        if ref == "none":
            return None
        if ref is None:
            found = await self.store.default_of(owner)
        else:
            found = await self.store.get(ref, owner, admin=admin, present=False)
            if found is None:
                raise lexicon_not_found(ref, status=400)
        return found.pronunciations() if found is not None and found.entries else None
