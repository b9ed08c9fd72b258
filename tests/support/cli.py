"""The ``chattts-serve`` command line as a subprocess."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def cli_command() -> list[str]:
    """The console script next to this interpreter (else on PATH, else ``python -m``)."""
    script = Path(sys.executable).parent / "chattts-serve"
    if script.is_file():
        return [str(script)]
    found = shutil.which("chattts-serve")
    return [found] if found else [sys.executable, "-m", "chattts_serve.cli"]
