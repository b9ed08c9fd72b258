"""Loads the tables under ``data/`` (package data: shipped with the wheel, see pyproject.toml)."""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Dict


@lru_cache(maxsize=None)
def load(name: str) -> Dict[str, Any]:
    """A JSON table of ``data/``; its ``"_"`` entry (the description) is left out."""
    with (resources.files(__package__) / "data" / name).open(encoding="utf-8") as f:
        table = json.load(f)
    table.pop("_", None)
    return table
