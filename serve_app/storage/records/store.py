"""The owner-scoped record store (``OwnedStore``): what every backend of every kind does the same
way, and its one-process backend (``MemoryRecords``).

A kind's store (``VoiceStore``, ``LexiconStore``) subclasses ``OwnedStore`` with its ``kind``,
its limits and its pointer; a backend (``MemoryRecords``, ``DirectoryRecords``, ``RedisRecords``)
subclasses it with the primitives below. A concrete store is both: ``class
MemoryVoiceStore(VoiceStore, MemoryRecords)``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Optional

from ...errors import APIError
from .kind import ANONYMOUS, RecordKind


class OwnedStore(ABC):
    """Every read and delete takes ``owner`` (whose records it may find) and ``admin`` (every
    owner's); another owner's id reads, and is refused, exactly as a missing one. The backends'
    primitives take ``owner=None`` for "any owner". A backend failure is the kind's 503."""

    kind: RecordKind

    def __init__(self, cfg: Any):
        self.cfg = cfg

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
        doc = record.to_json()
        self._check_doc(doc)
        await self._guard(self._create, record, doc, self.owned_limit(max_owned))
        return record

    async def get(self, record_id: str, owner: str = ANONYMOUS, admin: bool = False) -> Optional[Any]:
        """``owner``'s record with this id (an admin: anyone's); another owner's reads as None, by
        the same path as a missing one."""
        if not self.kind.id_re.fullmatch(record_id or ""):
            return None
        found = await self._guard(self._get, record_id, None if admin else owner)
        if found is None or not (admin or found.owner == owner):
            return None
        return (await self._present([found]))[0]

    async def list(self, owner: str = ANONYMOUS, admin: bool = False) -> list:
        """``owner``'s records (an admin: everyone's), oldest first."""
        found = await self._guard(self._list, None if admin else owner)
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

    async def pointed(self, field: str) -> Optional[Any]:
        """The record ``field`` points at (any owner's: the caller checks whose)."""
        record_id = await self._guard(self._pointed, field)
        if not record_id or not self.kind.id_re.fullmatch(record_id):
            return None
        return await self._guard(self._get, record_id, None)

    async def pointed_by_suffix(self, suffix: str) -> list:
        """Every record a field ending in ``suffix`` points at (every owner's)."""
        found = await self._guard(self._pointers_ending, suffix)
        ids = [i for i in found.values() if self.kind.id_re.fullmatch(i)]
        return await self._guard(self._read_many, ids) if ids else []

    async def close(self) -> None:
        return None

    async def _guard(self, fn, *args):
        try:
            return await fn(*args)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - disk or network trouble: the caller gets a 503
            raise self.kind.unavailable(exc) from None

    # ------------------------------------------------------------------ the backend's part

    @abstractmethod
    async def _counts(self, owner: str) -> tuple[int, int]:
        """(records ``owner`` holds, records in the store)."""

    @abstractmethod
    async def _create(self, record: Any, doc: str, max_owned: int) -> None:
        """Atomically: a unique pointer's check, the owner's quota, the store's limit, the write
        and the pointer."""

    @abstractmethod
    async def _get(self, record_id: str, owner: Optional[str]) -> Optional[Any]:
        """The record if it exists and ``owner`` (None: anyone) owns it; the owner is checked
        before the document is read, so another owner's id costs what a missing one does."""

    @abstractmethod
    async def _read_many(self, ids: list[str]) -> list:
        """The records with these (checked) ids that exist, in that order."""

    @abstractmethod
    async def _list(self, owner: Optional[str]) -> list:
        """``owner``'s records (None: everyone's) in creation order."""

    @abstractmethod
    async def _delete(self, record_id: str, owner: Optional[str]) -> bool:
        """Delete it and every pointer at it."""

    @abstractmethod
    async def _pointed(self, field: str) -> Optional[str]:
        """The id ``field`` points at."""

    @abstractmethod
    async def _pointers_ending(self, suffix: str) -> dict[str, str]:
        """Every pointer (field -> id) whose field ends in ``suffix``."""


class MemoryRecords(OwnedStore):
    """One process's records (tests, one replica that may forget them on restart). Each method
    runs without awaiting in between: atomic on the replica's event loop."""

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        self._docs: dict[str, str] = {}  # id -> JSON (a copy, as the other backends keep)
        self._owned: dict[str, dict[str, None]] = {}  # owner -> its ids, in creation order
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
        if field is not None:
            self._pointers[field] = record.id

    def _read(self, record_id: str) -> Optional[Any]:
        doc = self._docs.get(record_id)
        return self.kind.parse(doc) if doc is not None else None

    async def _get(self, record_id: str, owner: Optional[str]) -> Optional[Any]:
        if owner is not None and record_id not in self._owned.get(owner, ()):
            return None
        return self._read(record_id)

    async def _read_many(self, ids: list[str]) -> list:
        return [x for x in map(self._read, ids) if x is not None]

    async def _list(self, owner: Optional[str]) -> list:
        return await self._read_many(list(self._docs if owner is None else self._owned.get(owner, {})))

    async def _delete(self, record_id: str, owner: Optional[str]) -> bool:
        found = await self._get(record_id, owner)
        if found is None:
            return False
        del self._docs[record_id]
        self._owned.get(found.owner, {}).pop(record_id, None)
        self._pointers = {k: v for k, v in self._pointers.items() if v != record_id}
        return True

    async def _pointed(self, field: str) -> Optional[str]:
        return self._pointers.get(field)

    async def _pointers_ending(self, suffix: str) -> dict[str, str]:
        return {k: v for k, v in self._pointers.items() if k.endswith(suffix)}
