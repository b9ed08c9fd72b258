"""The ``directory`` backend: one JSON file per lexicon plus an index, shared by the replicas of
one host (the voices' directory backend's scheme: atomic renames, a file lock for writes)."""

from __future__ import annotations

import asyncio
import json
from typing import Optional

from ...settings import LexiconStoreConfig
from ..files import write_atomic
from ..voices.model import owner_tag
from .model import LEXICON_ID_RE, StoredLexicon, default_lexicons_dir
from .store import LexiconStore


class DirectoryLexiconStore(LexiconStore):
    """``<path>/<id>.json`` per lexicon and ``<path>/index.json``: ``{"ids": {id: owner tag},
    "defaults": {owner tag: id}}`` (creation order kept). Mutations hold ``<path>/.lock``; reads
    take no lock, since every file is replaced atomically. File work runs off the event loop."""

    def __init__(self, cfg: LexiconStoreConfig):
        super().__init__(cfg)
        from filelock import FileLock

        self.root = default_lexicons_dir(cfg)
        self.root.mkdir(parents=True, exist_ok=True)
        self._index = self.root / "index.json"
        self._lock = FileLock(str(self.root / ".lock"), timeout=10)

    def _file(self, lexicon_id: str):
        if not LEXICON_ID_RE.fullmatch(lexicon_id):  # ids are generated and checked, never user text
            raise ValueError(f"not a lexicon id: {lexicon_id[:64]!r}")
        return self.root / f"{lexicon_id}.json"

    def _read_index(self) -> dict:
        try:
            index = json.loads(self._index.read_text(encoding="utf-8"))
        except FileNotFoundError:
            index = {}
        return {"ids": dict(index.get("ids", {})), "defaults": dict(index.get("defaults", {}))}

    def _read(self, lexicon_id: str) -> Optional[StoredLexicon]:
        try:
            return StoredLexicon.model_validate_json(self._file(lexicon_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def _owns(self, index: dict, lexicon_id: str, owner: Optional[str]) -> bool:
        tag = index["ids"].get(lexicon_id)
        return tag is not None and (owner is None or tag == owner_tag(owner))

    def _create_sync(self, lexicon: StoredLexicon, doc: str) -> None:
        with self._lock:
            index = self._read_index()
            tag = owner_tag(lexicon.owner)
            self._check_room(sum(1 for t in index["ids"].values() if t == tag), len(index["ids"]))
            write_atomic(self._file(lexicon.id), doc)  # the document first: the index never points at nothing
            index["ids"][lexicon.id] = tag
            if lexicon.default:
                index["defaults"][tag] = lexicon.id
            write_atomic(self._index, json.dumps(index))

    def _get_sync(self, lexicon_id: str, owner: Optional[str]) -> Optional[StoredLexicon]:
        if not self._owns(self._read_index(), lexicon_id, owner):
            return None
        return self._read(lexicon_id)

    def _list_sync(self, owner: Optional[str]) -> list[StoredLexicon]:
        index = self._read_index()
        found = (self._read(i) for i in index["ids"] if self._owns(index, i, owner) and LEXICON_ID_RE.fullmatch(i))
        return [x for x in found if x is not None]

    def _delete_sync(self, lexicon_id: str, owner: Optional[str]) -> bool:
        with self._lock:
            index = self._read_index()
            if not self._owns(index, lexicon_id, owner):
                return False
            tag = index["ids"].pop(lexicon_id)
            if index["defaults"].get(tag) == lexicon_id:
                del index["defaults"][tag]
            write_atomic(self._index, json.dumps(index))  # the index first: nothing resolves to a gone file
            self._file(lexicon_id).unlink(missing_ok=True)
            return True

    async def _create(self, lexicon: StoredLexicon, doc: str) -> None:
        await asyncio.to_thread(self._create_sync, lexicon, doc)

    async def _get(self, lexicon_id: str, owner: Optional[str]) -> Optional[StoredLexicon]:
        return await asyncio.to_thread(self._get_sync, lexicon_id, owner)

    async def _default_id(self, owner: str) -> Optional[str]:
        index = await asyncio.to_thread(self._read_index)
        return index["defaults"].get(owner_tag(owner))

    async def _list(self, owner: Optional[str]) -> list[StoredLexicon]:
        return await asyncio.to_thread(self._list_sync, owner)

    async def _delete(self, lexicon_id: str, owner: Optional[str]) -> bool:
        return await asyncio.to_thread(self._delete_sync, lexicon_id, owner)
