"""The ``directory`` backend (the default): one JSON file per voice plus a name index, shared by
the replicas of one host."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Optional

from ...settings import VoiceStoreConfig
from ..files import write_atomic as _write_atomic
from .model import (
    VOICE_ID_RE,
    StoredVoice,
    check_room,
    default_voices_dir,
    index_key,
    name_taken,
    owns_key,
    same_name_keys,
)
from .store import VoiceStore


class DirectoryVoiceStore(VoiceStore):
    """``<path>/<id>.json`` per voice and ``<path>/names.json`` (index key -> id; the key tells
    the owner: ``index_key``), which is also what counts each owner's voices. Mutations hold
    ``<path>/.lock`` (a file lock: replicas on one host); reads take no lock, since every file is
    replaced atomically. File work runs on a worker thread, off the event loop."""

    def __init__(self, cfg: VoiceStoreConfig):
        super().__init__(cfg)
        from filelock import FileLock

        self.root = Path(cfg.path).expanduser() if cfg.path else default_voices_dir()
        self.root.mkdir(parents=True, exist_ok=True)
        self._index = self.root / "names.json"
        self._lock = FileLock(str(self.root / ".lock"), timeout=10)

    def _file(self, voice_id: str) -> Path:
        # Ids are generated and checked, never user text; a raise, not an assert (python -O).
        if not VOICE_ID_RE.fullmatch(voice_id):
            raise ValueError(f"not a voice id: {voice_id[:64]!r}")
        return self.root / f"{voice_id}.json"

    def _read_index(self) -> dict[str, str]:
        try:
            return json.loads(self._index.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    @staticmethod
    def _ids_of(index: dict[str, str], owner: Optional[str]) -> list[str]:
        """The ids ``owner`` (None: anyone) holds, in the index's order (creation order)."""
        return [v for k, v in index.items() if (owner is None or owns_key(owner, k)) and VOICE_ID_RE.fullmatch(v)]

    def _read(self, voice_id: str) -> Optional[StoredVoice]:
        try:
            return StoredVoice.model_validate_json(self._file(voice_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def _counts_sync(self, owner: str, index: Optional[dict[str, str]] = None) -> tuple[int, int]:
        index = self._read_index() if index is None else index
        return sum(1 for k in index if owns_key(owner, k)), len(index)

    def _create_sync(self, voice: StoredVoice, doc: str, max_owned: int) -> None:
        with self._lock:
            index = self._read_index()
            key = index_key(voice.owner, voice.name)
            if key in index:
                raise name_taken(voice.name)
            check_room(*self._counts_sync(voice.owner, index), max_owned, self.cfg.max_voices)
            _write_atomic(self._file(voice.id), doc)  # the voice first: the index never points at nothing
            _write_atomic(self._index, json.dumps({**index, key: voice.id}))

    def _get_sync(self, voice_id: str, owner: Optional[str]) -> Optional[StoredVoice]:
        if owner is not None and voice_id not in self._ids_of(self._read_index(), owner):
            return None
        return self._read(voice_id)

    def _delete_sync(self, voice_id: str, owner: Optional[str]) -> bool:
        with self._lock:
            index = self._read_index()
            if owner is not None and voice_id not in self._ids_of(index, owner):
                return False
            if self._read(voice_id) is None:
                return False
            index = {k: v for k, v in index.items() if v != voice_id}
            _write_atomic(self._index, json.dumps(index))  # the index first: no name resolves to a gone file
            self._file(voice_id).unlink(missing_ok=True)
            return True

    def _get_by_name_sync(self, key: str) -> Optional[StoredVoice]:
        voice_id = self._read_index().get(key)
        return self._read(voice_id) if voice_id and VOICE_ID_RE.fullmatch(voice_id) else None

    def _find_name_sync(self, name_hash: str) -> list[StoredVoice]:
        index = self._read_index()
        voices = (self._read(index[k]) for k in same_name_keys(index, name_hash) if VOICE_ID_RE.fullmatch(index[k]))
        return [v for v in voices if v is not None]

    def _list_sync(self, owner: Optional[str]) -> list[StoredVoice]:
        voices = (self._read(v) for v in self._ids_of(self._read_index(), owner))
        return [v for v in voices if v is not None]

    async def _counts(self, owner: str) -> tuple[int, int]:
        return await asyncio.to_thread(self._counts_sync, owner)

    async def _create(self, voice: StoredVoice, doc: str, max_owned: int) -> None:
        await asyncio.to_thread(self._create_sync, voice, doc, max_owned)

    async def _get(self, voice_id: str, owner: Optional[str]) -> Optional[StoredVoice]:
        return await asyncio.to_thread(self._get_sync, voice_id, owner)

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        return await asyncio.to_thread(self._get_by_name_sync, key)

    async def _find_name(self, name_hash: str) -> list[StoredVoice]:
        return await asyncio.to_thread(self._find_name_sync, name_hash)

    async def _list(self, owner: Optional[str]) -> list[StoredVoice]:
        return await asyncio.to_thread(self._list_sync, owner)

    async def _delete(self, voice_id: str, owner: Optional[str]) -> bool:
        return await asyncio.to_thread(self._delete_sync, voice_id, owner)
