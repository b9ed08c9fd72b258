"""engine/heap.py: a fixed mmap threshold gives freed large blocks back to the system."""

from __future__ import annotations

import subprocess
import sys

import pytest

from serve_app.engine.config import ModelConfig

_RETAINED = r"""
import ctypes, sys
from serve_app.engine.heap import fix_mmap_threshold
if sys.argv[1] == "fixed":
    assert fix_mmap_threshold(1 << 20) and fix_mmap_threshold(1 << 20)  # once, then a no-op
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss_mib():
    return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0]) / 1024
big = libc.malloc(8 << 20); libc.free(big)  # glibc's dynamic threshold rises to 8 MiB here
before = rss_mib()
blocks = [libc.malloc(2 << 20) for _ in range(64)]
for b in blocks:
    ctypes.memset(b, 1, 2 << 20)  # touched: resident
for b in blocks[:-1]:  # the last one pins the heap's top: no trim
    libc.free(b)
print(rss_mib() - before)
"""


def _retained_mib(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", _RETAINED, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return float(out.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_large_blocks_go_back_with_a_fixed_threshold():
    """63 freed 2 MiB blocks: kept in the heap by glibc's dynamic threshold, returned with a fixed one."""
    dynamic, fixed = _retained_mib("dynamic"), _retained_mib("fixed")
    assert dynamic > 100 and fixed < 16, (dynamic, fixed)


def test_the_threshold_is_a_model_setting_with_a_default_and_bounds():
    assert ModelConfig().mmap_threshold_bytes == 1 << 20
    assert ModelConfig(mmap_threshold_bytes=None).mmap_threshold_bytes is None
    with pytest.raises(ValueError):
        ModelConfig(mmap_threshold_bytes=1)
