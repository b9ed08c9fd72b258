"""Voices users own: stored speakers, seeds and reference clips, shared by the Ingress replicas.

A stored voice is one JSON document (``StoredVoice``) under a generated id (``voice_`` + 24 hex
digits, checked by ``VOICE_ID_RE`` before it is used anywhere). Names are unique (compared
case-insensitively) and never collide with the built-in names, ``seed:<n>`` or ids.

Backends, like the response cache's:

- ``memory``: one process; voices are gone when the replica restarts.
- ``directory`` (default): one JSON file per voice plus a name index in a local directory;
  writes go to a temporary file and are renamed into place (readers never see half a file);
  creating and deleting hold a file lock, so replicas on one host share it safely.
- ``redis``: many nodes; creating and deleting are Lua scripts (the name check, the count limit
  and the write happen atomically).

Unlike the cache, the store is not optional: a backend failure is a 503, never a silent miss.
User input never reaches a filesystem path or a Redis key other than through a generated id or
a hash of the name.

``VoiceCatalog`` resolves what a speech request names (built-in name, ``seed:<n>``, speaker
string, custom name or id) into an engine ``Voice``. The cache key takes the voice's content
(``Voice.cache_id``), never its name or id, so replacing a voice never serves stale audio.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import re
import secrets
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field

from ..engine.errors import UnknownVoiceError, VoiceError
from ..engine.text.tags import strip_stray_brackets
from ..engine.types import Voice
from ..engine.voices import MAX_SEED, OPENAI_VOICES, VoiceResolver, list_voices
from ..errors import APIError
from ..settings import VoiceStoreConfig

log = logging.getLogger(__name__)

VOICE_ID_RE = re.compile(r"^voice_[0-9a-f]{24}$")
MAX_NAME_CHARS = 64
_RESERVED_PREFIXES = ("seed:", "voice_")
KiB = 1024
MiB = 1024 * KiB

VoiceKind = Literal["speaker", "seed", "clip"]


def default_voices_dir() -> Path:
    """``$XDG_DATA_HOME/chattts-serve/voices`` (``~/.local/share/...``): user data, not a cache."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "chattts-serve" / "voices"


class StoredVoice(BaseModel):
    """One custom voice as stored. ``speaker``/``seed``: a ChatTTS speaker (a seed voice keeps
    the speaker string sampled from its seed, so it stays the same speaker); ``sample`` and
    ``transcript``: a reference clip's audio codes (ChatTTS's ``spk_smp``) and its text."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=VOICE_ID_RE.pattern)
    name: str
    kind: VoiceKind
    created_at: int
    speaker: Optional[str] = None
    seed: Optional[int] = Field(default=None, ge=0, le=MAX_SEED)
    sample: Optional[str] = None
    transcript: Optional[str] = None
    clip_seconds: Optional[float] = None

    def voice(self) -> Voice:
        return Voice(self.name, self.seed, spk_emb=self.speaker, spk_smp=self.sample, txt_smp=self.transcript)

    def summary(self) -> dict[str, Any]:
        """What the create and list answers show (no speaker or codes: they are long)."""
        out = {"id": self.id, "object": "voice", "name": self.name, "kind": self.kind, "created_at": self.created_at}
        if self.seed is not None:
            out["seed"] = self.seed
        if self.clip_seconds is not None:
            out["clip_seconds"] = self.clip_seconds
        return out

    def detail(self) -> dict[str, Any]:
        """``GET /v1/audio/voices/{id}``: everything a user needs to keep this voice elsewhere."""
        return {**self.summary(), "speaker": self.speaker, "sample": self.sample, "transcript": self.transcript,
                "content_hash": self.voice().cache_id}

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


# ------------------------------------------------------------------ validation of user input


def check_name(name: Any) -> str:
    """A usable voice name, or a 400 that says why."""
    if not isinstance(name, str) or not name:
        raise APIError(400, "a voice needs a 'name'", param="name", code="missing_required_parameter")
    problem = None
    if len(name) > MAX_NAME_CHARS:
        problem = f"at most {MAX_NAME_CHARS} characters"
    elif name != name.strip() or not name.isprintable():
        problem = "printable characters without leading or trailing spaces"
    elif name.lower() in OPENAI_VOICES or name.lower().startswith(_RESERVED_PREFIXES):
        problem = "not a built-in voice name and not starting with 'seed:' or 'voice_'"
    if problem:
        raise APIError(400, f"invalid voice name: use {problem}", param="name", code="invalid_name")
    return name


def name_key(name: str) -> str:
    """Names are unique ignoring case; the key is a hash, so a name never becomes a path or key."""
    return hashlib.sha256(name.casefold().encode()).hexdigest()[:32]


def clean_transcript(text: Any, max_chars: int) -> str:
    """The clip's transcript as ChatTTS reads it before the text (``txt_smp``): internal tokens
    such as ``[spk_emb]`` cannot get in (only control tags keep their brackets)."""
    if not isinstance(text, str) or not text.strip():
        raise APIError(400, "a voice made from a clip needs its 'transcript': the words spoken in the clip",
                       param="transcript", code="missing_transcript")
    text = " ".join(strip_stray_brackets(text.replace("\x00", " ")).split())
    if len(text) > max_chars:
        raise APIError(400, f"transcript is {len(text)} characters; the limit is {max_chars}", param="transcript",
                       code="transcript_too_long")
    return text


def new_voice_id() -> str:
    return "voice_" + secrets.token_hex(12)


def _unavailable(exc: BaseException) -> APIError:
    log.warning("voice store failed: %s: %s", exc.__class__.__name__, exc)
    return APIError(503, "voice store unavailable; retry shortly", type="server_error", code="voice_store_unavailable",
                    headers={"Retry-After": "2"})


def _exists(name: str) -> APIError:
    return APIError(409, f"a voice named {name!r} exists already; delete it first or pick another name", param="name",
                    code="voice_exists")


def _full(limit: int) -> APIError:
    return APIError(409, f"the voice store is full ({limit} voices); delete one first", code="too_many_voices")


# ------------------------------------------------------------------ backends


class VoiceStore(ABC):
    def __init__(self, cfg: VoiceStoreConfig):
        self.cfg = cfg

    async def create(self, voice: StoredVoice) -> StoredVoice:
        """Store a new voice; 409 when its name is taken or the store is full, 413 over the size
        limit, 503 when the backend fails."""
        doc = voice.to_json()
        if len(doc.encode()) > self.cfg.max_voice_bytes:
            raise APIError(413, f"voice is {len(doc.encode())} bytes stored; the limit is {self.cfg.max_voice_bytes}",
                           code="voice_too_large")
        await self._guard(self._create, voice, doc)
        return voice

    async def get(self, voice_id: str) -> Optional[StoredVoice]:
        if not VOICE_ID_RE.match(voice_id):
            return None
        return await self._guard(self._get, voice_id)

    async def get_by_name(self, name: str) -> Optional[StoredVoice]:
        if not name or len(name) > MAX_NAME_CHARS:
            return None
        found = await self._guard(self._get_by_name, name_key(name))
        # The index is a hash of the name: confirm it (a stale index entry must not resolve).
        return found if found is not None and found.name.casefold() == name.casefold() else None

    async def list(self) -> list[StoredVoice]:
        voices = await self._guard(self._list)
        return sorted(voices, key=lambda v: v.created_at)  # stable: the backend's order within a second

    async def delete(self, voice_id: str) -> bool:
        if not VOICE_ID_RE.match(voice_id):
            return False
        return await self._guard(self._delete, voice_id)

    async def close(self) -> None:
        return None

    async def _guard(self, fn, *args):
        try:
            return await fn(*args)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - disk or network trouble: the caller gets a 503
            raise _unavailable(exc) from None

    @abstractmethod
    async def _create(self, voice: StoredVoice, doc: str) -> None: ...

    @abstractmethod
    async def _get(self, voice_id: str) -> Optional[StoredVoice]: ...

    @abstractmethod
    async def _get_by_name(self, key: str) -> Optional[StoredVoice]: ...

    @abstractmethod
    async def _list(self) -> list[StoredVoice]: ...

    @abstractmethod
    async def _delete(self, voice_id: str) -> bool: ...


class MemoryVoiceStore(VoiceStore):
    """One process's voices (tests, one replica that may forget them on restart)."""

    def __init__(self, cfg: VoiceStoreConfig):
        super().__init__(cfg)
        self._voices: dict[str, str] = {}  # id -> JSON (a copy, as the other backends keep)
        self._names: dict[str, str] = {}  # name key -> id

    async def _create(self, voice: StoredVoice, doc: str) -> None:
        key = name_key(voice.name)
        if key in self._names:
            raise _exists(voice.name)
        if len(self._voices) >= self.cfg.max_voices:
            raise _full(self.cfg.max_voices)
        self._voices[voice.id] = doc
        self._names[key] = voice.id

    async def _get(self, voice_id: str) -> Optional[StoredVoice]:
        doc = self._voices.get(voice_id)
        return StoredVoice.model_validate_json(doc) if doc is not None else None

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        voice_id = self._names.get(key)
        return await self._get(voice_id) if voice_id else None

    async def _list(self) -> list[StoredVoice]:
        return [StoredVoice.model_validate_json(d) for d in self._voices.values()]

    async def _delete(self, voice_id: str) -> bool:
        doc = self._voices.pop(voice_id, None)
        if doc is None:
            return False
        self._names.pop(name_key(StoredVoice.model_validate_json(doc).name), None)
        return True


def _write_atomic(path: Path, data: str) -> None:
    """Write to a temporary file in the same directory, flush it to disk, rename it into place:
    a reader sees the old file or the new one, never a part."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class DirectoryVoiceStore(VoiceStore):
    """``<path>/<id>.json`` per voice and ``<path>/names.json`` (name key -> id). Mutations hold
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
        assert VOICE_ID_RE.match(voice_id), voice_id  # ids are generated and checked, never user text
        return self.root / f"{voice_id}.json"

    def _read_index(self) -> dict[str, str]:
        try:
            return json.loads(self._index.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def _read(self, voice_id: str) -> Optional[StoredVoice]:
        try:
            return StoredVoice.model_validate_json(self._file(voice_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def _create_sync(self, voice: StoredVoice, doc: str) -> None:
        with self._lock:
            index = self._read_index()
            key = name_key(voice.name)
            if key in index:
                raise _exists(voice.name)
            if len(index) >= self.cfg.max_voices:
                raise _full(self.cfg.max_voices)
            _write_atomic(self._file(voice.id), doc)  # the voice first: the index never points at nothing
            _write_atomic(self._index, json.dumps({**index, key: voice.id}))

    def _delete_sync(self, voice_id: str) -> bool:
        with self._lock:
            voice = self._read(voice_id)
            if voice is None:
                return False
            index = self._read_index()
            index = {k: v for k, v in index.items() if v != voice_id}
            _write_atomic(self._index, json.dumps(index))  # the index first: no name resolves to a gone file
            self._file(voice_id).unlink(missing_ok=True)
            return True

    def _get_by_name_sync(self, key: str) -> Optional[StoredVoice]:
        voice_id = self._read_index().get(key)
        return self._read(voice_id) if voice_id and VOICE_ID_RE.match(voice_id) else None

    def _list_sync(self) -> list[StoredVoice]:
        voices = (self._read(v) for v in self._read_index().values() if VOICE_ID_RE.match(v))
        return [v for v in voices if v is not None]

    async def _create(self, voice: StoredVoice, doc: str) -> None:
        await asyncio.to_thread(self._create_sync, voice, doc)

    async def _get(self, voice_id: str) -> Optional[StoredVoice]:
        return await asyncio.to_thread(self._read, voice_id)

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        return await asyncio.to_thread(self._get_by_name_sync, key)

    async def _list(self) -> list[StoredVoice]:
        return await asyncio.to_thread(self._list_sync)

    async def _delete(self, voice_id: str) -> bool:
        return await asyncio.to_thread(self._delete_sync, voice_id)


# KEYS: names hash, ids sorted set, the voice's key. ARGV: name key, id, JSON, created_at, max voices.
_CREATE_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('SET', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
return 0
"""
# KEYS: names hash, ids sorted set, the voice's key. ARGV: name key, id.
_DELETE_LUA = """
if redis.call('DEL', KEYS[3]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('ZREM', KEYS[2], ARGV[2])
return 1
"""


class RedisVoiceStore(VoiceStore):
    """``<prefix>:v:<id>`` (JSON), ``<prefix>:names`` (name key -> id), ``<prefix>:ids`` (ids by
    creation time). No persistence of its own: configure the Redis server to keep its data."""

    def __init__(self, cfg: VoiceStoreConfig):
        super().__init__(cfg)
        from redis.asyncio import Redis

        assert cfg.redis_url is not None
        self._redis = Redis.from_url(cfg.redis_url, socket_timeout=cfg.redis_timeout_s,
                                     socket_connect_timeout=cfg.redis_timeout_s)
        self._names = f"{cfg.redis_prefix}:names"
        self._ids = f"{cfg.redis_prefix}:ids"
        self._create_script = self._redis.register_script(_CREATE_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)

    def _key(self, voice_id: str) -> str:
        assert VOICE_ID_RE.match(voice_id), voice_id
        return f"{self.cfg.redis_prefix}:v:{voice_id}"

    async def _create(self, voice: StoredVoice, doc: str) -> None:
        keys = [self._names, self._ids, self._key(voice.id)]
        # Scored by creation in microseconds: the list keeps creation order within a second.
        code = await self._create_script(keys=keys, args=[name_key(voice.name), voice.id, doc, time.time_ns() // 1000,
                                                          self.cfg.max_voices])
        if code == 1:
            raise _exists(voice.name)
        if code == 2:
            raise _full(self.cfg.max_voices)

    async def _get(self, voice_id: str) -> Optional[StoredVoice]:
        doc = await self._redis.get(self._key(voice_id))
        return StoredVoice.model_validate_json(doc) if doc is not None else None

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        voice_id = await self._redis.hget(self._names, key)
        voice_id = voice_id.decode() if voice_id else ""
        return await self._get(voice_id) if VOICE_ID_RE.match(voice_id) else None

    async def _list(self) -> list[StoredVoice]:
        ids = [i.decode() for i in await self._redis.zrange(self._ids, 0, -1)]
        ids = [i for i in ids if VOICE_ID_RE.match(i)]
        docs = await self._redis.mget([self._key(i) for i in ids]) if ids else []
        return [StoredVoice.model_validate_json(d) for d in docs if d is not None]

    async def _delete(self, voice_id: str) -> bool:
        voice = await self._get(voice_id)
        if voice is None:
            return False
        keys = [self._names, self._ids, self._key(voice_id)]
        return bool(await self._delete_script(keys=keys, args=[name_key(voice.name), voice_id]))

    async def close(self) -> None:
        await self._redis.aclose()


def make_voice_store(cfg: VoiceStoreConfig) -> VoiceStore:
    if cfg.backend == "memory":
        return MemoryVoiceStore(cfg)
    if cfg.backend == "redis":
        return RedisVoiceStore(cfg)
    return DirectoryVoiceStore(cfg)


# ------------------------------------------------------------------ resolving a request's voice


class VoiceCatalog:
    """Every voice a request may name: built-ins, ``seed:<n>``, speaker strings (``VoiceResolver``,
    no store access) and the store's custom voices, by id or by name."""

    def __init__(self, store: VoiceStore):
        self.store = store
        self.builtin = VoiceResolver()

    async def resolve(self, voice: Optional[str]) -> Voice:
        voice = (voice or "").strip()
        if VOICE_ID_RE.match(voice):
            stored = await self.store.get(voice)
            if stored is None:
                raise UnknownVoiceError(f"no voice with id {voice!r}")
            return stored.voice()
        try:
            return self.builtin.resolve(voice)
        except VoiceError:
            if len(voice) > MAX_NAME_CHARS:
                raise  # a malformed speaker string
        # Not built in and not a speaker string: a custom voice's name, or nothing.
        stored = await self.store.get_by_name(voice)
        if stored is None:
            raise UnknownVoiceError(
                f"unknown voice {voice[:40]!r}: use a built-in voice ({', '.join(OPENAI_VOICES)}), a custom voice's "
                "name or id (GET /v1/audio/voices), 'seed:<n>', or a ChatTTS speaker string"
            )
        return stored.voice()

    async def cards(self) -> list[dict[str, Any]]:
        """``GET /v1/audio/voices``: the built-in voices, then the custom ones, oldest first."""
        builtin = [{"id": v["id"], "object": "voice", "name": v["id"], "kind": "builtin", "seed": v["seed"]}
                   for v in list_voices()]
        return builtin + [v.summary() for v in await self.store.list()]


def stored_voice(name: str, kind: VoiceKind, **fields: Any) -> StoredVoice:
    return StoredVoice(id=new_voice_id(), name=name, kind=kind, created_at=int(time.time()), **fields)
