"""Pronunciation lexicons: words said as an alias ("SQL" -> "sequel") or Chinese said with given
pinyin (银行 -> "yin2 hang2", so 行 is hang2 there), applied to the text before normalisation.

The Ingress resolves a request's ``lexicon`` (an id, or the caller's default) to its entries and
puts them in ``SynthesisOptions.pronunciations``; the TextNormalizer applies them to each piece
of text after it is cut into segments, so a segment's span, and what captions show, stay the
written text: only the model reads the alias or the substitute characters (``pinyin.py``).

Matching: at each position the longest entry that matches wins and the text after it is matched
again (entries do not apply to each other's output). Chinese entries match anywhere; an entry
that starts (ends) with a Latin letter or digit matches only where no letter or digit is before
(after) it, ignoring case. Cost: a trie walk of at most ``MAX_ENTRY_CHARS`` steps per character,
whatever the number of entries.

SSML's ``<phoneme alphabet="pinyin" ph="hang2">行</phoneme>`` travels inside the piece's text as
``PHONEME_OPEN + written + PHONEME_SEP + pinyin + PHONEME_CLOSE`` (private-use characters the
SSML reader strips from the caller's own text): ``resolve_phonemes`` gives the model's text,
``strip_phonemes`` the written one.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import OrderedDict
from functools import cached_property
from typing import Optional

from pydantic import ConfigDict, Field, model_validator

from ..errors import InputTooLong
from ..strict import StrictModel
from .chars import SAYABLE_CJK_RE
from .pinyin import PinyinError, parse_pinyin, substitute

__all__ = [
    "MAX_ALIAS_CHARS",
    "MAX_ENTRIES",
    "MAX_ENTRY_CHARS",
    "PHONEME_CLOSE",
    "PHONEME_OPEN",
    "PHONEME_SEP",
    "CompiledLexicon",
    "LexiconBudget",
    "LexiconEntry",
    "Pronunciations",
    "apply_lexicon",
    "phoneme_marker",
    "resolve_phonemes",
    "strip_phonemes",
]

# Hard ceilings of what any stage accepts; the service's own (smaller) bounds are settings
# (``LexiconSettings``), checked when a lexicon is made.
MAX_ENTRIES = 5000
MAX_ENTRY_CHARS = 64
MAX_ALIAS_CHARS = 256

PHONEME_OPEN, PHONEME_SEP, PHONEME_CLOSE = "\ue000", "\ue001", "\ue002"
MARKER_CHARS = PHONEME_OPEN + PHONEME_SEP + PHONEME_CLOSE
_PHONEME_RE = re.compile(f"{PHONEME_OPEN}([^{MARKER_CHARS}]*){PHONEME_SEP}([^{MARKER_CHARS}]*){PHONEME_CLOSE}")
_MARKERS_RE = re.compile(f"[{MARKER_CHARS}]")


def _wordish(ch: str) -> bool:
    return ch.isascii() and ch.isalnum()


class LexiconEntry(StrictModel):
    """One entry: ``text`` as written, said as ``alias`` (words, read like the request's text),
    or, for Chinese, with ``pinyin``: one toned syllable per character (``"yin2 hang2"``)."""

    model_config = ConfigDict(frozen=True)

    text: str = Field(min_length=1, max_length=MAX_ENTRY_CHARS)
    alias: Optional[str] = Field(default=None, min_length=1, max_length=MAX_ALIAS_CHARS)
    pinyin: Optional[str] = Field(default=None, min_length=1, max_length=8 * MAX_ENTRY_CHARS)

    @model_validator(mode="after")
    def _one_reading(self) -> "LexiconEntry":
        if self.text != self.text.strip() or not self.text.isprintable() or _MARKERS_RE.search(self.text):
            raise ValueError("text must be printable, without leading or trailing spaces")
        if (self.alias is None) == (self.pinyin is None):
            raise ValueError("an entry gives either 'alias' or 'pinyin'")
        if self.alias is not None and (not self.alias.strip() or _MARKERS_RE.search(self.alias)):
            raise ValueError("alias must be words to say")
        if self.pinyin is not None:
            if not all(SAYABLE_CJK_RE.match(c) for c in self.text):
                raise ValueError("a pinyin entry's text must be Chinese characters only")
            try:
                syllables = parse_pinyin(self.pinyin, chars=len(self.text))
            except PinyinError as exc:
                raise ValueError(str(exc)) from None
            object.__setattr__(self, "pinyin", " ".join(syllables))  # canonical: one content hash
        return self

    def reading(self) -> str:
        """What the model reads for ``text``: the alias, or a character per syllable (a syllable
        no character reads keeps its written character)."""
        if self.alias is not None:
            return self.alias
        assert self.pinyin is not None
        return "".join(substitute(c, s) or c for c, s in zip(self.text, self.pinyin.split()))


class Pronunciations(StrictModel):
    """A resolved lexicon as it travels with the options (the Ingress fills it from the store)."""

    model_config = ConfigDict(frozen=True)

    entries: tuple[LexiconEntry, ...] = Field(default=(), max_length=MAX_ENTRIES)

    @cached_property
    def content_hash(self) -> str:
        """What the response cache keys: the entries, not the lexicon's id or name (a lexicon
        deleted and made again under another id with other entries must not hit). Computed once
        per object (~1.5 ms for 500 entries); a stored lexicon gives the one it was made with."""
        return entries_hash(self.entries)

    @classmethod
    def stored(cls, entries: tuple[LexiconEntry, ...], content_hash: Optional[str]) -> "Pronunciations":
        """A stored lexicon's entries (valid already) with the hash it was stored with."""
        found = cls.model_construct(entries=entries)
        if content_hash:
            found.__dict__["content_hash"] = content_hash
        return found

    def __reduce__(self):
        # To another stage as plain strings, rebuilt without validation (they were validated when the
        # lexicon was made): pickling 500 entries as pydantic models cost ~3 ms of the Ingress's loop.
        rows = tuple((e.text, e.alias, e.pinyin) for e in self.entries)
        return (_rebuilt, (rows, self.content_hash))


def _rebuilt(rows: tuple, content_hash: str) -> Pronunciations:
    entries = tuple(LexiconEntry.model_construct(text=t, alias=a, pinyin=p) for t, a, p in rows)
    return Pronunciations.stored(entries, content_hash)


def entries_hash(entries: tuple[LexiconEntry, ...]) -> str:
    """``Pronunciations.content_hash`` of ``entries``."""
    doc = json.dumps([e.model_dump(exclude_none=True) for e in entries], ensure_ascii=False, sort_keys=True)
    return "lex:" + hashlib.sha256(doc.encode()).hexdigest()[:32]


_END = ""  # a trie node's key for the entry ending there (no character is "")


class LexiconBudget:
    """How many characters a lexicon may still add to one plan's text, every piece of it together
    (``SegmentConfig.max_lexicon_growth_chars``). An alias may be far longer than what it replaces
    (one character said as 128), so the text is bounded as it grows, before it is normalised:
    ``InputTooLong`` the moment it passes, never after the work. ``outer``: a budget this one's
    growth is charged to as well (a job's, across all its chunks); what is left is the lesser."""

    def __init__(
        self,
        chars: int,
        outer: Optional["LexiconBudget"] = None,
        setting: str = "segments.max_lexicon_growth_chars",
        what: str = "the input",
    ):
        self.limit = chars
        self.outer = outer
        self.setting = setting
        self.what = what
        self._left = chars
        self.exhausted = False  # refused (by itself, not by an outer budget) at least once

    @property
    def left(self) -> int:
        return self._left if self.outer is None else min(self._left, self.outer.left)

    def spend(self, chars: int) -> None:
        """Charge ``chars`` (negative: an alias shorter than its text gives some back)."""
        self._left -= chars
        if self.outer is not None:
            self.outer.spend(chars)

    def charge(self, chars: int) -> None:
        """``spend``, refused (nothing spent) when it passes what is left."""
        if chars > self.left:
            raise self.refused()
        self.spend(chars)

    def refused(self) -> InputTooLong:
        if self.outer is not None and self.outer.left < self._left:
            return self.outer.refused()  # the outer budget is the one that ran out
        self.exhausted = True
        return InputTooLong(
            f"the lexicon's aliases make {self.what} more than {self.limit} characters longer than sent "
            f"({self.setting}): send less text or use shorter aliases"
        )


class CompiledLexicon:
    """Entries in a trie of their case-folded characters: at each position one walk of at most
    ``MAX_ENTRY_CHARS`` steps finds the longest entry that matches there, whatever the count."""

    def __init__(self, entries: tuple[LexiconEntry, ...]):
        root: dict = {}
        for e in entries:
            key = e.text.lower()
            if len(key) != len(e.text):
                continue  # a case fold that changes the length would misalign the match
            node = root
            for ch in key:
                node = node.setdefault(ch, {})
            node[_END] = (_wordish(key[0]), _wordish(key[-1]), e.reading())
        self._root = root

    def _match(self, text: str, low: str, i: int) -> Optional[tuple[int, str]]:
        """(end, reading) of the longest entry that matches at ``i`` with its word boundaries."""
        node, found, n = self._root, None, len(text)
        before_word = i > 0 and _wordish(text[i - 1])
        for j in range(i, min(n, i + MAX_ENTRY_CHARS)):
            node = node.get(low[j])
            if node is None:
                break
            end = node.get(_END)
            if end is not None:
                starts_word, ends_word, reading = end
                if not (starts_word and before_word) and not (ends_word and j + 1 < n and _wordish(text[j + 1])):
                    found = (j + 1, reading)
        return found

    def apply(self, text: str, budget: Optional[LexiconBudget] = None) -> str:
        """``text`` read through the entries. ``budget``: what they may add to it (spent here;
        ``InputTooLong`` as soon as the text has grown past it)."""
        if not self._root or not text:
            return text
        low = text.lower()
        if len(low) != len(text):
            low = "".join(c.lower() if len(c.lower()) == 1 else c for c in text)
        out: list[str] = []
        i, n, last = 0, len(text), 0
        grown = 0  # characters added so far (an alias shorter than its text takes some back)
        left = budget.left if budget is not None else None
        while i < n:
            found = self._match(text, low, i) if low[i] in self._root else None
            if found is None:
                i += 1
                continue
            j, reading = found
            out.append(text[last:i])
            # An alias beside a letter or digit is a word of its own.
            if i > 0 and _wordish(text[i - 1]) and _wordish(reading[0]):
                out.append(" ")
                grown += 1
            out.append(reading)
            grown += len(reading) - (j - i)
            if j < n and _wordish(text[j]) and _wordish(reading[-1]):
                out.append(" ")
                grown += 1
            if left is not None and grown > left:
                raise budget.refused()  # type: ignore[union-attr]
            i = last = j
        out.append(text[last:])
        if budget is not None:
            budget.spend(grown)
        return "".join(out)


_CACHE_SIZE = 32
_compiled: "OrderedDict[str, CompiledLexicon]" = OrderedDict()
_compiled_lock = threading.Lock()


def _compiled_for(p: Pronunciations) -> CompiledLexicon:
    """A lexicon compiled once per content (the last few kept): a request's pieces share it."""
    key = p.content_hash
    with _compiled_lock:
        hit = _compiled.get(key)
        if hit is not None:
            _compiled.move_to_end(key)
            return hit
    compiled = CompiledLexicon(p.entries)
    with _compiled_lock:
        _compiled[key] = compiled
        while len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    return compiled


def apply_lexicon(text: str, pronunciations: Optional[Pronunciations], budget: Optional[LexiconBudget] = None) -> str:
    """``text`` as the model should read it under ``pronunciations`` (None or empty: as is);
    ``budget``: what the entries may add to it (``LexiconBudget``)."""
    if pronunciations is None or not pronunciations.entries:
        return text
    return _compiled_for(pronunciations).apply(text, budget)


def phoneme_marker(written: str, pinyin: str) -> str:
    """An SSML phoneme inside a piece's text (``pinyin``: checked, one syllable per character)."""
    return f"{PHONEME_OPEN}{written}{PHONEME_SEP}{pinyin}{PHONEME_CLOSE}"


def _reading(m: re.Match) -> str:
    written, pinyin = m.group(1), m.group(2).split()
    return "".join(substitute(c, s) or c for c, s in zip(written, pinyin)) + written[len(pinyin) :]


def resolve_phonemes(text: str) -> str:
    """The model's text of a piece: every phoneme as the characters that read so."""
    if PHONEME_OPEN not in text:
        return text
    return _MARKERS_RE.sub("", _PHONEME_RE.sub(_reading, text))


def strip_phonemes(text: str) -> str:
    """The written text of a piece: every phoneme as its written characters."""
    if PHONEME_OPEN not in text:
        return text
    return _MARKERS_RE.sub("", _PHONEME_RE.sub(lambda m: m.group(1), text))
