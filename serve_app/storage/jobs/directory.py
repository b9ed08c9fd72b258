"""The ``directory`` files: one directory per job under its owner's, on one host or a volume every
node of the Ingress replicas and the runner mounts at the same path.

    <root>/<owner tag>/.lock                  the owner's lock: quota check + create
    <root>/<owner tag>/<job id>/job.json      the state (rewritten whole after each chunk)
                               /chunks.json   the chunks (fixed at submission)
                               /chunks/<k>.pcm  each finished chunk's PCM
                               /audio.<fmt>   the final file (then the chunks go)
    <root>/.trash/                            deleted jobs on their way out

Every file is written to a temporary name in its directory, flushed and renamed into place, so a
reader (or a runner taking a job up after a crash) sees a file whole or not at all. A job's
directory is removed by a rename into ``.trash`` first: from then on every write into it fails
(``JobGone``) instead of re-creating anything, ``job.json`` included.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Iterable, Iterator, Optional

from .files import JobFiles, Place
from .model import (
    CHUNKS_FILE,
    JOB_ID_RE,
    LOCK_TIMEOUT_S,
    OWNER_TAG_RE,
    STALE_TEMP_S,
    FileStat,
    JobGone,
)

TEMP_PREFIX = ".tmp-"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _temporary(path: Path) -> tuple[int, str]:
    try:
        return tempfile.mkstemp(prefix=TEMP_PREFIX, dir=path.parent)
    except FileNotFoundError:
        raise JobGone(str(path.parent.name)) from None


def write_atomic(path: Path, pieces: Iterable[bytes]) -> int:
    """Write ``pieces`` to a temporary file beside ``path``, flush it to disk, rename it into
    place: readers see the old file or the new one, never a part. Its size. ``JobGone`` when
    the directory is gone (the job was deleted)."""
    fd, tmp = _temporary(path)
    size = 0
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
                size += len(piece)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except FileNotFoundError:
        Path(tmp).unlink(missing_ok=True)
        raise JobGone(str(path.parent.name)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return size


def create_exclusive(path: Path, data: bytes) -> bool:
    """Write ``path`` whole unless it exists (a temporary file hard-linked into place: the link
    fails if the name is taken, and a reader never sees a part). Whether this call made it."""
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        Path(tmp).unlink(missing_ok=True)


def file_stat(path: Path) -> Optional[FileStat]:
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    return FileStat(size=st.st_size, mtime=st.st_mtime, tag=f"{st.st_mtime_ns}-{st.st_size}-{st.st_ino}")


def read_range(path: Path, start: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(length)


def children(path: Path) -> Iterator[Path]:
    try:
        yield from path.iterdir()
    except (FileNotFoundError, NotADirectoryError):
        return


def mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except FileNotFoundError:
        return 0.0


class DirectoryFiles(JobFiles):
    def __init__(self, root: Path):
        from filelock import FileLock

        self._FileLock = FileLock
        self.root = Path(root).expanduser()
        self.root.mkdir(parents=True, exist_ok=True)
        self.trash = self.root / ".trash"
        self.trash.mkdir(exist_ok=True)
        self.location = str(self.root)

    def _dir(self, place: Place) -> Path:
        return self.root / place.key()

    def _path(self, place: Place, name: str) -> Path:
        return self.root / place.key(name)

    # ------------------------------------------------------------------ places

    def make_place(self, place: Place, chunks_doc: bytes) -> None:
        folder = self._dir(place)
        folder.mkdir(parents=True)
        write_atomic(folder / CHUNKS_FILE, [chunks_doc])
        _fsync_dir(folder)

    def remove_place(self, place: Place) -> bool:
        """Rename the place out of the way (atomic: from here on it is gone for every reader and
        every write into it fails), then delete it."""
        gone = self.trash / f"{place.job_id}-{os.urandom(6).hex()}"
        try:
            os.rename(self._dir(place), gone)
        except FileNotFoundError:
            return False
        shutil.rmtree(gone, ignore_errors=True)
        return True

    def removed(self, place: Place) -> bool:
        return False  # a removed place is renamed away at once: nothing of it is readable

    def owners(self) -> list[str]:
        return [p.name for p in children(self.root) if OWNER_TAG_RE.fullmatch(p.name) and p.is_dir()]

    def places(self, tag: str) -> list[Place]:
        return [Place(tag, p.name) for p in children(self.root / tag) if JOB_ID_RE.fullmatch(p.name)]

    def age(self, place: Place, now: float) -> float:
        return now - mtime(self._dir(place))

    def owner_lock(self, tag: str) -> AbstractContextManager:
        if not OWNER_TAG_RE.fullmatch(tag):
            raise ValueError(f"not an owner tag: {tag[:40]!r}")
        owner_dir = self.root / tag
        owner_dir.mkdir(exist_ok=True)
        return self._FileLock(str(owner_dir / ".lock"), timeout=LOCK_TIMEOUT_S)

    # ------------------------------------------------------------------ files

    def put(self, place: Place, name: str, pieces: Iterable[bytes]) -> int:
        path = self._path(place, name)
        folder = self._dir(place)
        for sub in reversed(path.parents):  # a folder of the place's own (never the place itself)
            if sub.is_relative_to(folder) and sub != folder:
                try:
                    sub.mkdir(exist_ok=True)
                except FileNotFoundError:
                    raise JobGone(place.job_id) from None
        return write_atomic(path, pieces)

    def get(self, place: Place, name: str) -> Optional[bytes]:
        try:
            return self._path(place, name).read_bytes()
        except (FileNotFoundError, NotADirectoryError):
            return None

    def stat(self, place: Place, name: str) -> Optional[FileStat]:
        return file_stat(self._path(place, name))

    def read_range(self, place: Place, name: str, start: int, length: int) -> bytes:
        return read_range(self._path(place, name), start, length)

    def local_path(self, place: Place, name: str) -> Optional[Path]:
        path = self._path(place, name)
        return path if path.is_file() else None

    def listing(self, place: Place, folder: str) -> dict[str, int]:
        if not self._dir(place).is_dir():
            raise JobGone(place.job_id)
        found: dict[str, int] = {}
        for p in children(self._path(place, folder)):
            if p.name.startswith(TEMP_PREFIX):
                p.unlink(missing_ok=True)  # a file a run was writing when it stopped
            elif p.is_file():
                found[p.name] = p.stat().st_size
        return found

    def clean_temporaries(self, place: Place) -> None:
        folder = self._dir(place)
        for sub in (folder, folder / "chapters"):
            for p in children(sub):
                if p.name.startswith(TEMP_PREFIX) and p.is_file():
                    p.unlink(missing_ok=True)

    def remove(self, place: Place, name: str) -> None:
        path = self._path(place, name)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)

    def sweep(self, now: float) -> None:
        for tag in self.owners():
            for entry in children(self.root / tag):
                # A creation by an older version that crashed before its rename into place.
                if entry.name.startswith(TEMP_PREFIX) and entry.is_dir() and now - mtime(entry) > STALE_TEMP_S:
                    shutil.rmtree(entry, ignore_errors=True)
        for entry in children(self.trash):
            shutil.rmtree(entry, ignore_errors=True)
