"""The ``redis`` backend: lexicons shared by every node; creating and deleting are Lua scripts."""

from __future__ import annotations

import time
from typing import Optional

from ...settings import LexiconStoreConfig
from ..voices.model import owner_tag
from .model import LEXICON_ID_RE, StoredLexicon, check_room
from .store import LexiconStore

# KEYS: ids sorted set, the lexicon's key, the owner's ids sorted set, the defaults hash.
# ARGV: id, JSON, created_at, max lexicons, the owner's quota, owner tag, "1" when it is the default.
_CREATE_LUA = """
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then return 3 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 2 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
if ARGV[7] == '1' then redis.call('HSET', KEYS[4], ARGV[6], ARGV[1]) end
return 0
"""
# KEYS: ids sorted set, the lexicon's key, its owner's ids sorted set, the defaults hash.
# ARGV: id, owner tag.
_DELETE_LUA = """
if redis.call('ZSCORE', KEYS[3], ARGV[1]) == false then return 0 end
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[4], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[4], ARGV[2]) end
return 1
"""
# KEYS: the owner's ids sorted set, the lexicon's key. ARGV: id. Another owner's id stops where
# a missing one does.
_GET_OWNED_LUA = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return redis.call('GET', KEYS[2]) end
return false
"""


class RedisLexiconStore(LexiconStore):
    """``<prefix>:l:<id>`` (JSON), ``<prefix>:ids`` (every id by creation time),
    ``<prefix>:own:<owner tag>`` (an owner's ids by creation time) and ``<prefix>:defaults``
    (owner tag -> its default lexicon's id)."""

    def __init__(self, cfg: LexiconStoreConfig):
        super().__init__(cfg)
        from redis.asyncio import Redis

        assert cfg.redis_url is not None
        self._redis = Redis.from_url(
            cfg.redis_url, socket_timeout=cfg.redis_timeout_s, socket_connect_timeout=cfg.redis_timeout_s
        )
        self._ids = f"{cfg.redis_prefix}:ids"
        self._defaults = f"{cfg.redis_prefix}:defaults"
        self._create_script = self._redis.register_script(_CREATE_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)
        self._get_owned_script = self._redis.register_script(_GET_OWNED_LUA)

    def _key(self, lexicon_id: str) -> str:
        if not LEXICON_ID_RE.fullmatch(lexicon_id):
            raise ValueError(f"not a lexicon id: {lexicon_id[:64]!r}")
        return f"{self.cfg.redis_prefix}:l:{lexicon_id}"

    def _own(self, owner: str) -> str:
        return f"{self.cfg.redis_prefix}:own:{owner_tag(owner)}"

    async def _create(self, lexicon: StoredLexicon, doc: str) -> None:
        cfg = self.cfg
        code = await self._create_script(
            keys=[self._ids, self._key(lexicon.id), self._own(lexicon.owner), self._defaults],
            args=[
                lexicon.id,
                doc,
                time.time_ns() // 1000,  # creation order within a second
                cfg.max_lexicons,
                cfg.max_lexicons_per_key,
                owner_tag(lexicon.owner),
                "1" if lexicon.default else "0",
            ],
        )
        if code == 3:
            check_room(cfg.max_lexicons_per_key, 0, cfg.max_lexicons_per_key, cfg.max_lexicons)
        if code == 2:
            check_room(0, cfg.max_lexicons, cfg.max_lexicons_per_key, cfg.max_lexicons)

    async def _get(self, lexicon_id: str, owner: Optional[str]) -> Optional[StoredLexicon]:
        if owner is None:
            doc = await self._redis.get(self._key(lexicon_id))
        else:
            doc = await self._get_owned_script(keys=[self._own(owner), self._key(lexicon_id)], args=[lexicon_id])
        return StoredLexicon.model_validate_json(doc) if doc else None

    async def _default_id(self, owner: str) -> Optional[str]:
        found = await self._redis.hget(self._defaults, owner_tag(owner))
        return found.decode() if found else None

    async def _list(self, owner: Optional[str]) -> list[StoredLexicon]:
        ids = [i.decode() for i in await self._redis.zrange(self._ids if owner is None else self._own(owner), 0, -1)]
        ids = [i for i in ids if LEXICON_ID_RE.fullmatch(i)]
        docs = await self._redis.mget([self._key(i) for i in ids]) if ids else []
        return [StoredLexicon.model_validate_json(d) for d in docs if d is not None]

    async def _delete(self, lexicon_id: str, owner: Optional[str]) -> bool:
        found = await self._get(lexicon_id, owner)
        if found is None:
            return False
        keys = [self._ids, self._key(lexicon_id), self._own(found.owner), self._defaults]
        return bool(await self._delete_script(keys=keys, args=[lexicon_id, owner_tag(found.owner)]))

    async def close(self) -> None:
        await self._redis.aclose()
