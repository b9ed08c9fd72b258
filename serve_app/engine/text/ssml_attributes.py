"""SSML attribute values: ``<break>`` durations and strengths, ``<prosody rate>``, ``xml:lang``,
which elements are silent and which attributes each supported element knows, and the bounds a
break and a rate keep to.

The subset's vocabulary in one place, apart from the event handler (``ssml_handler.py``) that
applies it while the document streams in."""

from __future__ import annotations

import math
import re
from typing import Dict, Optional

from ..types import SynthesisOptions
from .lang import Lang

MAX_BREAK_SECONDS = 10.0

_speed_meta = SynthesisOptions.model_fields["speed"].metadata
MIN_RATE = next(m.ge for m in _speed_meta if hasattr(m, "ge"))  # the service's speed range
MAX_RATE = next(m.le for m in _speed_meta if hasattr(m, "le"))

# Azure's strength lengths (Google's are close): what listeners of those services are used to.
_STRENGTH_SECONDS = {"none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0, "x-strong": 1.25}
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*", re.I)

# Two speed levels per doubling (pacing.speed_tag_level): each word lands on its own level.
_RATE_WORDS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.5, "x-fast": 2.0}
_PERCENT_RE = re.compile(r"\s*([+-])?(\d+(?:\.\d*)?|\.\d+)\s*%\s*")
_MULTIPLIER_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")

# Elements whose content is not speech (a description of audio, metadata): not spoken.
_SILENT_ELEMENTS = frozenset({"desc", "meta", "metadata", "lexicon"})
_KNOWN_ATTRIBUTES: Dict[str, frozenset] = {
    "speak": frozenset({"version"}),
    "p": frozenset(),
    "s": frozenset(),
    "break": frozenset({"time", "strength"}),
    "prosody": frozenset({"rate"}),
    "voice": frozenset({"name"}),
    "say-as": frozenset({"interpret-as", "format"}),
    "sub": frozenset({"alias"}),
    "phoneme": frozenset({"alphabet", "ph"}),
}
_XML_LANG = "{http://www.w3.org/XML/1998/namespace}lang"


def _local(name: str) -> str:
    return name.rsplit("}", 1)[-1]


def _parse_duration(value: str) -> Optional[float]:
    m = _DURATION_RE.fullmatch(value)
    if not m:
        return None
    amount = float(m.group(1))
    return amount / 1000 if m.group(2).lower() == "ms" else amount


def _parse_rate(value: str) -> Optional[float]:
    """A prosody rate as a factor of the enclosing rate (None: not a rate)."""
    word = value.strip().lower()
    if word in _RATE_WORDS:
        return _RATE_WORDS[word]
    m = _PERCENT_RE.fullmatch(value)
    if m:
        sign, amount = m.group(1), float(m.group(2)) / 100
        factor = 1 + amount if sign == "+" else 1 - amount if sign == "-" else amount
    elif (m := _MULTIPLIER_RE.fullmatch(value)) is not None:
        factor = float(m.group(1))
    else:
        return None
    return factor if factor > 0 and math.isfinite(factor) else None


def _lang_of(tag: Optional[str]) -> Optional[Lang]:
    """xml:lang -> the say-as reading language ("zh-CN", "cmn" -> zh; "en-US" -> en)."""
    if not tag:
        return None
    primary = tag.strip().lower().split("-")[0].split("_")[0]
    return "zh" if primary in ("zh", "cmn", "yue") else "en" if primary == "en" else None
