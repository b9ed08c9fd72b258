"""The voice store: the owner-scoped record store (``storage/records/``) with the voices' rules (a
name unique per owner, the size limit, the quotas), and its ``memory`` and ``directory`` backends;
``redis_store.py`` has the ``redis`` one."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from ...errors import APIError
from ...settings import VoiceStoreConfig
from ..records import DirectoryRecords, MemoryRecords, OwnedStore, RecordKind
from .model import (
    ANONYMOUS,
    MAX_NAME_CHARS,
    VOICE_ID_RE,
    StoredVoice,
    default_voices_dir,
    index_key,
    name_key,
    name_taken,
    read_names,
    write_names,
)

# Redis: <prefix>:v:<id>, the name index <prefix>:names, <prefix>:owners (for adopting voices
# stored before owners); directory: names.json, index key -> id.
VOICES = RecordKind(
    noun="voice",
    owned_plural="custom voices",
    id_re=VOICE_ID_RE,
    model=StoredVoice,
    key_letter="v",
    pointer_hash="names",
    index_file="names.json",
    read_index=read_names,
    write_index=write_names,
    unique_pointers=True,
    track_owners=True,
    taken=lambda voice: name_taken(voice.name),
)


class VoiceStore(OwnedStore):
    """Every read and delete takes ``owner`` (whose voices it may find) and ``admin`` (every
    owner's). A voice's pointer is its name's index key (``index_key``): unique per owner."""

    kind = VOICES
    cfg: VoiceStoreConfig

    def limits(self) -> tuple[int, int]:
        return self.cfg.max_voices_per_key, self.cfg.max_voices

    def pointer(self, voice: StoredVoice) -> str:
        return index_key(voice.owner, voice.name)

    def directory(self) -> Path:
        return Path(self.cfg.path).expanduser() if self.cfg.path else default_voices_dir()

    def _check_doc(self, doc: str) -> None:
        size = len(doc.encode())
        if size > self.cfg.max_voice_bytes:
            raise APIError(
                413, f"voice is {size} bytes stored; the limit is {self.cfg.max_voice_bytes}", code="voice_too_large"
            )

    async def get_by_name(self, name: str, owner: str = ANONYMOUS, admin: bool = False) -> Optional[StoredVoice]:
        """``owner``'s voice with this name; an admin without one finds another owner's (the
        oldest, when several owners have one)."""
        if not name or len(name) > MAX_NAME_CHARS:
            return None
        found = await self.pointed(index_key(owner, name))
        # The index is a hash of the name: confirm it (a stale index entry must not resolve).
        if found is not None and found.owner == owner and found.name.casefold() == name.casefold():
            return found
        if not admin:
            return None
        every = [v for v in await self.pointed_by_suffix(name_key(name)) if v.name.casefold() == name.casefold()]
        return min(every, key=lambda v: (v.created_at, v.id)) if every else None


class MemoryVoiceStore(VoiceStore, MemoryRecords):
    """One process's voices (tests, one replica that may forget them on restart)."""


class DirectoryVoiceStore(VoiceStore, DirectoryRecords):
    """``<path>/<id>.json`` per voice and ``<path>/names.json`` (index key -> id; the key tells
    the owner: ``index_key``), which is also what counts each owner's voices."""
