"""How the C heap of a model process gives memory back (glibc only; elsewhere nothing).

glibc raises its mmap threshold to the size of each large block freed (up to 32 MiB), so after
a few prefills and KV-buffer growths the tensors of a decode step come from the heap and its
arenas, which keep the freed pages: in-process at full size, 16 rows joining one by one peaked
at 1932 MiB and settled at 1663. A fixed threshold keeps large tensors in their own mappings,
returned when freed: 1629 and 1308 MiB, with no slower decode step (bench/README.md, "Measurements
behind code choices")."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Optional

_M_MMAP_THRESHOLD = -3  # malloc.h; setting it also turns off the dynamic threshold
_applied: Optional[int] = None
log = logging.getLogger(__name__)


def fix_mmap_threshold(threshold_bytes: Optional[int]) -> bool:
    """Set glibc's mmap threshold for this process (once; None leaves glibc's default). True when set."""
    global _applied
    if threshold_bytes is None or not sys.platform.startswith("linux"):
        return False
    if _applied == threshold_bytes:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, int(threshold_bytes)))
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        ok = False
    if ok:
        _applied = threshold_bytes
    else:
        log.warning("mallopt(M_MMAP_THRESHOLD) unavailable: the heap keeps glibc's dynamic threshold")
    return ok
