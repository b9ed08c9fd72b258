"""A small disk for the full-disk tests: a tmpfs of a given size mounted over a directory (root
only: mounting needs CAP_SYS_ADMIN; the tests skip, saying so, elsewhere), and a filler file that
takes its free space and gives it back."""

from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

PAGE = 4096  # tmpfs counts its space in pages


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


@contextlib.contextmanager
def small_disk(path: Path, size: int) -> Iterator[Path]:
    """``path`` (made if missing) with a tmpfs of ``size`` bytes over it until the block ends; what
    was there before shows again once it is unmounted."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a full disk needs a small tmpfs, and mounting one needs root (CAP_SYS_ADMIN)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"could not mount a small tmpfs (needs CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


class Filler:
    """A file on the small disk that takes all of its free space but ``leave`` bytes (whole pages)."""

    def __init__(self, disk: Path):
        self.path = disk / "filler"

    def fill(self, leave: int = 0) -> None:
        self.release()
        keep = -(-leave // PAGE) * PAGE
        size = free_bytes(self.path.parent) - keep
        fd = os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o644)
        try:
            if size > 0:
                os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
        assert free_bytes(self.path.parent) == keep, (free_bytes(self.path.parent), keep)

    def release(self) -> None:
        self.path.unlink(missing_ok=True)
