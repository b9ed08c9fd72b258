"""ChatTTS control tags a user may write, and the one regex that recognises them.

Only these tags keep their brackets: any other ``[`` / ``]`` becomes a space
(``strip_stray_brackets``), so users cannot inject internal tokens such as ``[spk_emb]``, and
ChatTTS's own tag splitter (which takes any ``[...]`` for a tag and loses the text after an
unclosed ``[``) only ever sees these.
"""

from __future__ import annotations

import re
from typing import Callable, Pattern

__all__ = ["BREAK_TAG_RE", "CONTROL_TAG_RE", "map_chunks", "strip_stray_brackets"]

# [uv_break] [v_break] [lbreak] [llbreak] [laugh] and the numbered [laugh_N] [break_N] [oral_N] [speed_N].
TAG_PATTERN = r"\[(?:uv_break|v_break|lbreak|llbreak|laugh|(?:laugh|break|oral|speed)_\d+)\]"
CONTROL_TAG_RE: Pattern[str] = re.compile(TAG_PATTERN)
# The tags that make the model pause (pacing counts them as time).
BREAK_TAG_RE: Pattern[str] = re.compile(r"\[(?:uv_break|v_break|lbreak|break_\d)\]")

ATOM_RE = re.compile(TAG_PATTERN + r"|.", re.S)  # a tag or one character: the unit of a hard cut
_TAG_SPLIT_RE = re.compile("(" + TAG_PATTERN + ")")


def map_chunks(text: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the text between control tags, leaving tags untouched."""
    parts = _TAG_SPLIT_RE.split(text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def strip_stray_brackets(text: str) -> str:
    """Replace '[' / ']' that are not part of a known control tag with spaces."""
    return map_chunks(text, lambda s: s.replace("[", " ").replace("]", " "))
