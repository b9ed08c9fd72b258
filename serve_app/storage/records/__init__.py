"""Owner-scoped records: the one store pattern voices and lexicons share.

A record is one JSON document under a generated id, owned by an API key id (or ``anonymous``).
Every read takes the owner: another owner's id reads exactly as a missing one; an admin reads
every owner's. Each owner holds at most its quota, the store at most its limit, both checked
atomically with the write. A record may set a pointer (a field naming it: a voice's name, unique
per owner; an owner's default lexicon, the newest wins).

- ``kind.py``: ``RecordKind`` (a kind's id, model, layout names and errors), the owners.
- ``store.py``: ``OwnedStore`` (the API every backend shares) and ``MemoryRecords`` (one process).
- ``directory.py``: ``DirectoryRecords`` (a file per record, an index, atomic renames, a file lock).
- ``redis_store.py``: ``RedisRecords`` (Lua scripts; the client from ``storage/redis_client.py``).

A kind subclasses ``OwnedStore`` with its rules; its backends are that class and a backend
together (``class RedisVoiceStore(VoiceStore, RedisRecords)``).
"""

from ...callers import ANONYMOUS
from .directory import DirectoryRecords
from .kind import MAX_OWNER_CHARS, Index, RecordKind, owner_tag
from .redis_store import GET_OWNED_LUA, RedisRecords
from .store import MemoryRecords, OwnedStore

__all__ = [
    "ANONYMOUS",
    "GET_OWNED_LUA",
    "MAX_OWNER_CHARS",
    "DirectoryRecords",
    "Index",
    "MemoryRecords",
    "OwnedStore",
    "RecordKind",
    "RedisRecords",
    "owner_tag",
]
