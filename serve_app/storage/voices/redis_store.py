"""The ``redis`` backend: voices shared by every node; creating and deleting are Lua scripts."""

from __future__ import annotations

import logging
import re
import time
from typing import Optional

from ...settings import VoiceStoreConfig
from .model import (
    ANONYMOUS,
    VOICE_ID_RE,
    StoredVoice,
    index_key,
    name_taken,
    owner_tag,
    quota_reached,
    same_name_keys,
    store_full,
)
from .store import VoiceStore

log = logging.getLogger(__name__)

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
        self._redis = Redis.from_url(
            cfg.redis_url, socket_timeout=cfg.redis_timeout_s, socket_connect_timeout=cfg.redis_timeout_s
        )
        self._names = f"{cfg.redis_prefix}:names"
        self._ids = f"{cfg.redis_prefix}:ids"
        self._owners = f"{cfg.redis_prefix}:owners"
        self._create_script = self._redis.register_script(_CREATE_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)
        self._get_owned_script = self._redis.register_script(_GET_OWNED_LUA)
        self._adopt_script = self._redis.register_script(_ADOPT_LUA)
        self._adopted = False

    def _key(self, voice_id: str) -> str:
        if not VOICE_ID_RE.fullmatch(voice_id):  # a raise, not an assert (python -O)
            raise ValueError(f"not a voice id: {voice_id[:64]!r}")
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
        legacy = [(i.decode(), score) for i, score in scored if i not in owned and VOICE_ID_RE.fullmatch(i.decode())]
        for start in range(0, len(legacy), 500):
            batch = legacy[start : start + 500]
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
        code = await self._create_script(
            keys=keys,
            args=[
                index_key(voice.owner, voice.name),
                voice.id,
                doc,
                time.time_ns() // 1000,
                self.cfg.max_voices,
                max_owned,
                owner_tag(voice.owner),
            ],
        )
        if code == 1:
            raise name_taken(voice.name)
        if code == 3:
            raise quota_reached(max_owned)
        if code == 2:
            raise store_full(self.cfg.max_voices)

    async def _get(self, voice_id: str, owner: Optional[str]) -> Optional[StoredVoice]:
        if owner is None:
            doc = await self._redis.get(self._key(voice_id))
        else:
            doc = await self._get_owned_script(keys=[self._own(owner), self._key(voice_id)], args=[voice_id])
        return StoredVoice.model_validate_json(doc) if doc else None

    async def _get_by_name(self, key: str) -> Optional[StoredVoice]:
        voice_id = await self._redis.hget(self._names, key)
        voice_id = voice_id.decode() if voice_id else ""
        return await self._get(voice_id, None) if VOICE_ID_RE.fullmatch(voice_id) else None

    async def _docs(self, ids: list[str]) -> list[StoredVoice]:
        ids = [i for i in ids if VOICE_ID_RE.fullmatch(i)]
        docs = await self._redis.mget([self._key(i) for i in ids]) if ids else []
        return [StoredVoice.model_validate_json(d) for d in docs if d is not None]

    async def _find_name(self, name_hash: str) -> list[StoredVoice]:
        found = {
            k.decode(): v.decode()
            async for k, v in self._redis.hscan_iter(self._names, match=f"*{name_hash}", count=500)
        }
        return await self._docs([found[k] for k in same_name_keys(found, name_hash)])

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
