"""The lexicon store: the owner-scoped record store (``storage/records/``) with the lexicons'
rules (the quotas; an owner's default lexicon, a pointer beside its lexicons; the anonymous owner,
every caller where keys are off, has none) and its three backends."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ...settings import LexiconStoreConfig
from ..records import ANONYMOUS, DirectoryRecords, MemoryRecords, OwnedStore, RecordKind, RedisRecords, owner_tag
from .model import LEXICON_ID_RE, StoredLexicon, default_lexicons_dir, read_index, summary_of, write_index

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
    ``default: true`` (deleting it leaves the owner without one). The anonymous owner has no
    default: without keys every caller is that owner, and one caller's default would change
    everyone's speech (``parse_create`` refuses one; one stored before is not applied)."""

    kind = LEXICONS
    cfg: LexiconStoreConfig

    def limits(self) -> tuple[int, int]:
        return self.cfg.max_lexicons_per_key, self.cfg.max_lexicons

    def pointer(self, lexicon: StoredLexicon) -> Optional[str]:
        return owner_tag(lexicon.owner) if lexicon.default and lexicon.owner != ANONYMOUS else None

    def directory(self) -> Path:
        return default_lexicons_dir(self.cfg)

    async def default_of(self, owner: str) -> Optional[StoredLexicon]:
        """``owner``'s default lexicon, if it has one (as stored: its ``default`` flag is the one it
        was made with). One lookup: the pointer and the document together."""
        if owner == ANONYMOUS:
            return None
        return await self.pointed(owner_tag(owner), owner)

    async def summaries(self, owner: str, admin: bool = False) -> list[dict[str, Any]]:
        """``list`` as the list answer shows it (``StoredLexicon.summary``), oldest first: read
        from the documents' stored summary fields in a bulk worker, no entry validated."""
        docs = await self._guard(self._list, None if admin else owner)
        found = await self.workers.bulk(lambda: [summary_of(i, doc) for i, doc in docs])
        if not admin:
            found = [x for x in found if x["owner"] == owner]
        defaults = await self._defaults({x["owner"] for x in found})
        for x in found:
            x["default"] = x["id"] == defaults.get(x["owner"])
        return sorted(found, key=lambda x: x["created_at"])

    async def _defaults(self, owners: set[str]) -> dict[str, Optional[str]]:
        """Each owner's default lexicon's id (None: none), in one read of the pointers."""
        tags = {owner_tag(o): o for o in owners if o != ANONYMOUS}
        pointed = await self._guard(self._pointed_many, list(tags)) if tags else {}
        return {tags[t]: i for t, i in pointed.items()}

    async def _present(self, found: list[StoredLexicon]) -> list[StoredLexicon]:
        """``default`` as each owner's pointer says (a document keeps the flag it was made with)."""
        defaults = await self._defaults({x.owner for x in found})
        return [x.model_copy(update={"default": x.id == defaults.get(x.owner)}) for x in found]


class MemoryLexiconStore(LexiconStore, MemoryRecords):
    """One process's lexicons (tests, one replica)."""


class DirectoryLexiconStore(LexiconStore, DirectoryRecords):
    """``<path>/<id>.json`` per lexicon and ``<path>/index.json``."""


class RedisLexiconStore(LexiconStore, RedisRecords):
    """``<prefix>:l:<id>`` (JSON), ``<prefix>:ids``, ``<prefix>:own:<owner tag>`` and
    ``<prefix>:defaults`` (owner tag -> its default lexicon's id)."""
