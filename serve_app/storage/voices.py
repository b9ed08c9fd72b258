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

# The owner of voices made without API keys, and of documents stored before voices had owners
# (the same string as ``http.security.ANONYMOUS``; storage does not import the HTTP layer).
ANONYMOUS = "anonymous"
MAX_OWNER_CHARS = 128


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
    # The API key id that made it ("anonymous" without keys). A document stored before voices
    # had owners has none: it reads as "anonymous"'s.
    owner: str = Field(default=ANONYMOUS, min_length=1, max_length=MAX_OWNER_CHARS)
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
        """What the create and list answers show (no speaker or codes: they are long). ``owner``:
        the key id it belongs to (a caller's own; an admin sees every owner's)."""
        out = {"id": self.id, "object": "voice", "name": self.name, "kind": self.kind, "created_at": self.created_at,
               "owner": self.owner}
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


def owner_tag(owner: str) -> str:
    """An owner as the backends name it (a hash: an owner never becomes a path or key either)."""
    return hashlib.sha256(b"owner\0" + owner.encode()).hexdigest()[:16]


def index_key(owner: str, name: str) -> str:
    """The name index's key of ``owner``'s voice ``name``: ``<owner tag>.<name hash>``, so names
    are unique per owner. The anonymous owner's keys are the bare name hash, the key every voice
    had before voices had owners: an index written then reads unchanged, as anonymous's."""
    key = name_key(name)
    return key if owner == ANONYMOUS else f"{owner_tag(owner)}.{key}"


def _owns_key(owner: str, key: str) -> bool:
    """Whether a name index key is in ``owner``'s part of the index."""
    return "." not in key if owner == ANONYMOUS else key.startswith(owner_tag(owner) + ".")


def _same_name_keys(keys, name_hash: str):
    """The index keys of every owner's voice with the name whose hash is ``name_hash``."""
    return [k for k in keys if k == name_hash or k.endswith("." + name_hash)]


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


def _quota(limit: int) -> APIError:
    return APIError(409, f"this API key owns its limit of custom voices ({limit}); delete one first",
                    code="voice_quota_exceeded")


def _check_room(owned: int, total: int, max_owned: int, max_voices: int) -> None:
    """409 unless the owner (holding ``owned``) and the store (``total``) have room for one more."""
    if owned >= max_owned:
        raise _quota(max_owned)
    if total >= max_voices:
        raise _full(max_voices)


# ------------------------------------------------------------------ backends


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
        _check_room(owned, total, self.owned_limit(max_owned), self.cfg.max_voices)

    async def create(self, voice: StoredVoice, max_owned: Optional[int] = None) -> StoredVoice:
        """Store a new voice for ``voice.owner``; 409 when the owner has a voice of that name
        already, holds its quota (``max_owned``, None: ``max_voices_per_key``) or the store is
        full, 413 over the size limit, 503 when the backend fails."""
        doc = voice.to_json()
        if len(doc.encode()) > self.cfg.max_voice_bytes:
            raise APIError(413, f"voice is {len(doc.encode())} bytes stored; the limit is {self.cfg.max_voice_bytes}",
                           code="voice_too_large")
        await self._guard(self._create, voice, doc, self.owned_limit(max_owned))
        return voice

    async def get(self, voice_id: str, owner: str = ANONYMOUS, admin: bool = False) -> Optional[StoredVoice]:
        """``owner``'s voice with this id (an admin: anyone's); another owner's reads as None,
        by the same path as a missing one."""
        if not VOICE_ID_RE.match(voice_id):
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
        if not VOICE_ID_RE.match(voice_id):
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
            raise _unavailable(exc) from None

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
            raise _exists(voice.name)
        _check_room(len(self._owned.get(voice.owner, ())), len(self._voices), max_owned, self.cfg.max_voices)
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
        voices = (self._read(self._names[k]) for k in _same_name_keys(self._names, name_hash))
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
        assert VOICE_ID_RE.match(voice_id), voice_id  # ids are generated and checked, never user text
        return self.root / f"{voice_id}.json"

    def _read_index(self) -> dict[str, str]:
        try:
            return json.loads(self._index.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    @staticmethod
    def _ids_of(index: dict[str, str], owner: Optional[str]) -> list[str]:
        """The ids ``owner`` (None: anyone) holds, in the index's order (creation order)."""
        return [v for k, v in index.items() if (owner is None or _owns_key(owner, k)) and VOICE_ID_RE.match(v)]

    def _read(self, voice_id: str) -> Optional[StoredVoice]:
        try:
            return StoredVoice.model_validate_json(self._file(voice_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None

    def _counts_sync(self, owner: str, index: Optional[dict[str, str]] = None) -> tuple[int, int]:
        index = self._read_index() if index is None else index
        return sum(1 for k in index if _owns_key(owner, k)), len(index)

    def _create_sync(self, voice: StoredVoice, doc: str, max_owned: int) -> None:
        with self._lock:
            index = self._read_index()
            key = index_key(voice.owner, voice.name)
            if key in index:
                raise _exists(voice.name)
            _check_room(*self._counts_sync(voice.owner, index), max_owned, self.cfg.max_voices)
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
        return self._read(voice_id) if voice_id and VOICE_ID_RE.match(voice_id) else None

    def _find_name_sync(self, name_hash: str) -> list[StoredVoice]:
        index = self._read_index()
        voices = (self._read(index[k]) for k in _same_name_keys(index, name_hash) if VOICE_ID_RE.match(index[k]))
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


# KEYS: names hash, ids sorted set, the voice's key, the owner's ids sorted set, owners set.
# ARGV: index key, id, JSON, created_at, max voices, the owner's quota, owner tag.
_CREATE_LUA = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('ZCARD', KEYS[4]) >= tonumber(ARGV[6]) then return 3 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then return 2 end
redis.call('SET', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[2])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[2])
redis.call('SADD', KEYS[5], ARGV[7])
return 0
"""
# KEYS: names hash, ids sorted set, the voice's key, its owner's ids sorted set. ARGV: index key, id.
_DELETE_LUA = """
if redis.call('DEL', KEYS[3]) == 0 then return 0 end
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then redis.call('HDEL', KEYS[1], ARGV[1]) end
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""
# KEYS: the owner's ids sorted set, the voice's key. ARGV: id. One round trip, and another
# owner's id stops where a missing one does.
_GET_OWNED_LUA = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return redis.call('GET', KEYS[2]) end
return false
"""
# KEYS: anonymous's ids sorted set, ids sorted set, owners set, then one voice key per id.
# ARGV: anonymous's owner tag, then id, score, id, score... Voices stored before owners (in no
# owner's set) become anonymous's, if they still exist.
_ADOPT_LUA = """
redis.call('SADD', KEYS[3], ARGV[1])
local n = 0
for i = 2, #ARGV, 2 do
  if redis.call('EXISTS', KEYS[3 + i / 2]) == 1 and redis.call('ZSCORE', KEYS[2], ARGV[i]) then
    n = n + redis.call('ZADD', KEYS[1], ARGV[i + 1], ARGV[i])
  end
end
return n
"""


class RedisVoiceStore(VoiceStore):
    """``<prefix>:v:<id>`` (JSON), ``<prefix>:names`` (index key -> id), ``<prefix>:ids`` (every
    id by creation time), ``<prefix>:own:<owner tag>`` (an owner's ids by creation time: its
    count and its listing) and ``<prefix>:owners`` (the owner tags). No persistence of its own:
    configure the Redis server to keep its data.

    Voices stored before owners are in no owner's set: each store adopts them as anonymous's
    before its first operation (``_adopt_legacy``; idempotent, so every replica may)."""

    def __init__(self, cfg: VoiceStoreConfig):
        super().__init__(cfg)
        from redis.asyncio import Redis

        assert cfg.redis_url is not None
        self._redis = Redis.from_url(cfg.redis_url, socket_timeout=cfg.redis_timeout_s,
                                     socket_connect_timeout=cfg.redis_timeout_s)
        self._names = f"{cfg.redis_prefix}:names"
        self._ids = f"{cfg.redis_prefix}:ids"
        self._owners = f"{cfg.redis_prefix}:owners"
        self._create_script = self._redis.register_script(_CREATE_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)
        self._get_owned_script = self._redis.register_script(_GET_OWNED_LUA)
        self._adopt_script = self._redis.register_script(_ADOPT_LUA)
        self._adopted = False

    def _key(self, voice_id: str) -> str:
        assert VOICE_ID_RE.match(voice_id), voice_id
        return f"{self.cfg.redis_prefix}:v:{voice_id}"

    def _own(self, owner: str) -> str:
        return f"{self.cfg.redis_prefix}:own:{owner_tag(owner)}"

    async def _guard(self, fn, *args):
        async def adopted_first():
            if not self._adopted:
                await self._adopt_legacy()
                self._adopted = True
            return await fn(*args)

        return await super()._guard(adopted_first)

    async def _adopt_legacy(self) -> None:
        """Put the ids in no owner's set (voices stored before owners) into anonymous's."""
        scored = await self._redis.zrange(self._ids, 0, -1, withscores=True)
        if not scored:
            return
        owned: set[bytes] = set()
        for tag in await self._redis.smembers(self._owners):
            if re.fullmatch(rb"[0-9a-f]{16}", tag):
                owned.update(await self._redis.zrange(f"{self.cfg.redis_prefix}:own:{tag.decode()}", 0, -1))
        legacy = [(i.decode(), score) for i, score in scored if i not in owned and VOICE_ID_RE.match(i.decode())]
        for start in range(0, len(legacy), 500):
            batch = legacy[start:start + 500]
            keys = [self._own(ANONYMOUS), self._ids, self._owners, *(self._key(i) for i, _ in batch)]
            args = [owner_tag(ANONYMOUS), *(x for voice_id, score in batch for x in (voice_id, int(score)))]
            adopted = await self._adopt_script(keys=keys, args=args)
            if adopted:
                log.info("voice store: %d voices stored before owners are now %r's", adopted, ANONYMOUS)

    async def _counts(self, owner: str) -> tuple[int, int]:
        async with self._redis.pipeline(transaction=False) as pipe:
            owned, total = await pipe.zcard(self._own(owner)).zcard(self._ids).execute()
        return int(owned), int(total)

    async def _create(self, voice: StoredVoice, doc: str, max_owned: int) -> None:
        keys = [self._names, self._ids, self._key(voice.id), self._own(voice.owner), self._owners]
        # Scored by creation in microseconds: the list keeps creation order within a second.
        code = await self._create_script(keys=keys, args=[index_key(voice.owner, voice.name), voice.id, doc,
                                                          time.time_ns() // 1000, self.cfg.max_voices, max_owned,
                                                          owner_tag(voice.owner)])
        if code == 1:
            raise _exists(voice.name)
        if code == 3:
            raise _quota(max_owned)
        if code == 2:
            raise _full(self.cfg.max_voices)

    async def _get(self, voice_id: str, owner: Optional[str]) -> Optional[StoredVoice]:
        if owner is None:
            doc = await self._redis.get(self._key(voice_id))
        else:
            doc = await self._get_owned_script(keys=[self._own(owner), self._key(voice_id)], args=[voice_id])
        return StoredVoice.model_validate_json(doc) if doc else None

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        voice_id = await self._redis.hget(self._names, key)
        voice_id = voice_id.decode() if voice_id else ""
        return await self._get(voice_id, None) if VOICE_ID_RE.match(voice_id) else None

    async def _docs(self, ids: list[str]) -> list[StoredVoice]:
        ids = [i for i in ids if VOICE_ID_RE.match(i)]
        docs = await self._redis.mget([self._key(i) for i in ids]) if ids else []
        return [StoredVoice.model_validate_json(d) for d in docs if d is not None]

    async def _find_name(self, name_hash: str) -> list[StoredVoice]:
        found = {k.decode(): v.decode() async for k, v in self._redis.hscan_iter(self._names, match=f"*{name_hash}",
                                                                                  count=500)}
        return await self._docs([found[k] for k in _same_name_keys(found, name_hash)])

    async def _list(self, owner: Optional[str]) -> list[StoredVoice]:
        ids = await self._redis.zrange(self._ids if owner is None else self._own(owner), 0, -1)
        return await self._docs([i.decode() for i in ids])

    async def _delete(self, voice_id: str, owner: Optional[str]) -> bool:
        voice = await self._get(voice_id, owner)
        if voice is None:
            return False
        # An id's owner never changes (ids are never reused): checking it first is safe.
        keys = [self._names, self._ids, self._key(voice_id), self._own(voice.owner)]
        return bool(await self._delete_script(keys=keys, args=[index_key(voice.owner, voice.name), voice_id]))

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
    no store access) and the store's custom voices of the caller (``owner``: its key id; an
    admin's: every owner's), by id or by name."""

    def __init__(self, store: VoiceStore):
        self.store = store
        self.builtin = VoiceResolver()

    async def resolve(self, voice: Optional[str], owner: str, admin: bool = False) -> Voice:
        """The voice ``owner`` names (``admin``: any owner's custom voice, its own first by name);
        another owner's id or name is unknown exactly as a missing one is (404)."""
        voice = (voice or "").strip()
        if VOICE_ID_RE.match(voice):
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

    async def cards(self, owner: str, admin: bool = False) -> list[dict[str, Any]]:
        """``GET /v1/audio/voices``: the built-in voices, then ``owner``'s custom ones (an
        admin's: everyone's, each with its owner), oldest first."""
        builtin = [{"id": v["id"], "object": "voice", "name": v["id"], "kind": "builtin", "seed": v["seed"]}
                   for v in list_voices()]
        return builtin + [v.summary() for v in await self.store.list(owner, admin=admin)]


def stored_voice(name: str, kind: VoiceKind, owner: str = ANONYMOUS, **fields: Any) -> StoredVoice:
    return StoredVoice(id=new_voice_id(), name=name, owner=owner, kind=kind, created_at=int(time.time()), **fields)
