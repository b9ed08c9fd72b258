"""Language of a text: Chinese ("zh") or English ("en"), by its dominant script."""

from __future__ import annotations

from typing import Literal, Optional, Tuple

from .chars import CJK_RE, LATIN_WORD_RE
from .tags import CONTROL_TAG_RE

__all__ = ["LANGS", "Lang", "check_lang", "detect_language", "detect_or"]

Lang = Literal["zh", "en"]
LANGS = ("zh", "en")


def _script_counts(text: str) -> Tuple[int, int]:
    text = CONTROL_TAG_RE.sub(" ", text)
    return len(CJK_RE.findall(text)), len(LATIN_WORD_RE.findall(text))


def detect_language(text: str) -> Lang:
    """Dominant script: CJK characters vs Latin words; ties (and no evidence) -> "en"."""
    cjk, latin = _script_counts(text)
    return "zh" if cjk > latin else "en"


def detect_or(text: str, default: Lang) -> Lang:
    """Like ``detect_language`` but falls back to ``default`` when there is no letter at all."""
    cjk, latin = _script_counts(text)
    if cjk == latin == 0:
        return default
    return "zh" if cjk > latin else "en"


def check_lang(lang: Optional[str]) -> None:
    if lang is not None and lang not in LANGS:
        raise ValueError(f"lang must be 'zh', 'en' or None, got {lang!r}")
