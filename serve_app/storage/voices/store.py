"""The voice store's interface (``VoiceStore``) and its one-process backend (``memory``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from ...errors import APIError
from ...settings import VoiceStoreConfig
from .model import (
    ANONYMOUS,
    MAX_NAME_CHARS,
    VOICE_ID_RE,
    StoredVoice,
    check_room,
    index_key,
    name_key,
    name_taken,
    same_name_keys,
    store_unavailable,
)


class VoiceStore(ABC):
    """Every read and delete takes ``owner`` (whose voices it may find) and ``admin`` (every
    owner's). The backends take ``owner=None`` for "any owner"."""

    def __init__(self, cfg: VoiceStoreConfig):
        self.cfg = cfg

    def owned_limit(self, max_owned: Optional[int]) -> int:
        """An owner's quota: its key's grant (``Caller.max_voices``), else the store's default."""
        return self.cfg.max_voices_per_key if max_owned is None else max_owned

    async def check_room(self, owner: str, max_owned: Optional[int] = None) -> None:
        """409 when ``owner`` holds its quota already or the store is full: checked before any
        encoding; ``create`` checks again, atomically with the write."""
        owned, total = await self._guard(self._counts, owner)
        check_room(owned, total, self.owned_limit(max_owned), self.cfg.max_voices)

    async def create(self, voice: StoredVoice, max_owned: Optional[int] = None) -> StoredVoice:
        """Store a new voice for ``voice.owner``; 409 when the owner has a voice of that name
        already, holds its quota (``max_owned``, None: ``max_voices_per_key``) or the store is
        full, 413 over the size limit, 503 when the backend fails."""
        doc = voice.to_json()
        if len(doc.encode()) > self.cfg.max_voice_bytes:
            raise APIError(
                413,
                f"voice is {len(doc.encode())} bytes stored; the limit is {self.cfg.max_voice_bytes}",
                code="voice_too_large",
            )
        await self._guard(self._create, voice, doc, self.owned_limit(max_owned))
        return voice

    async def get(self, voice_id: str, owner: str = ANONYMOUS, admin: bool = False) -> Optional[StoredVoice]:
        """``owner``'s voice with this id (an admin: anyone's); another owner's reads as None,
        by the same path as a missing one."""
        if not VOICE_ID_RE.fullmatch(voice_id):
            return None
        found = await self._guard(self._get, voice_id, None if admin else owner)
        return found if found is not None and (admin or found.owner == owner) else None

    async def get_by_name(self, name: str, owner: str = ANONYMOUS, admin: bool = False) -> Optional[StoredVoice]:
        """``owner``'s voice with this name; an admin without one finds another owner's (the
        oldest, when several owners have one)."""
        if not name or len(name) > MAX_NAME_CHARS:
            return None
        found = await self._guard(self._get_by_name, index_key(owner, name))
        # The index is a hash of the name: confirm it (a stale index entry must not resolve).
        if found is not None and found.owner == owner and found.name.casefold() == name.casefold():
            return found
        if not admin:
            return None
        every = [v for v in await self._guard(self._find_name, name_key(name)) if v.name.casefold() == name.casefold()]
        return min(every, key=lambda v: (v.created_at, v.id)) if every else None

    async def list(self, owner: str = ANONYMOUS, admin: bool = False) -> list[StoredVoice]:
        """``owner``'s voices (an admin: everyone's), oldest first."""
        voices = await self._guard(self._list, None if admin else owner)
        if not admin:
            voices = [v for v in voices if v.owner == owner]
        return sorted(voices, key=lambda v: v.created_at)  # stable: the backend's order within a second

    async def delete(self, voice_id: str, owner: str = ANONYMOUS, admin: bool = False) -> bool:
        """Delete ``owner``'s voice (an admin: anyone's); False for another owner's, as for a
        missing one."""
        if not VOICE_ID_RE.fullmatch(voice_id):
            return False
        return await self._guard(self._delete, voice_id, None if admin else owner)

    async def close(self) -> None:
        return None

    async def _guard(self, fn, *args):
        try:
            return await fn(*args)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - disk or network trouble: the caller gets a 503
            raise store_unavailable(exc) from None

    @abstractmethod
    async def _counts(self, owner: str) -> tuple[int, int]:
        """(voices ``owner`` holds, voices in the store)."""

    @abstractmethod
    async def _create(self, voice: StoredVoice, doc: str, max_owned: int) -> None:
        """Atomically: the name check, the owner's quota, the store's limit and the write."""

    @abstractmethod
    async def _get(self, voice_id: str, owner: Optional[str]) -> Optional[StoredVoice]:
        """The voice if it exists and ``owner`` (None: anyone) owns it; the owner is checked
        before the document is read, so another owner's id costs what a missing one does."""

    @abstractmethod
    async def _get_by_name(self, key: str) -> Optional[StoredVoice]: ...

    @abstractmethod
    async def _find_name(self, name_hash: str) -> list[StoredVoice]:
        """Every owner's voices under the name with this hash (an admin's look-up)."""

    @abstractmethod
    async def _list(self, owner: Optional[str]) -> list[StoredVoice]: ...

    @abstractmethod
    async def _delete(self, voice_id: str, owner: Optional[str]) -> bool: ...


class MemoryVoiceStore(VoiceStore):
    """One process's voices (tests, one replica that may forget them on restart). Each method
    runs without awaiting in between: atomic on the replica's event loop."""

    def __init__(self, cfg: VoiceStoreConfig):
        super().__init__(cfg)
        self._voices: dict[str, str] = {}  # id -> JSON (a copy, as the other backends keep)
        self._names: dict[str, str] = {}  # index key -> id
        self._owned: dict[str, dict[str, None]] = {}  # owner -> its ids, in creation order

    async def _counts(self, owner: str) -> tuple[int, int]:
        return len(self._owned.get(owner, ())), len(self._voices)

    async def _create(self, voice: StoredVoice, doc: str, max_owned: int) -> None:
        key = index_key(voice.owner, voice.name)
        if key in self._names:
            raise name_taken(voice.name)
        check_room(len(self._owned.get(voice.owner, ())), len(self._voices), max_owned, self.cfg.max_voices)
        self._voices[voice.id] = doc
        self._names[key] = voice.id
        self._owned.setdefault(voice.owner, {})[voice.id] = None

    def _read(self, voice_id: str) -> Optional[StoredVoice]:
        doc = self._voices.get(voice_id)
        return StoredVoice.model_validate_json(doc) if doc is not None else None

    async def _get(self, voice_id: str, owner: Optional[str]) -> Optional[StoredVoice]:
        if owner is not None and voice_id not in self._owned.get(owner, ()):
            return None
        return self._read(voice_id)

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        voice_id = self._names.get(key)
        return self._read(voice_id) if voice_id else None

    async def _find_name(self, name_hash: str) -> list[StoredVoice]:
        voices = (self._read(self._names[k]) for k in same_name_keys(self._names, name_hash))
        return [v for v in voices if v is not None]

    async def _list(self, owner: Optional[str]) -> list[StoredVoice]:
        ids = self._voices if owner is None else self._owned.get(owner, {})
        return [StoredVoice.model_validate_json(self._voices[i]) for i in ids if i in self._voices]

    async def _delete(self, voice_id: str, owner: Optional[str]) -> bool:
        voice = await self._get(voice_id, owner)
        if voice is None:
            return False
        del self._voices[voice_id]
        self._names.pop(index_key(voice.owner, voice.name), None)
        self._owned.get(voice.owner, {}).pop(voice_id, None)
        return True
