"""The ``fsspec`` files: the directory layout as objects under a URL (``objects.py``).

    <url>/<owner tag>/<job id>/job.json, chunks.json, chunks/<k>.pcm, audio.<fmt>
         /<owner tag>/<job id>.gone      the job's removal marker (written first)
         /<owner tag>/.lock/<n>          the owner's lock (``object_lock.py``)
         /.active/<owner tag>.<job id>   the active jobs' index (when the state is kept here)

An object store has no rename, so a place cannot vanish at once as a directory does. A whole
object put is atomic, though, and that is what removal builds on: ``remove_place`` first creates
the ``.gone`` marker, then deletes the place's objects. Every ``put`` looks for the marker before
it writes (a deleted job costs no upload) and again after: a write that raced the removal deletes
what it wrote and fails (``JobGone``). Either the writer sees the marker, or its object existed
before the removal listed the place and went with it: nothing is left in both cases, and a
``job.json`` re-written by a late ``save`` is deleted again (it is readable for that moment only;
readers skip places with a marker). The sweep removes markers after ``STALE_TEMP_S``.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path
from typing import Iterable, Optional

from .files import JobFiles, Place
from .model import CHUNKS_FILE, JOB_ID_RE, OWNER_TAG_RE, STALE_TEMP_S, STATE_FILE, FileStat, JobGone, new_job_id
from .object_lock import ObjectLock
from .objects import Objects, check_exclusive_create

GONE = ".gone"
ACTIVE = ".active"
PROBES = ".probe"


class ObjectFiles(JobFiles):
    indexes_active = True  # a scan reads one listing, not every job's state

    def __init__(self, objects: Objects):
        self.objects = objects
        self.location = objects.url

    def check_exclusive_create(self) -> None:
        """Refuse a store whose exclusive create does not refuse (the owner lock needs it)."""
        check_exclusive_create(self.objects, f"{PROBES}/{new_job_id()}")

    def _gone(self, place: Place) -> str:
        return place.key() + GONE

    def _index_key(self, place: Place) -> str:
        return f"{ACTIVE}/{place.owner_tag}.{place.job_id}"

    # ------------------------------------------------------------------ places

    def make_place(self, place: Place, chunks_doc: bytes) -> None:
        self.objects.put(place.key(CHUNKS_FILE), [chunks_doc])

    def remove_place(self, place: Place) -> bool:
        first = self.objects.put_new(self._gone(place), b"")
        self.objects.delete_tree(place.key())
        self.index_remove(place)
        return first

    def removed(self, place: Place) -> bool:
        return self.objects.exists(self._gone(place))

    def owners(self) -> list[str]:
        return [e.name for e in self.objects.ls("") if e.folder and OWNER_TAG_RE.fullmatch(e.name)]

    def places(self, tag: str) -> list[Place]:
        entries = self.objects.ls(tag)
        gone = {e.name[: -len(GONE)] for e in entries if not e.folder and e.name.endswith(GONE)}
        return [Place(tag, e.name) for e in entries if e.folder and JOB_ID_RE.fullmatch(e.name) and e.name not in gone]

    def age(self, place: Place, now: float) -> float:
        return now - (self.objects.newest(place.key()) or 0.0)

    def owner_lock(self, tag: str) -> AbstractContextManager:
        if not OWNER_TAG_RE.fullmatch(tag):
            raise ValueError(f"not an owner tag: {tag[:40]!r}")
        return ObjectLock(self.objects, f"{tag}/.lock")

    # ------------------------------------------------------------------ files

    def put(self, place: Place, name: str, pieces: Iterable[bytes]) -> int:
        key = place.key(name)
        if self.removed(place):
            raise JobGone(place.job_id)
        size = self.objects.put(key, pieces)
        if self.removed(place):  # removed while we wrote: take ours back
            self.objects.delete(key)
            raise JobGone(place.job_id)
        return size

    def get(self, place: Place, name: str) -> Optional[bytes]:
        return self.objects.get(place.key(name))

    def get_many(self, places: list[Place], name: str) -> dict[Place, bytes]:
        keys = {p.key(name): p for p in places}
        return {keys[k]: data for k, data in self.objects.get_many(list(keys)).items()}

    def stat(self, place: Place, name: str) -> Optional[FileStat]:
        return self.objects.stat(place.key(name))

    def read_range(self, place: Place, name: str, start: int, length: int) -> bytes:
        return self.objects.read_range(place.key(name), start, length)

    def local_path(self, place: Place, name: str) -> Optional[Path]:
        return self.objects.local_path(place.key(name))

    def listing(self, place: Place, folder: str) -> dict[str, int]:
        found: dict[str, int] = {}
        for e in self.objects.ls(place.key(folder)):
            if e.folder:
                continue
            if e.name.startswith("."):  # a local file://'s temporary that a run left
                self.objects.delete(f"{place.key(folder)}/{e.name}")
            else:
                found[e.name] = e.size
        return found

    def clean_temporaries(self, place: Place) -> None:
        for folder in (place.key(), place.key("chapters")):
            for e in self.objects.ls(folder):
                if not e.folder and e.name.startswith("."):  # a local file://'s temporary
                    self.objects.delete(f"{folder}/{e.name}")

    def remove(self, place: Place, name: str) -> None:
        self.objects.delete_tree(place.key(name))

    def sweep(self, now: float) -> None:
        for tag in self.owners():
            for e in self.objects.ls(tag):
                job_id = e.name[: -len(GONE)]
                if (
                    not e.folder
                    and e.name.endswith(GONE)
                    and JOB_ID_RE.fullmatch(job_id)
                    and now - e.mtime > STALE_TEMP_S
                ):
                    place = Place(tag, job_id)
                    self.objects.delete_tree(place.key())  # what a writer that died mid-way left
                    self.objects.delete(self._gone(place))
        for e in self.objects.ls(ACTIVE):
            place = self._indexed_place(e.name)
            if place is None or (now - e.mtime > STALE_TEMP_S and not self.objects.exists(place.key(STATE_FILE))):
                self.objects.delete(f"{ACTIVE}/{e.name}")  # a creation that stopped before its state
        for e in self.objects.ls(PROBES):
            if now - e.mtime > STALE_TEMP_S:
                self.objects.delete(f"{PROBES}/{e.name}")

    # ------------------------------------------------------------------ the active index

    def index_add(self, place: Place) -> None:
        self.objects.put(self._index_key(place), [b""])

    def index_remove(self, place: Place) -> None:
        self.objects.delete(self._index_key(place))

    def indexed(self) -> list[Place]:
        places = (self._indexed_place(e.name) for e in self.objects.ls(ACTIVE) if not e.folder)
        return [p for p in places if p is not None]

    @staticmethod
    def _indexed_place(name: str) -> Optional[Place]:
        tag, _, job_id = name.partition(".")
        try:
            return Place(tag, job_id)
        except ValueError:
            return None
