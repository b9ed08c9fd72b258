"""The lexicon store: the owner-scoped record store (``storage/records/``) with the lexicons'
rules (the quotas; an owner's default lexicon, a pointer beside its lexicons) and its three
backends."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...settings import LexiconStoreConfig
from ..records import DirectoryRecords, MemoryRecords, OwnedStore, RecordKind, RedisRecords, owner_tag
from .model import LEXICON_ID_RE, StoredLexicon, default_lexicons_dir, read_index, write_index

# Redis: <prefix>:l:<id>, the defaults <prefix>:defaults (owner tag -> id); directory:
# index.json, {"ids": {id: owner tag}, "defaults": {owner tag: id}}.
LEXICONS = RecordKind(
    noun="lexicon",
    id_re=LEXICON_ID_RE,
    model=StoredLexicon,
    key_letter="l",
    pointer_hash="defaults",
    index_file="index.json",
    read_index=read_index,
    write_index=write_index,
)


class LexiconStore(OwnedStore):
    """Every read and delete takes ``owner`` (whose lexicons it may find) and ``admin`` (every
    owner's). An owner's default lexicon is a pointer beside its lexicons: the newest made with
    ``default: true`` (deleting it leaves the owner without one)."""

    kind = LEXICONS
    cfg: LexiconStoreConfig

    def limits(self) -> tuple[int, int]:
        return self.cfg.max_lexicons_per_key, self.cfg.max_lexicons

    def pointer(self, lexicon: StoredLexicon) -> Optional[str]:
        return owner_tag(lexicon.owner) if lexicon.default else None

    def directory(self) -> Path:
        return default_lexicons_dir(self.cfg)

    async def default_of(self, owner: str) -> Optional[StoredLexicon]:
        """``owner``'s default lexicon, if it has one."""
        lexicon_id = await self._guard(self._pointed, owner_tag(owner))
        return await self.get(lexicon_id, owner) if lexicon_id else None

    async def _present(self, found: list[StoredLexicon]) -> list[StoredLexicon]:
        """``default`` as each owner's pointer says (a document keeps the flag it was made with)."""
        defaults = {
            who: await self._guard(self._pointed, owner_tag(who)) for who in dict.fromkeys(x.owner for x in found)
        }
        return [x.model_copy(update={"default": x.id == defaults[x.owner]}) for x in found]


class MemoryLexiconStore(LexiconStore, MemoryRecords):
    """One process's lexicons (tests, one replica)."""


class DirectoryLexiconStore(LexiconStore, DirectoryRecords):
    """``<path>/<id>.json`` per lexicon and ``<path>/index.json``."""


class RedisLexiconStore(LexiconStore, RedisRecords):
    """``<prefix>:l:<id>`` (JSON), ``<prefix>:ids``, ``<prefix>:own:<owner tag>`` and
    ``<prefix>:defaults`` (owner tag -> its default lexicon's id)."""
