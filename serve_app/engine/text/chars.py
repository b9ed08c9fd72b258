"""Character classes: the one definition of the CJK ranges and of what is speakable.

ChatTTS says ideographs of the CJK Unified Ideographs block (``SAYABLE_CJK``), Latin letters
and ``，。、,. ``; its Normalizer drops anything else. Extension A and the compatibility
ideographs still mark a text as Chinese (``CJK``), though ChatTTS drops them.
"""

from __future__ import annotations

import re
import unicodedata

from .tags import CONTROL_TAG_RE

__all__ = ["CJK", "CJK_RE", "SAYABLE_CJK", "SAYABLE_CJK_RE", "is_speakable", "sanitize", "text_length"]

SAYABLE_CJK = "\u4e00-\u9fff"  # CJK Unified Ideographs: what ChatTTS's tokenizer and Normalizer keep
CJK = "\u3400-\u4dbf" + SAYABLE_CJK + "\uf900-\ufaff"  # + Extension A and compatibility ideographs

CJK_RE = re.compile(f"[{CJK}]")
SAYABLE_CJK_RE = re.compile(f"[{SAYABLE_CJK}]")
LATIN_WORD_RE = re.compile(r"[A-Za-z]+")
_SPEAKABLE_RE = re.compile(f"[{CJK}A-Za-z0-9０-９Ａ-Ｚａ-ｚ]")  # full-width: normalised later
WS_RE = re.compile(r"\s+")

# Full-width ASCII variants (！ ＄ １ Ａ ...) -> ASCII so one set of rules applies;
# ChatTTS maps Chinese punctuation back for zh itself.
FULLWIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}
FULLWIDTH.update({0x3000: 0x20, 0xFFE5: ord("¥"), 0xFFE0: ord("¢"), 0xFFE1: ord("£")})


def text_length(text: str) -> int:
    """Length counted against ``max_chars``: whitespace runs and control tags count as 1."""
    text = WS_RE.sub(" ", text).strip()
    return len(text) - sum(len(m.group()) - 1 for m in CONTROL_TAG_RE.finditer(text))


def is_speakable(text: str) -> bool:
    """True if, tags aside, the text has something ChatTTS can say (CJK, Latin, digits)."""
    return bool(_SPEAKABLE_RE.search(CONTROL_TAG_RE.sub("", text)))


def sanitize(text: str) -> str:
    """Drop control/format characters (they confuse splitting and tokenising)."""
    out = []
    for ch in text:
        if ch in "\n\t\r":
            out.append("\n" if ch == "\n" else " ")
            continue
        cat = unicodedata.category(ch)
        if cat == "Cf":  # zero-width spaces, BOM, bidi marks
            continue
        out.append(" " if cat in ("Cc", "Cs", "Co", "Zl", "Zp") else ch)
    return "".join(out)
