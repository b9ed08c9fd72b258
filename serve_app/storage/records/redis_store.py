"""The ``redis`` backend: records shared by every node; creating and deleting are Lua scripts, so a
unique pointer's check, the owner's quota, the store's limit and the write are one step.

    <prefix>:<letter>:<id>     the record's JSON
    <prefix>:ids               every id, scored by creation (microseconds: the order within a second)
    <prefix>:own:<owner tag>   an owner's ids, scored the same (its count, its listing)
    <prefix>:<pointer hash>    field -> id (a voice's name, an owner's default lexicon)
    <prefix>:owners            every owner's tag (kinds with ``track_owners``)

No persistence of its own: configure the Redis server to keep its data."""

from __future__ import annotations

import time
from typing import Any, Optional

from ..redis_client import open_redis
from .kind import owner_tag
from .store import Doc, OwnedStore

# KEYS: ids, the record's key, the owner's ids, the pointers hash[, the owners set].
# ARGV: id, JSON, created_at, max records, the owner's quota, pointer field ("": none), "1" when
# the pointer is unique, owner tag. Returns 0, or 1 (pointer taken), 3 (quota), 2 (store full).
_CREATE_LUA = """
if ARGV[6] ~= '' and ARGV[7] == '1' and redis.call('HEXISTS', KEYS[4], ARGV[6]) == 1 then return 1 end
if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[5]) then return 3 end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[4]) then return 2 end
redis.call('SET', KEYS[2], ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[4], ARGV[6], ARGV[1]) end
if #KEYS >= 5 then redis.call('SADD', KEYS[5], ARGV[8]) end
return 0
"""
# KEYS: ids, the record's key, its owner's ids, the pointers hash. ARGV: id, its pointer field ("": none).
_DELETE_LUA = """
if redis.call('DEL', KEYS[2]) == 0 then return 0 end
if ARGV[2] ~= '' and redis.call('HGET', KEYS[4], ARGV[2]) == ARGV[1] then redis.call('HDEL', KEYS[4], ARGV[2]) end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"""
# KEYS: the owner's ids sorted set, the record's key. ARGV: id. One round trip, and another
# owner's id stops where a missing one does (the job states use it too).
GET_OWNED_LUA = """
if redis.call('ZSCORE', KEYS[1], ARGV[1]) then return redis.call('GET', KEYS[2]) end
return false
"""


class RedisRecords(OwnedStore):
    def __init__(self, cfg: Any):
        super().__init__(cfg)
        if cfg.redis_url is None:
            raise ValueError(f"the {self.kind.noun} store's redis backend needs redis_url")
        self._redis = open_redis(cfg.redis_url, cfg.redis_timeout_s)
        self._prefix = cfg.redis_prefix
        self._ids = f"{self._prefix}:ids"
        self._pointers = f"{self._prefix}:{self.kind.pointer_hash}"
        self._owners = f"{self._prefix}:owners"
        self._create_script = self._redis.register_script(_CREATE_LUA)
        self._delete_script = self._redis.register_script(_DELETE_LUA)
        self._get_owned_script = self._redis.register_script(GET_OWNED_LUA)

    def _key(self, record_id: str) -> str:
        return f"{self._prefix}:{self.kind.key_letter}:{self.kind.check_id(record_id)}"

    def _own(self, owner: str) -> str:
        return self._own_tagged(owner_tag(owner))

    def _own_tagged(self, tag: str) -> str:
        return f"{self._prefix}:own:{tag}"

    async def _counts(self, owner: str) -> tuple[int, int]:
        async with self._redis.pipeline(transaction=False) as pipe:
            owned, total = await pipe.zcard(self._own(owner)).zcard(self._ids).execute()
        return int(owned), int(total)

    async def _create(self, record: Any, doc: str, max_owned: int) -> None:
        field = self.pointer(record)
        keys = [self._ids, self._key(record.id), self._own(record.owner), self._pointers]
        if self.kind.track_owners:
            keys.append(self._owners)
        args = [
            record.id,
            doc,
            time.time_ns() // 1000,
            self.max_total,
            max_owned,
            field or "",
            "1" if self.kind.unique_pointers else "0",
            owner_tag(record.owner),
        ]
        code = await self._create_script(keys=keys, args=args)
        if code == 1:
            raise self.kind.taken(record)
        if code == 3:
            raise self.kind.quota_reached(max_owned)
        if code == 2:
            raise self.kind.store_full(self.max_total)

    async def _get(self, record_id: str, owner: Optional[str]) -> Optional[Doc]:
        if owner is None:
            doc = await self._redis.get(self._key(record_id))
        else:
            doc = await self._get_owned_script(keys=[self._own(owner), self._key(record_id)], args=[record_id])
        return doc or None

    async def _read_many(self, ids: list[str]) -> list[tuple[str, Doc]]:
        ids = [i for i in ids if self.kind.id_re.fullmatch(i)]
        docs = await self._redis.mget([self._key(i) for i in ids]) if ids else []
        return [(i, d) for i, d in zip(ids, docs) if d is not None]

    async def _list(self, owner: Optional[str]) -> list[tuple[str, Doc]]:
        ids = await self._redis.zrange(self._ids if owner is None else self._own(owner), 0, -1)
        return await self._read_many([i.decode() for i in ids])

    async def _delete(self, record_id: str, owner: Optional[str]) -> bool:
        doc = await self._get(record_id, owner)
        if doc is None:
            return False
        found = await self._parse_one(record_id, doc)
        # An id's owner never changes (ids are never reused): checking it first is safe.
        keys = [self._ids, self._key(record_id), self._own(found.owner), self._pointers]
        return bool(await self._delete_script(keys=keys, args=[record_id, self.pointer(found) or ""]))

    async def _pointed(self, field: str) -> Optional[str]:
        found = await self._redis.hget(self._pointers, field)
        return found.decode() if found else None

    async def _pointed_many(self, fields: list[str]) -> dict[str, Optional[str]]:
        found = await self._redis.hmget(self._pointers, fields) if fields else []
        return {f: v.decode() if v else None for f, v in zip(fields, found)}

    async def _pointers_ending(self, suffix: str) -> dict[str, str]:
        return {
            k.decode(): v.decode()
            async for k, v in self._redis.hscan_iter(self._pointers, match=f"*{suffix}", count=500)
        }

    async def close(self) -> None:
        await self._redis.aclose()
        await super().close()
