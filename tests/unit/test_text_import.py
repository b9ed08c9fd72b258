"""The text front end stays light: no torch, no ChatTTS package import, its data shipped."""

from __future__ import annotations

import json
import subprocess
import sys
from fnmatch import fnmatch

import pytest

from bench.lib.procs import REPO_ROOT as ROOT

# A fresh interpreter: the text front end alone, as the normaliser replica runs it.
PROBE = r"""
import json, sys
from serve_app.engine.text import TextFrontend
fe = TextFrontend()
fe.warmup()
segments = fe.process("我们在2024年3月5日10:30开会，价格是$3.50，增长了3.5%。See you on March 5 at 10:30, it costs $20!")
heavy = sorted(m for m in ("torch", "numba", "ChatTTS") if m in sys.modules)
# Peak RSS of this process image: ru_maxrss would carry over the (torch-sized) pytest parent's
# peak across fork and exec; VmHWM starts afresh at exec.
with open("/proc/self/status") as f:
    peak_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
print(json.dumps({"segments": [[s.text, s.lang] for s in segments], "heavy": heavy, "peak_rss_mib": peak_kib / 1024}))
"""


def test_text_front_end_does_not_import_torch() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["heavy"] == [], out["heavy"]
    # One segment, each sentence read in its own language.
    expected = (
        "我们在二零二四年三月五日十点三十分开会，价格是三点五美元，增长了百分之三点五。"
        "See you on March fifth at ten thirty, it costs twenty dollars."
    )
    assert out["segments"] == [[expected, "zh"]]
    # With ChatTTS's Normalizer (and so torch) this process peaked above 1 GiB; alone it is tens of MiB.
    assert out["peak_rss_mib"] < 300, out["peak_rss_mib"]


def test_text_data_files_are_package_data() -> None:
    """Every table under data/ is matched by pyproject's package-data, so a wheel ships it."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    globs = pyproject["tool"]["setuptools"]["package-data"]["serve_app.engine.text"]
    package = ROOT / "serve_app" / "engine" / "text"
    files = [p.relative_to(package).as_posix() for p in (package / "data").iterdir() if p.is_file()]
    assert files
    assert all(any(fnmatch(f, g) for g in globs) for f in files), (files, globs)
