"""The ``redis`` backend of the voice store (``storage/records/redis_store.py``'s layout), and the
adoption of voices stored before voices had owners."""

from __future__ import annotations

import logging
import re

from ..records import ANONYMOUS, RedisRecords, owner_tag
from .store import VoiceStore

log = logging.getLogger(__name__)

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


class RedisVoiceStore(VoiceStore, RedisRecords):
    """``<prefix>:v:<id>`` (JSON), ``<prefix>:names`` (index key -> id), ``<prefix>:ids``,
    ``<prefix>:own:<owner tag>`` and ``<prefix>:owners`` (the owner tags).

    Voices stored before owners are in no owner's set: each store adopts them as anonymous's
    before its first operation (``_adopt_legacy``; idempotent, so every replica may)."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self._adopt_script = self._redis.register_script(_ADOPT_LUA)
        self._adopted = False

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
                owned.update(await self._redis.zrange(self._own_tagged(tag.decode()), 0, -1))
        legacy = [
            (i.decode(), score) for i, score in scored if i not in owned and self.kind.id_re.fullmatch(i.decode())
        ]
        for start in range(0, len(legacy), 500):
            batch = legacy[start : start + 500]
            keys = [self._own(ANONYMOUS), self._ids, self._owners, *(self._key(i) for i, _ in batch)]
            args = [owner_tag(ANONYMOUS), *(x for voice_id, score in batch for x in (voice_id, int(score)))]
            adopted = await self._adopt_script(keys=keys, args=args)
            if adopted:
                log.info("voice store: %d voices stored before owners are now %r's", adopted, ANONYMOUS)
