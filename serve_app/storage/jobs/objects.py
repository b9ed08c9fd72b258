"""Objects under a URL through fsspec (``Objects``): the few operations the job store needs, each
with the guarantee it relies on, whatever the filesystem.

- Object stores (``s3://`` and S3-compatible stores through ``storage_options``, ``gs://``, ...):
  an object written by one PUT (or a multipart upload, completed at once) is whole or absent, and
  an exclusive create (``If-None-Match: *``) fails when the key exists. The store must honour
  that condition: ``check_exclusive_create`` refuses one that does not.
- ``file://``: fsspec writes local files in place, so puts here go through a temporary file and a
  rename, and an exclusive create through a hard link (``directory.py``'s helpers).
- ``memory://``: one process (tests); fsspec's memory filesystem is not thread-safe, so every
  call holds one process-wide lock, which also makes its check-then-create atomic.

Keys are ``/``-separated and relative to the URL's path; they come from ``files.Place`` and the
store's own names, never from user input. Listings are never cached (another node writes).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Iterable, Optional

from .directory import create_exclusive, file_stat, write_atomic
from .model import FileStat

SPOOL_BYTES = 16 * 1024 * 1024  # a larger object is spooled to a local temporary file, then uploaded
SPOOL_FOLDER = "chattts-job-spool"  # in the node's temporary directory; each file named <pid>-...
_MEMORY_LOCK = threading.RLock()


def spool_dir() -> Path:
    return Path(tempfile.gettempdir()) / SPOOL_FOLDER


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def clean_spool(folder: Optional[Path] = None) -> int:
    """Remove the spool files of processes that are gone (a runner killed mid-upload leaves its
    file: the temporary file's own deletion never ran); how many. The runner calls it when it
    starts and at each sweep."""
    removed = 0
    for entry in (folder or spool_dir()).glob("*-*"):
        pid = entry.name.split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            entry.unlink(missing_ok=True)
            removed += 1
    return removed


@dataclass(frozen=True)
class Entry:
    name: str  # the last part of the key
    folder: bool
    size: int
    mtime: float


def _mtime(info: dict[str, Any]) -> float:
    """When an object was written, from whichever field its filesystem reports it in."""
    for field in ("mtime", "LastModified", "last_modified", "updated", "created", "timeCreated"):
        value = info.get(field)
        if isinstance(value, datetime):
            return value.timestamp()
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
            except ValueError:
                continue
    return 0.0


class Objects:
    """An object store (the generic case); ``open_objects`` picks the subclass for a URL."""

    def __init__(self, fs: Any, root: str, url: str):
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = url
        self._guard: contextlib.AbstractContextManager = contextlib.nullcontext()
        # s3fs asks an object's size (a HEAD) before it reads it whole, to read a large one in
        # parallel; the store reads small objects whole, and ranges of large ones: one GET each.
        self._read_options: dict[str, Any] = {"max_concurrency": 1} if "s3" in _protocols(fs) else {}

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    def _name(self, path: str) -> str:
        return path.rstrip("/").rsplit("/", 1)[-1]

    # ------------------------------------------------------------------ writes

    def put(self, key: str, pieces: Iterable[bytes]) -> int:
        """One object from ``pieces``: one PUT, or (past ``SPOOL_BYTES``) an upload of a local
        temporary file; either way the object appears whole when it completes."""
        buffer: Any = io.BytesIO()
        spool = None
        size = 0
        try:
            for piece in pieces:
                size += len(piece)
                if spool is None and size > SPOOL_BYTES:
                    folder = spool_dir()
                    folder.mkdir(mode=0o700, exist_ok=True)
                    spool = tempfile.NamedTemporaryFile(prefix=f"{os.getpid()}-", dir=folder)
                    spool.write(buffer.getvalue())
                    buffer = spool
                buffer.write(piece)
            with self._guard:
                if spool is None:
                    self.fs.pipe_file(self._path(key), buffer.getvalue())
                else:
                    spool.flush()
                    self.fs.put_file(spool.name, self._path(key))
        finally:
            if spool is not None:
                spool.close()
        return size

    def put_new(self, key: str, data: bytes) -> bool:
        """Create the object unless it exists; whether this call created it."""
        try:
            with self._guard:
                self.fs.pipe_file(self._path(key), data, mode="create")
            return True
        except FileExistsError:
            return False

    def delete(self, key: str) -> None:
        try:
            with self._guard:
                self.fs.rm_file(self._path(key))
        except FileNotFoundError:
            pass

    def delete_tree(self, key: str) -> None:
        try:
            with self._guard:
                self.fs.rm(self._path(key), recursive=True)
        except FileNotFoundError:
            pass

    # ------------------------------------------------------------------ reads

    def get(self, key: str) -> Optional[bytes]:
        try:
            with self._guard:
                return self.fs.cat_file(self._path(key), **self._read_options)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def get_many(self, keys: list[str]) -> dict[str, bytes]:
        """The objects of ``keys`` that exist (an object store fetches them concurrently)."""
        if not keys:
            return {}
        with self._guard:
            found = self.fs.cat_ranges(
                [self._path(k) for k in keys], None, None, on_error="return", **self._read_options
            )
        out: dict[str, bytes] = {}
        for key, data in zip(keys, found):
            if isinstance(data, bytes):
                out[key] = data
            elif not isinstance(data, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
                raise data  # the store failed: not a missing job
        return out

    def read_range(self, key: str, start: int, length: int) -> bytes:
        with self._guard:
            return self.fs.cat_file(self._path(key), start=start, end=start + length)

    def stat(self, key: str) -> Optional[FileStat]:
        try:
            with self._guard:
                info = self.fs.info(self._path(key))
        except FileNotFoundError:
            return None
        if info.get("type") != "file":
            return None
        size, when = int(info.get("size") or 0), _mtime(info)
        etag = str(info.get("ETag") or info.get("etag") or info.get("md5Hash") or "").strip('"')
        return FileStat(size=size, mtime=when, tag=f"{when}-{size}-{etag}")

    def exists(self, key: str) -> bool:
        return self.get(key) is not None  # one GET (an object store's HEAD of a missing key lists too)

    def ls(self, key: str) -> list[Entry]:
        """What is directly under ``key``; nothing when it does not exist."""
        try:
            with self._guard:
                infos = self.fs.ls(self._path(key), detail=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        own = self._path(key).rstrip("/")
        return [
            Entry(self._name(i["name"]), i.get("type") == "directory", int(i.get("size") or 0), _mtime(i))
            for i in infos
            if i["name"].rstrip("/") != own
        ]

    def newest(self, key: str) -> Optional[float]:
        """When the newest object under ``key`` was written; None when there is none."""
        try:
            with self._guard:
                infos = self.fs.find(self._path(key), detail=True)
        except FileNotFoundError:
            return None
        times = [_mtime(i) for i in infos.values() if i.get("type") == "file"]
        return max(times) if times else None

    def local_path(self, key: str) -> Optional[Path]:
        return None


def _protocols(fs: Any) -> tuple[str, ...]:
    return (fs.protocol,) if isinstance(fs.protocol, str) else tuple(fs.protocol)


class LocalObjects(Objects):
    """``file://``: local files, written through a temporary file and a rename."""

    def put(self, key: str, pieces: Iterable[bytes]) -> int:
        path = Path(self._path(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_atomic(path, pieces)

    def put_new(self, key: str, data: bytes) -> bool:
        path = Path(self._path(key))
        path.parent.mkdir(parents=True, exist_ok=True)
        return create_exclusive(path, data)

    def stat(self, key: str) -> Optional[FileStat]:
        return file_stat(Path(self._path(key)))

    def delete_tree(self, key: str) -> None:
        # A writer may add a file meanwhile (it takes it back itself): never fail a removal for it.
        path = Path(self._path(key))
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def local_path(self, key: str) -> Optional[Path]:
        path = Path(self._path(key))
        return path if path.is_file() else None


class MemoryObjects(Objects):
    """``memory://``: one process; every call holds one lock (fsspec's memory filesystem is a
    plain dict, not safe between threads)."""

    def __init__(self, fs: Any, root: str, url: str):
        super().__init__(fs, root, url)
        self._guard = _MEMORY_LOCK


def open_objects(url: str, storage_options: dict[str, Any]) -> Objects:
    """The objects under ``url`` (``storage_options``: the filesystem's own, e.g. an S3
    endpoint_url). A missing implementation says which package to install."""
    try:
        import fsspec
        from fsspec.implementations.local import LocalFileSystem
        from fsspec.implementations.memory import MemoryFileSystem
    except ImportError:
        raise RuntimeError("jobs backend 'fsspec' needs fsspec: pip install 'chattts-serve[s3]'") from None
    options = {**storage_options, "use_listings_cache": False}  # another node writes: never list from a cache
    try:
        fs, root = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        extra = " (pip install 'chattts-serve[s3]')" if url.startswith(("s3://", "s3a://")) else ""
        raise RuntimeError(f"jobs.url {url.split('://')[0]}:// needs a package that is missing{extra}: {exc}") from None
    if isinstance(fs, LocalFileSystem):
        Path(root).mkdir(parents=True, exist_ok=True)
        return LocalObjects(fs, root, url)
    if isinstance(fs, MemoryFileSystem):
        return MemoryObjects(fs, root, url)
    return Objects(fs, root, url)


def check_exclusive_create(objects: Objects, key: str) -> None:
    """Refuse a store that does not honour exclusive creates: the owner lock would not lock."""
    if not objects.put_new(key, b"1"):
        objects.delete(key)
        if not objects.put_new(key, b"1"):
            raise RuntimeError(f"{objects.url}: could not create a probe object")
    try:
        if objects.put_new(key, b"2"):
            raise RuntimeError(
                f"{objects.url}: the store ignores exclusive creates (If-None-Match: *); the job "
                "store's per-owner lock needs them (AWS S3 has them since August 2024), or keep "
                "job state in Redis (jobs.redis_url)"
            )
    finally:
        objects.delete(key)
