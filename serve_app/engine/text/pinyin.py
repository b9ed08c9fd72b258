"""Toned pinyin -> a character ChatTTS reads with that sound and tone.

ChatTTS has no phoneme input: it reads characters. To force a polyphone (行 as hang2 in 银行, not
xing2) the model is given another character that has only that reading, while captions keep the
written one. The table comes from ``pypinyin``'s data (its per-character readings and its phrase
dictionary), built once, lazily, on first use: for each toned syllable, the character with
a common character (GB2312) with that reading only, the 3,755 most used first (GB2312's first
level), else one with that reading first; ties go to the one in the most of pypinyin's phrases.

Syllables are written with tone numbers 1-5 (``hang2``; 5 or 0, or no number, is the neutral
tone; ``v`` or ``ü`` for ü): ``parse_pinyin`` checks the form, ``substitute`` finds the character.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from typing import Optional

from .chars import SAYABLE_CJK_RE

__all__ = ["PinyinError", "parse_pinyin", "readings", "substitute", "syllable_table"]

# A toned syllable as the API takes it: letters, then a tone number (none: neutral).
_SYLLABLE_RE = re.compile(r"\A[a-zv]{1,6}[0-5]?\Z")
MAX_SYLLABLES = 64


class PinyinError(ValueError):
    """Pinyin that is not toned syllables (or not one per character)."""


def parse_pinyin(text: str, chars: Optional[int] = None) -> tuple[str, ...]:
    """``"yin2 hang2"`` -> ``("yin2", "hang2")``: lower case, ``ü`` as ``v``, the neutral tone as 5.
    ``chars``: how many syllables there must be (one per character)."""
    if not isinstance(text, str):
        raise PinyinError("pinyin must be text such as 'yin2 hang2'")
    words = text.replace(",", " ").replace("ü", "v").replace("u:", "v").lower().split()
    if not words or len(words) > MAX_SYLLABLES:
        raise PinyinError(f"pinyin must be 1 to {MAX_SYLLABLES} syllables such as 'yin2 hang2'")
    out = []
    for word in words:
        if not _SYLLABLE_RE.match(word):
            raise PinyinError(f"{word[:16]!r} is not a pinyin syllable with a tone number (e.g. hang2)")
        if word[-1] in "05":
            word = word[:-1]
        out.append(word if word[-1].isdigit() else word + "5")
    if chars is not None and len(out) != chars:
        raise PinyinError(f"{len(out)} syllable(s) for {chars} character(s): give one syllable per character")
    return tuple(out)


_lock = threading.Lock()
_table: Optional[dict[str, str]] = None
_readings: Optional[dict[str, tuple[str, ...]]] = None


def _tier(ch: str) -> int:
    """0: in GB2312's first level (the 3,755 most used characters), 1: its second, 2: neither."""
    try:
        b = ch.encode("gb2312")
    except UnicodeEncodeError:
        return 2
    return 0 if len(b) == 2 and 0xB0 <= b[0] <= 0xD7 else 1


def _build() -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    from pypinyin import phrases_dict, pinyin_dict
    from pypinyin.contrib.tone_convert import to_tone3

    def tone3(mark: str) -> str:
        s = to_tone3(mark, neutral_tone_with_five=True).replace("ü", "v")
        return s if s[-1:].isdigit() else s + "5"

    readings: dict[str, tuple[str, ...]] = {}
    for cp, value in pinyin_dict.pinyin_dict.items():
        ch = chr(cp)
        if SAYABLE_CJK_RE.match(ch):
            readings[ch] = tuple(dict.fromkeys(tone3(r) for r in value.split(",")))
    used: Counter[str] = Counter()
    for phrase in phrases_dict.phrases_dict:
        used.update(phrase)
    best: dict[str, tuple[tuple[int, ...], str]] = {}
    for ch, rs in readings.items():
        tier = _tier(ch)
        for rank, r in enumerate(rs):
            if not _SYLLABLE_RE.match(r):
                continue  # ê and the like: no way to write them in the API's form
            # A common character first (GB2312), with this reading only, the more common one, the
            # syllable as its first reading, fewer readings, the more used in phrases.
            score = (tier > 1, len(rs) > 1, tier, rank, len(rs), -used[ch])
            if r not in best or score < best[r][0]:
                best[r] = (score, ch)
    return {r: ch for r, (_, ch) in best.items()}, readings


def syllable_table() -> dict[str, str]:
    """Toned syllable -> its character (built once, on first use: about a second)."""
    global _table, _readings
    if _table is None:
        with _lock:
            if _table is None:
                _table, _readings = _build()
    return _table


def readings(ch: str) -> tuple[str, ...]:
    """The toned readings pypinyin knows for a character (first: its most usual)."""
    syllable_table()
    assert _readings is not None
    return _readings.get(ch, ())


def substitute(ch: str, syllable: str) -> Optional[str]:
    """What the model reads for ``ch`` said as ``syllable``: ``ch`` itself when that is its only
    reading, else the table's character (None: no character reads so)."""
    if readings(ch) == (syllable,):
        return ch
    return syllable_table().get(syllable)
