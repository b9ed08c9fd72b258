"""Voices users own: stored speakers, seeds and reference clips, shared by the Ingress replicas.

A stored voice is one JSON document (``StoredVoice``) under a generated id (``voice_`` + 24 hex
digits, checked by ``VOICE_ID_RE`` before it is used anywhere). Every voice belongs to an owner:
the API key id that made it (``http/security.py``'s ``Caller.owner``), or ``anonymous`` without
keys; documents stored before voices had owners read as ``anonymous``'s. Ids are global (and
unguessable); names are unique per owner (compared case-insensitively) and never collide with
the built-in names, ``seed:<n>`` or ids. Every read takes the owner it reads for: an id or a name
finds only that owner's voices (another owner's id reads exactly like a missing one), unless the
reader is an admin (every voice; by name its own first). Each owner holds at most its quota of
voices, and the store at most ``max_voices`` in all.

Backends, like the response cache's:

- ``memory``: one process; voices are gone when the replica restarts.
- ``directory`` (default): one JSON file per voice plus a name index in a local directory;
  writes go to a temporary file and are renamed into place (readers never see half a file);
  creating and deleting hold a file lock, so replicas on one host share it safely.
- ``redis``: many nodes; creating and deleting are Lua scripts (the name check, the owner's
  quota, the count limit and the write happen atomically).

Unlike the cache, the store is not optional: a backend failure is a 503, never a silent miss.
User input never reaches a filesystem path or a Redis key other than through a generated id or
a hash of the name (and of the owner).

``VoiceCatalog`` resolves what a speech request names (built-in name, ``seed:<n>``, speaker
string, custom name or id) into an engine ``Voice``, for one owner. The cache key takes the
voice's content (``Voice.cache_id``), never its name, id or owner, so replacing a voice never
serves stale audio.
"""

from __future__ import annotations

from typing import Any, Optional

from ...engine.errors import UnknownVoiceError, VoiceError
from ...engine.types import Voice
from ...engine.voices import OPENAI_VOICES, VoiceResolver, list_voices
from ...settings import VoiceStoreConfig
from ..factory import open_store
from .model import (
    ANONYMOUS,
    MAX_CONSENT_BY_CHARS,
    MAX_CONSENT_CHARS,
    MAX_NAME_CHARS,
    VOICE_ID_RE,
    StoredVoice,
    VoiceConsent,
    VoiceKind,
    check_consent,
    check_name,
    clean_transcript,
    index_key,
    name_key,
    new_voice_id,
    stored_voice,
)
from .redis_store import RedisVoiceStore
from .store import DirectoryVoiceStore, MemoryVoiceStore, VoiceStore

__all__ = [
    "ANONYMOUS",
    "MAX_CONSENT_BY_CHARS",
    "MAX_CONSENT_CHARS",
    "VOICE_ID_RE",
    "DirectoryVoiceStore",
    "MemoryVoiceStore",
    "RedisVoiceStore",
    "StoredVoice",
    "VoiceCatalog",
    "VoiceConsent",
    "VoiceKind",
    "VoiceStore",
    "check_consent",
    "check_name",
    "clean_transcript",
    "index_key",
    "make_voice_store",
    "name_key",
    "new_voice_id",
    "stored_voice",
]


def make_voice_store(cfg: VoiceStoreConfig) -> VoiceStore:
    """The store ``cfg.backend`` names (``open_store``: every store's factory has this shape)."""
    return open_store({"memory": MemoryVoiceStore, "directory": DirectoryVoiceStore, "redis": RedisVoiceStore}, cfg)


# ------------------------------------------------------------------ resolving a request's voice


class VoiceCatalog:
    """Every voice a request may name: built-ins, ``seed:<n>``, speaker strings (``VoiceResolver``,
    no store access) and the store's custom voices of the caller (``owner``: its key id; an
    admin's: every owner's), by id or by name."""

    def __init__(self, store: VoiceStore):
        self.store = store
        self.builtin = VoiceResolver()

    async def resolve(self, voice: Optional[str], owner: str, admin: bool = False) -> Voice:
        """The voice ``owner`` names (``admin``: any owner's custom voice, its own first by name);
        another owner's id or name is unknown exactly as a missing one is (``UnknownVoiceError``:
        400 ``voice_not_found``, param ``voice``)."""
        voice = (voice or "").strip()
        if VOICE_ID_RE.fullmatch(voice):
            stored = await self.store.get(voice, owner, admin=admin)
            if stored is None:
                raise UnknownVoiceError(f"no voice with id {voice!r}")
            return stored.voice()
        try:
            return self.builtin.resolve(voice)
        except VoiceError:
            if len(voice) > MAX_NAME_CHARS:
                raise  # a malformed speaker string
        # Not built in and not a speaker string: a custom voice's name, or nothing.
        stored = await self.store.get_by_name(voice, owner, admin=admin)
        if stored is None:
            raise UnknownVoiceError(
                f"unknown voice {voice[:40]!r}: use a built-in voice ({', '.join(OPENAI_VOICES)}), a custom voice's "
                "name or id (GET /v1/audio/voices), 'seed:<n>', or a ChatTTS speaker string"
            )
        return stored.voice()

    @staticmethod
    def builtin_cards() -> list[dict[str, Any]]:
        """The built-in voices' cards (what a caller without a key may list)."""
        return [
            {"id": v["id"], "object": "voice", "name": v["id"], "kind": "builtin", "seed": v["seed"]}
            for v in list_voices()
        ]

    async def cards(self, owner: str, admin: bool = False) -> list[dict[str, Any]]:
        """``GET /v1/audio/voices``: the built-in voices, then ``owner``'s custom ones (an
        admin's: everyone's, each with its owner), oldest first."""
        return self.builtin_cards() + [v.summary() for v in await self.store.list(owner, admin=admin)]
