"""The owner-scoped record store (``OwnedStore``): what every backend of every kind does the same
way, and its one-process backend (``MemoryRecords``).

A kind's store (``VoiceStore``, ``LexiconStore``) subclasses ``OwnedStore`` with its ``kind``,
its limits and its pointer; a backend (``MemoryRecords``, ``DirectoryRecords``, ``RedisRecords``)
subclasses it with the primitives below. A concrete store is both: ``class
MemoryVoiceStore(VoiceStore, MemoryRecords)``.

The backends hand back documents as stored (text); ``OwnedStore`` parses them, never on the event
loop: in the store's own bounded workers (``StoreWorkers``), not the default thread pool every
request of the replica shares, and each document once while it is unchanged (``ParsedRecords``:
a lexicon of 500 pinyin entries is ~5 ms of pydantic). Lookups on the speech path (one record by
id or pointer) and bulk work (listings, an upload's parsing) have workers of their own, so a flood
of listings never delays a request's voice or lexicon."""

from __future__ import annotations

import asyncio
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Optional, TypeVar

from ...callers import ANONYMOUS
from ...errors import APIError
from .kind import RecordKind

T = TypeVar("T")
Doc = Any  # a document as its backend stores it: str, or bytes from Redis
LOOKUP_WORKERS = 2  # one record at a time, on every request that names a stored voice or lexicon
BULK_WORKERS = 2  # listings, an upload's parsing: what a flood of them costs waits here
PARSED_BYTES = 8 * 1024 * 1024  # documents kept parsed, by their stored size (a lexicon is at most ~0.3 MB)


class StoreWorkers:
    """A store's threads for blocking work (file I/O, parsing): ``lookup`` for one record,
    ``bulk`` for many; each a fixed number of threads (what waits, waits in its queue, off the
    loop)."""

    def __init__(self, name: str):
        self._name = name
        self._pools: dict[str, ThreadPoolExecutor] = {}
        self._lock = threading.Lock()

    def _pool(self, which: str) -> ThreadPoolExecutor:
        pool = self._pools.get(which)
        if pool is None:
            with self._lock:
                pool = self._pools.get(which)
                if pool is None:
                    workers = LOOKUP_WORKERS if which == "lookup" else BULK_WORKERS
                    pool = ThreadPoolExecutor(workers, thread_name_prefix=f"{self._name}-{which}")
                    self._pools[which] = pool
        return pool

    async def lookup(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool("lookup"), fn, *args)

    async def bulk(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool("bulk"), fn, *args)

    def shutdown(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False)
        self._pools.clear()


def _as_bytes(doc: Doc) -> bytes:
    return doc.encode() if isinstance(doc, str) else doc


class ParsedRecords:
    """Documents parsed before, by id, while the stored text is the same (ids are never reused and
    a record never changes under its id; comparing the text keeps even that assumption out):
    the least recently used go past ``max_bytes`` of stored text. Thread-safe."""

    def __init__(self, parse: Callable[[Doc], Any], max_bytes: int = PARSED_BYTES):
        self._parse = parse
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, tuple[Doc, Any]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def known(self, record_id: str, doc: Doc) -> Optional[Any]:
        doc = _as_bytes(doc)
        with self._lock:
            hit = self._items.get(record_id)
            if hit is None or hit[0] != doc:
                return None
            self._items.move_to_end(record_id)
            return hit[1]

    def parse(self, record_id: str, doc: Doc) -> Any:
        """``doc`` parsed (blocking: in a worker)."""
        found = self.known(record_id, doc)
        if found is not None:
            return found
        record = self._parse(doc)
        self.remember(record_id, doc, record)
        return record

    def remember(self, record_id: str, doc: Doc, record: Any) -> None:
        """``record`` as ``doc`` parses (a record just stored: its document needs no parsing)."""
        doc = _as_bytes(doc)
        if len(doc) <= self.max_bytes:
            with self._lock:
                old = self._items.pop(record_id, None)
                self._bytes += len(doc) - (len(old[0]) if old else 0)
                self._items[record_id] = (doc, record)
                while self._bytes > self.max_bytes:
                    _, (gone, _) = self._items.popitem(last=False)
                    self._bytes -= len(gone)

    def forget(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def parse_all(self, docs: list[tuple[str, Doc]]) -> list:
        return [self.parse(i, d) for i, d in docs]


class OwnedStore(ABC):
    """Every read and delete takes ``owner`` (whose records it may find) and ``admin`` (every
    owner's); another owner's id reads, and is refused, exactly as a missing one. The backends'
    primitives take ``owner=None`` for "any owner". A backend failure is the kind's 503."""

    kind: RecordKind

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.workers = StoreWorkers(f"{self.kind.noun}-store")
        self.parsed = ParsedRecords(self.kind.parse)

    # ------------------------------------------------------------------ the kind's part

    @abstractmethod
    def limits(self) -> tuple[int, int]:
        """(records one owner holds at most unless its key grants another number, records the
        store holds at most: every owner's together)."""

    @property
    def max_total(self) -> int:
        return self.limits()[1]

    def pointer(self, record: Any) -> Optional[str]:
        """The pointer field ``record`` sets when it is made (None: none)."""
        return None

    def directory(self) -> Path:
        """The directory backend's directory."""
        raise NotImplementedError

    def _check_doc(self, doc: str) -> None:  # noqa: B027 - a hook: most kinds take any size
        """Refuse a document before it is written (a kind's size limit)."""

    async def _present(self, found: list) -> list:
        """Records as callers see them (a lexicon's ``default`` as its owner's pointer says)."""
        return found

    # ------------------------------------------------------------------ the API

    def owned_limit(self, max_owned: Optional[int]) -> int:
        """An owner's quota: its key's grant, else the store's default."""
        return self.limits()[0] if max_owned is None else max_owned

    async def check_room(self, owner: str, max_owned: Optional[int] = None) -> None:
        """409 when ``owner`` holds its quota already or the store is full: checked before any
        costly work; ``create`` checks again, atomically with the write."""
        owned, total = await self._guard(self._counts, owner)
        self.kind.check_room(owned, total, self.owned_limit(max_owned), self.max_total)

    async def create(self, record: Any, max_owned: Optional[int] = None) -> Any:
        """Store a new record for ``record.owner``; 409 when a unique pointer is taken, the owner
        holds its quota (``max_owned``, None: the kind's default) or the store is full; 503 when the
        backend fails."""
        doc = await self.workers.bulk(record.to_json)
        self._check_doc(doc)
        await self._guard(self._create, record, doc, self.owned_limit(max_owned))
        self.parsed.remember(record.id, doc, record)
        return record

    async def get(self, record_id: str, owner: str = ANONYMOUS, admin: bool = False, present: bool = True) -> Any:
        """``owner``'s record with this id (an admin: anyone's); another owner's reads as None, by
        the same path as a missing one. ``present``: as callers see it (``_present``), else as
        stored (a request that needs only its content)."""
        if not self.kind.id_re.fullmatch(record_id or ""):
            return None
        doc = await self._guard(self._get, record_id, None if admin else owner)
        found = await self._parse_one(record_id, doc) if doc is not None else None
        if found is None or not (admin or found.owner == owner):
            return None
        return (await self._present([found]))[0] if present else found

    async def list(self, owner: str = ANONYMOUS, admin: bool = False) -> list:
        """``owner``'s records (an admin: everyone's), oldest first."""
        found = await self._parse_many(await self._guard(self._list, None if admin else owner))
        if not admin:
            found = [x for x in found if x.owner == owner]
        found = await self._present(found)
        return sorted(found, key=lambda x: x.created_at)  # stable: the backend's order within a second

    async def delete(self, record_id: str, owner: str = ANONYMOUS, admin: bool = False) -> bool:
        """Delete ``owner``'s record (an admin: anyone's); False for another owner's, as for a
        missing one."""
        if not self.kind.id_re.fullmatch(record_id or ""):
            return False
        return await self._guard(self._delete, record_id, None if admin else owner)

    async def pointed(self, field: str, owner: Optional[str] = None) -> Optional[Any]:
        """The record ``field`` points at (``owner``'s only; None: any owner's, the caller checks
        whose)."""
        found = await self._guard(self._get_pointed, field, owner)
        return await self._parse_one(*found) if found is not None else None

    async def pointed_by_suffix(self, suffix: str) -> list:
        """Every record a field ending in ``suffix`` points at (every owner's)."""
        found = await self._guard(self._pointers_ending, suffix)
        ids = [i for i in found.values() if self.kind.id_re.fullmatch(i)]
        return await self._parse_many(await self._guard(self._read_many, ids)) if ids else []

    async def close(self) -> None:
        self.workers.shutdown()

    async def _guard(self, fn, *args):
        try:
            return await fn(*args)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - disk or network trouble: the caller gets a 503 (507: no room)
            raise self.kind.failed(exc) from None

    async def _parse_one(self, record_id: str, doc: Doc) -> Any:
        """A stored document as its record: parsed before (the same text), or parsed in a lookup
        worker."""
        known = self.parsed.known(record_id, doc)
        return known if known is not None else await self.workers.lookup(self.parsed.parse, record_id, doc)

    async def _parse_many(self, docs: list[tuple[str, Doc]]) -> list:
        """Stored documents as records, in a bulk worker (unless each was parsed before)."""
        known = [self.parsed.known(i, d) for i, d in docs]
        if all(x is not None for x in known):
            return known
        return await self.workers.bulk(self.parsed.parse_all, docs)

    # ------------------------------------------------------------------ the backend's part

    @abstractmethod
    async def _counts(self, owner: str) -> tuple[int, int]:
        """(records ``owner`` holds, records in the store)."""

    @abstractmethod
    async def _create(self, record: Any, doc: str, max_owned: int) -> None:
        """Atomically: a unique pointer's check, the owner's quota, the store's limit, the write
        and the pointer."""

    @abstractmethod
    async def _get(self, record_id: str, owner: Optional[str]) -> Optional[Doc]:
        """The record's document if it exists and ``owner`` (None: anyone) owns it; the owner is
        checked before the document is read, so another owner's id costs what a missing one does."""

    @abstractmethod
    async def _read_many(self, ids: list[str]) -> list[tuple[str, Doc]]:
        """(id, document) of the records with these (checked) ids that exist, in that order."""

    @abstractmethod
    async def _list(self, owner: Optional[str]) -> list[tuple[str, Doc]]:
        """(id, document) of ``owner``'s records (None: everyone's) in creation order."""

    @abstractmethod
    async def _delete(self, record_id: str, owner: Optional[str]) -> bool:
        """Delete it and every pointer at it."""

    @abstractmethod
    async def _pointed(self, field: str) -> Optional[str]:
        """The id ``field`` points at."""

    @abstractmethod
    async def _pointers_ending(self, suffix: str) -> dict[str, str]:
        """Every pointer (field -> id) whose field ends in ``suffix``."""

    async def _pointed_many(self, fields: list[str]) -> dict[str, Optional[str]]:
        """The id each of ``fields`` points at (None: none), in one read where the backend can."""
        return {f: await self._pointed(f) for f in fields}

    async def _get_pointed(self, field: str, owner: Optional[str]) -> Optional[tuple[str, Doc]]:
        """(id, document) of the record ``field`` points at, if ``owner`` (None: anyone) owns it."""
        record_id = await self._pointed(field)
        if not record_id or not self.kind.id_re.fullmatch(record_id):
            return None
        doc = await self._get(record_id, owner)
        return (record_id, doc) if doc is not None else None


class MemoryRecords(OwnedStore):
    """One process's records (tests, one replica that may forget them on restart). Each method
    runs without awaiting in between: atomic on the replica's event loop."""

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self._docs: dict[str, str] = {}  # id -> JSON (a copy, as the other backends keep)
        self._owned: dict[str, dict[str, None]] = {}  # owner -> its ids, in creation order
        self._owner_of: dict[str, str] = {}  # id -> its owner
        self._pointers: dict[str, str] = {}  # field -> id

    async def _counts(self, owner: str) -> tuple[int, int]:
        return len(self._owned.get(owner, ())), len(self._docs)

    async def _create(self, record: Any, doc: str, max_owned: int) -> None:
        field = self.pointer(record)
        if field is not None and self.kind.unique_pointers and field in self._pointers:
            raise self.kind.taken(record)
        self.kind.check_room(len(self._owned.get(record.owner, ())), len(self._docs), max_owned, self.max_total)
        self._docs[record.id] = doc
        self._owned.setdefault(record.owner, {})[record.id] = None
        self._owner_of[record.id] = record.owner
        if field is not None:
            self._pointers[field] = record.id

    async def _get(self, record_id: str, owner: Optional[str]) -> Optional[Doc]:
        if owner is not None and record_id not in self._owned.get(owner, ()):
            return None
        return self._docs.get(record_id)

    async def _read_many(self, ids: list[str]) -> list[tuple[str, Doc]]:
        return [(i, self._docs[i]) for i in ids if i in self._docs]

    async def _list(self, owner: Optional[str]) -> list[tuple[str, Doc]]:
        return await self._read_many(list(self._docs if owner is None else self._owned.get(owner, {})))

    async def _delete(self, record_id: str, owner: Optional[str]) -> bool:
        if await self._get(record_id, owner) is None:
            return False
        del self._docs[record_id]
        self._owned.get(self._owner_of.pop(record_id, ""), {}).pop(record_id, None)
        self._pointers = {k: v for k, v in self._pointers.items() if v != record_id}
        return True

    async def _pointed(self, field: str) -> Optional[str]:
        return self._pointers.get(field)

    async def _pointers_ending(self, suffix: str) -> dict[str, str]:
        return {k: v for k, v in self._pointers.items() if k.endswith(suffix)}

    async def _pointed_many(self, fields: list[str]) -> dict[str, Optional[str]]:
        return {f: self._pointers.get(f) for f in fields}
