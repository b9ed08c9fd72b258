"""The ``directory`` backend: one JSON file per record plus an index, shared by the replicas of one
host. Every file is written to a temporary file and renamed into place (``write_atomic``), so
readers take no lock and never see part of a file; creating and deleting hold ``<dir>/.lock`` (a
file lock). File work runs in the store's workers (``StoreWorkers``), off the event loop: a
record's lookup reads the index once, listings run in the bulk workers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..files import write_atomic
from .kind import Index, owner_tag
from .store import Doc, OwnedStore


class DirectoryRecords(OwnedStore):
    """``<dir>/<id>.json`` per record and ``<dir>/<kind.index_file>`` (each kind keeps its own
    index layout: ``kind.read_index``/``kind.write_index``). A record exists while the index
    names it: the document is written before the index, and the index before the document goes.
    A write that fails (a full disk) leaves neither: the index as it was, no document beside it."""

    def __init__(self, cfg: Any):
        super().__init__(cfg)
        from filelock import FileLock

        self.root = self.directory()
        self.root.mkdir(parents=True, exist_ok=True)
        self._index = self.root / self.kind.index_file
        self._lock = FileLock(str(self.root / ".lock"), timeout=10)

    def _file(self, record_id: str) -> Path:
        return self.root / f"{self.kind.check_id(record_id)}.json"

    def _read_index(self) -> Index:
        try:
            raw = json.loads(self._index.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return Index()
        return self.kind.read_index(raw)

    def _write_index(self, index: Index) -> None:
        write_atomic(self._index, json.dumps(self.kind.write_index(index)))

    def _read(self, record_id: str) -> Optional[str]:
        try:
            return self._file(record_id).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    @staticmethod
    def _owns(index: Index, record_id: str, owner: Optional[str]) -> bool:
        tag = index.ids.get(record_id)
        return tag is not None and (owner is None or tag == owner_tag(owner))

    def _counts_sync(self, owner: str, index: Optional[Index] = None) -> tuple[int, int]:
        index = self._read_index() if index is None else index
        tag = owner_tag(owner)
        return sum(1 for t in index.ids.values() if t == tag), len(index.ids)

    def _create_sync(self, record: Any, doc: str, max_owned: int) -> None:
        field = self.pointer(record)
        with self._lock:
            index = self._read_index()
            if field is not None and self.kind.unique_pointers and field in index.pointers:
                raise self.kind.taken(record)
            self.kind.check_room(*self._counts_sync(record.owner, index), max_owned, self.max_total)
            path = self._file(record.id)
            write_atomic(path, doc)  # the document first: the index never points at nothing
            index.ids[record.id] = owner_tag(record.owner)
            if field is not None:
                index.pointers[field] = record.id
            try:
                self._write_index(index)
            except BaseException:
                path.unlink(missing_ok=True)  # not acknowledged: no document the index never named
                raise

    def _get_sync(self, record_id: str, owner: Optional[str]) -> Optional[str]:
        return self._read(record_id) if self._owns(self._read_index(), record_id, owner) else None

    def _read_many_sync(self, ids: list[str]) -> list[tuple[str, Doc]]:
        return [(i, d) for i in ids if (d := self._read(i)) is not None]

    def _list_sync(self, owner: Optional[str]) -> list[tuple[str, Doc]]:
        index = self._read_index()
        return self._read_many_sync(
            [i for i in index.ids if self._owns(index, i, owner) and self.kind.id_re.fullmatch(i)]
        )

    def _get_pointed_sync(self, field: str, owner: Optional[str]) -> Optional[tuple[str, Doc]]:
        index = self._read_index()  # once: the pointer and the owner from the same read
        record_id = index.pointers.get(field)
        if not record_id or not self.kind.id_re.fullmatch(record_id) or not self._owns(index, record_id, owner):
            return None
        doc = self._read(record_id)
        return (record_id, doc) if doc is not None else None

    def _delete_sync(self, record_id: str, owner: Optional[str]) -> bool:
        with self._lock:
            index = self._read_index()
            if not self._owns(index, record_id, owner) or not self._file(record_id).exists():
                return False
            del index.ids[record_id]
            index.pointers = {k: v for k, v in index.pointers.items() if v != record_id}
            self._write_index(index)  # the index first: nothing resolves to a gone file
            self._file(record_id).unlink(missing_ok=True)
            return True

    async def _counts(self, owner: str) -> tuple[int, int]:
        return await self.workers.lookup(self._counts_sync, owner)

    async def _create(self, record: Any, doc: str, max_owned: int) -> None:
        await self.workers.bulk(self._create_sync, record, doc, max_owned)

    async def _get(self, record_id: str, owner: Optional[str]) -> Optional[Doc]:
        return await self.workers.lookup(self._get_sync, record_id, owner)

    async def _read_many(self, ids: list[str]) -> list[tuple[str, Doc]]:
        return await self.workers.bulk(self._read_many_sync, ids)

    async def _list(self, owner: Optional[str]) -> list[tuple[str, Doc]]:
        return await self.workers.bulk(self._list_sync, owner)

    async def _delete(self, record_id: str, owner: Optional[str]) -> bool:
        return await self.workers.bulk(self._delete_sync, record_id, owner)

    async def _pointed(self, field: str) -> Optional[str]:
        index = await self.workers.lookup(self._read_index)
        return index.pointers.get(field)

    async def _pointed_many(self, fields: list[str]) -> dict[str, Optional[str]]:
        index = await self.workers.lookup(self._read_index)
        return {f: index.pointers.get(f) for f in fields}

    async def _get_pointed(self, field: str, owner: Optional[str]) -> Optional[tuple[str, Doc]]:
        return await self.workers.lookup(self._get_pointed_sync, field, owner)

    async def _pointers_ending(self, suffix: str) -> dict[str, str]:
        index = await self.workers.lookup(self._read_index)
        return {k: v for k, v in index.pointers.items() if k.endswith(suffix)}
