"""Language of a text: Chinese ("zh") or English ("en"), by its dominant script."""

from __future__ import annotations

import re
from typing import Literal, Optional, Tuple

from .chars import CJK_RE, LATIN_WORD_RE
from .tags import CONTROL_TAG_RE

__all__ = ["LANGS", "Lang", "check_lang", "detect_language", "detect_or"]

Lang = Literal["zh", "en"]
LANGS = ("zh", "en")


# Counted a slice at a time (each a few ms of one regex call): a job's megabyte of text is counted
# in a worker thread, and one call over all of it held the GIL, so the event loop, for ~90 ms.
_SLICE_CHARS = 1 << 16
# A character no control tag or Latin word contains: a cut after one splits neither.
_CUT_AFTER_RE = re.compile(r"[^A-Za-z0-9_\[]")


def _script_counts(text: str) -> Tuple[int, int]:
    cjk = latin = 0
    start, n = 0, len(text)
    while start < n:
        end = n
        if n - start > _SLICE_CHARS:
            cut = _CUT_AFTER_RE.search(text, start + _SLICE_CHARS)
            end = cut.end() if cut else n
        piece = CONTROL_TAG_RE.sub(" ", text[start:end])
        cjk += len(CJK_RE.findall(piece))
        latin += len(LATIN_WORD_RE.findall(piece))
        start = end
    return cjk, latin


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
