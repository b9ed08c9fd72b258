"""ChatTTS's own text clean-up (homophones, unsayable characters), without importing ChatTTS.

ChatTTS's ``Normalizer`` (``ChatTTS/norm.py``) runs our number passes, then cleans the text
for its tokenizer. Importing it runs ``ChatTTS/__init__``, which imports torch, and its helpers
are compiled by numba on first use: far too heavy for a text stage. For the text the front end
hands it (no bracket outside a control tag), its clean-up is one mapping per character outside
the tags, done here with ``str.translate``:

1. punctuation it cannot say becomes a pause or a stop (``data/chattts_marks.json``; in Chinese
   text after number normalisation ASCII marks are widened first, so ``,`` becomes ``，``);
2. rarely-said ideographs become common ones read the same (ChatTTS's own
   ``res/homophones_map.json``, read from the installed package);
3. every other character outside ``SAYABLE_CJK``, Latin letters and ``，。、,. `` is dropped.

tests/unit/test_text.py checks ``ChatTTSNormalizer`` against ChatTTS's ``Normalizer`` itself.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from typing import Callable, Dict, Mapping, Optional, Tuple

from . import data
from .chars import SAYABLE_CJK
from .lang import Lang
from .ssml_say_as import _digit_words
from .tags import map_chunks

__all__ = ["ChatTTSNormalizer", "default_homophones_path", "read_digits"]

_UNSAYABLE_RE = re.compile(f"[^{SAYABLE_CJK}A-Za-z，。、,. ]")
_DIGITS_RE = re.compile(r"[0-9]+")


def read_digits(chunk: str, lang: Lang) -> str:
    """``text_normalization: off``: digits as written, one by one (123 -> 一二三 / one two three),
    the one change to them that keeps them from being dropped; nothing else is read."""
    if lang == "zh":
        return _DIGITS_RE.sub(lambda m: _digit_words(m.group(), "zh"), chunk)
    return _DIGITS_RE.sub(lambda m: f" {_digit_words(m.group(), 'en')} ", chunk)


def default_homophones_path() -> str:
    """ChatTTS's ``res/homophones_map.json``, found without running ``ChatTTS/__init__`` (torch)."""
    spec = importlib.util.find_spec("ChatTTS")  # a top-level package: located, not imported
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("ChatTTS is not installed: the text front end needs its res/homophones_map.json")
    return os.path.join(list(spec.submodule_search_locations)[0], "res", "homophones_map.json")


class ChatTTSNormalizer:
    """Does what ``ChatTTS.norm.Normalizer(...)(text, do_text_normalization, do_homophone_replacement,
    lang)`` does with ``number_rules`` registered as its normalisers, for text whose only brackets
    are control tags. Stateless after construction: safe to call from any thread."""

    def __init__(
        self, number_rules: Mapping[str, Callable[[str], str]], homophones_map_path: Optional[str] = None
    ) -> None:
        self._rules = dict(number_rules)
        with open(homophones_map_path or default_homophones_path(), encoding="utf-8") as f:
            homophones = str.maketrans(json.load(f))
        marks = data.load("chattts_marks.json")
        # (ASCII marks widened, homophones replaced) -> translation table
        self._tables: Dict[Tuple[bool, bool], Dict[int, str]] = {}
        for widened in (False, True):
            table = str.maketrans({**marks["any"], **marks["ascii_zh" if widened else "ascii"]})
            self._tables[(widened, False)] = table
            self._tables[(widened, True)] = {**table, **homophones}

    def __call__(
        self, text: str, lang: Lang, do_normalize: bool = True, do_homophones: bool = True, literal: bool = False
    ) -> str:
        """``literal`` (with ``do_normalize`` off): digits are read one by one (``read_digits``)."""
        if do_normalize:
            rules = self._rules.get(lang)
        else:
            rules = (lambda chunk: read_digits(chunk, lang)) if literal else None
        table = self._tables[(do_normalize and lang == "zh", do_homophones)]

        def clean(chunk: str) -> str:
            if rules is not None:
                chunk = rules(chunk)
            return _UNSAYABLE_RE.sub("", chunk.translate(table))

        return map_chunks(text, clean)
