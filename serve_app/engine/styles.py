"""OpenAI's free-text ``instructions`` -> ChatTTS's controls.

OpenAI's speech API takes ``instructions`` such as "Speak in a cheerful and positive tone" or
"慢一点，像讲故事一样". ChatTTS has no such input; what it can vary is its prompt tags
``[oral_0-9]`` (filler words, colloquialness), ``[laugh_0-2]``, ``[break_0-7]`` (pauses), and its
speed (the request's ``speed``, which the planner turns into ``[speed_N]``). ``resolve_instructions``
reads the style words and phrases it knows, English and Chinese, from a table
(``text/data/styles.json``), and returns a ``StyleResult``:

* ``prompt``: the tags to add, e.g. ``"[oral_6][laugh_1][break_3]"`` ("" when none), valid for
  ``SynthesisOptions.prompt``; ``merged_prompt(prompt)`` adds them to a caller's own prompt,
  whose tags win.
* ``speed``: a factor for the request's speed, or None; ``apply_speed(speed)`` multiplies and
  keeps the result in the service's speed range.
* ``oral``, ``laugh``, ``break_level``: the levels behind ``prompt`` (None: not set).
* ``applied``: what was recognised and used, once each, in order: the table's ASCII keys
  (``"storyteller"``, ``"slow"``), with ``"very "`` / ``"slightly "`` for an intensity and
  ``"not "`` for a negation, and ``"speed 1.5x"`` for an explicit factor.
* ``ignored``: what was not used: the key of a style ChatTTS cannot do (``"whisper"``,
  ``"accent"``, ``"not narrator"`` for a negation the table gives no meaning), and each clause
  with a word the table does not know and none it does (as written, lower-cased, at most
  ``MAX_REPORTED_CHARS``), at most ``MAX_REPORTED`` entries. ``header_value`` makes either list an ASCII header value.

How it reads: the text (NFKC, case-folded; each text at most ``MAX_INSTRUCTIONS_CHARS``) is cut into tokens
(Latin words, numbers, single CJK characters) and clauses (punctuation, "and", "but", "then").
At each token the longest table phrase starting there is taken, so 快乐 (happy) is not 快
(fast). A modifier ("very", "a bit", 非常, 有点) scales the next style in its clause: a speed
factor ``f`` becomes ``f ** k``, a level moves from the table's ``neutral`` level by ``k`` times
as much. A negation ("not", "don't", "no", 不, 别, 少) gives the next style in its clause its
``negated`` controls (at its plain intensity), or, where the table has none, reports it ignored.
"Nx" / "N倍" sets the speed factor directly.

Conflicts, deterministically: presets apply first, in the order they are mentioned, then the
other words, in the order they are mentioned; each sets only the controls it names, so the last
mention of a control wins ("calm, but faster": the calm preset, with the speed of "faster").

Linear time: one pass over at most ``MAX_INSTRUCTIONS_CHARS`` characters, each token looked up
against at most the few phrase lengths the table has for that first token.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from types import MappingProxyType
from typing import Dict, Iterable, List, Mapping, Optional, Tuple
from urllib.parse import quote

from .errors import InvalidInstructionsError
from .text import data
from .text.chars import CJK
from .types import SynthesisOptions

__all__ = [
    "MAX_INSTRUCTIONS_CHARS",
    "PRESETS",
    "StyleControls",
    "StyleResult",
    "header_value",
    "resolve_instructions",
]

# OpenAI's own limit on instructions; SpeechRequest.instructions has the same max_length.
MAX_INSTRUCTIONS_CHARS = 4096
MAX_REPORTED = 8  # entries of ``ignored``: enough to say what was missed, short for a header
MAX_REPORTED_CHARS = 40  # of one ignored clause

_speed_meta = SynthesisOptions.model_fields["speed"].metadata
MIN_SPEED = next(m.ge for m in _speed_meta if hasattr(m, "ge"))  # the service's speed range
MAX_SPEED = next(m.le for m in _speed_meta if hasattr(m, "le"))

# ChatTTS's ranges for its prompt tags ([oral_0-9], [laugh_0-2], [break_0-7]).
LEVEL_RANGES = {"oral": (0, 9), "laugh": (0, 2), "break": (0, 7)}


@dataclass(frozen=True)
class StyleControls:
    """What a preset or a word sets; None: left as it is."""

    oral: Optional[int] = None
    laugh: Optional[int] = None
    break_level: Optional[int] = None
    speed: Optional[float] = None

    @classmethod
    def from_table(cls, row: dict) -> "StyleControls":
        return cls(row.get("oral"), row.get("laugh"), row.get("break"), row.get("speed"))

    def levels(self) -> Dict[str, Optional[int]]:
        return {"oral": self.oral, "laugh": self.laugh, "break": self.break_level}


@dataclass(frozen=True)
class StyleResult:
    prompt: str = ""
    speed: Optional[float] = None
    oral: Optional[int] = None
    laugh: Optional[int] = None
    break_level: Optional[int] = None
    applied: Tuple[str, ...] = ()
    ignored: Tuple[str, ...] = ()

    def merged_prompt(self, prompt: str = "") -> str:
        """The caller's ``prompt`` with this style's tags for the kinds it does not set itself
        (an explicit ``[oral_N]`` in the request wins over "casual" in its instructions)."""
        own = set(re.findall(r"\[(oral|laugh|break)_\d+\]", prompt))
        return prompt + "".join(tag for kind, tag in _tags(self.oral, self.laugh, self.break_level) if kind not in own)

    def apply_speed(self, speed: float) -> float:
        """The request's speed with this style's factor, within the service's speed range."""
        if self.speed is None:
            return speed
        return min(MAX_SPEED, max(MIN_SPEED, speed * self.speed))


def _tags(oral: Optional[int], laugh: Optional[int], break_level: Optional[int]) -> List[Tuple[str, str]]:
    levels = (("oral", oral), ("laugh", laugh), ("break", break_level))
    return [(kind, f"[{kind}_{level}]") for kind, level in levels if level is not None]


# --------------------------------------------------------------------------- #
# The table
# --------------------------------------------------------------------------- #

# Latin words, numbers, single CJK characters, "×"; runs of punctuation end a clause.
_TOKEN_RE = re.compile(
    rf"[a-z]+(?:['’][a-z]+)*|\d+(?:\.\d+)?|[{CJK}]|[×]"
    r"|(?P<sep>[,.;:!?，。；：！？、\n()（）\[\]\"“”]+)"
)
_CLAUSE_WORDS = frozenset({"and", "but", "then", "while", "also"})
_SPEED_SUFFIXES = frozenset({"x", "×", "倍"})


def _tokens(phrase: str) -> Tuple[str, ...]:
    return tuple(m.group() for m in _TOKEN_RE.finditer(_normalise(phrase)) if not m.group("sep"))


def _normalise(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


@dataclass(frozen=True)
class _Entry:
    kind: str  # preset | word | modifier | negation | carrier | unsupported
    key: str = ""
    controls: StyleControls = StyleControls()
    negated: Optional[StyleControls] = None
    factor: float = 1.0


def _check_controls(where: str, c: StyleControls) -> None:
    for kind, level in c.levels().items():
        low, high = LEVEL_RANGES[kind]
        if level is not None and not (isinstance(level, int) and low <= level <= high):
            raise ValueError(f"styles.json: {where}: {kind} {level!r} is not in {low}..{high}")
    if c.speed is not None and not MIN_SPEED <= c.speed <= MAX_SPEED:
        raise ValueError(f"styles.json: {where}: speed {c.speed!r} is not in {MIN_SPEED}..{MAX_SPEED}")


_Phrases = Dict[Tuple[str, ...], _Entry]


def _build(table: dict) -> Tuple[_Phrases, Dict[str, Tuple[int, ...]], Dict[str, StyleControls]]:
    """Phrase (as tokens) -> entry, and for each first token the phrase lengths, longest first.
    Checks the table: ASCII keys, levels and speeds in range, no phrase twice."""
    phrases: Dict[Tuple[str, ...], _Entry] = {}

    def put(phrase: str, entry: _Entry) -> None:
        tokens = _tokens(phrase)
        if not tokens:
            raise ValueError(f"styles.json: phrase {phrase!r} has no words")
        if tokens in phrases:
            raise ValueError(f"styles.json: phrase {phrase!r} is listed twice")
        phrases[tokens] = entry

    presets: Dict[str, StyleControls] = {}
    for kind in ("presets", "words"):
        for key, row in table[kind].items():
            if not key.isascii():
                raise ValueError(f"styles.json: key {key!r} is not ASCII (it goes into a header)")
            controls = StyleControls.from_table(row)
            negated = StyleControls.from_table(row["negated"]) if "negated" in row else None
            for c in (controls, negated):
                if c is not None:
                    _check_controls(key, c)
            if kind == "presets":
                presets[key] = controls
            for phrase in row["phrases"]:
                put(phrase, _Entry(kind.rstrip("s"), key, controls, negated))
    for phrase, factor in table["modifiers"].items():
        put(phrase, _Entry("modifier", factor=float(factor)))
    for phrase in table["negations"]:
        put(phrase, _Entry("negation"))
    for phrase in table["carriers"]:
        put(phrase, _Entry("carrier"))
    for key, words in table["unsupported"].items():
        for phrase in words:
            put(phrase, _Entry("unsupported", key))
    lengths: Dict[str, set] = {}
    for tokens in phrases:
        lengths.setdefault(tokens[0], set()).add(len(tokens))
    by_first = {first: tuple(sorted(ls, reverse=True)) for first, ls in lengths.items()}
    return phrases, by_first, presets


_TABLE = data.load("styles.json")
_NEUTRAL = _TABLE["neutral"]
_PHRASES, _LENGTHS, _PRESET_CONTROLS = _build(_TABLE)
PRESETS: Mapping[str, StyleControls] = MappingProxyType(_PRESET_CONTROLS)  # name -> controls, for a style picker


# --------------------------------------------------------------------------- #
# Reading instructions
# --------------------------------------------------------------------------- #


def _scaled(controls: StyleControls, k: float) -> StyleControls:
    """``controls`` at intensity ``k``: a speed factor to the power ``k``, a level ``k`` times as
    far from neutral (rounded half up, within its range)."""
    if k == 1.0:
        return controls
    levels = {}
    for kind, level in controls.levels().items():
        if level is None:
            levels[kind] = None
            continue
        low, high = LEVEL_RANGES[kind]
        neutral = _NEUTRAL[kind]
        levels[kind] = int(min(high, max(low, math.floor(neutral + (level - neutral) * k + 0.5))))
    speed = None if controls.speed is None else min(MAX_SPEED, max(MIN_SPEED, controls.speed**k))
    return StyleControls(levels["oral"], levels["laugh"], levels["break"], speed)


def _intensity_word(k: float) -> str:
    return "very " if k > 1 else "slightly " if k < 1 else ""


@dataclass
class _Clause:
    start: int  # offset of its first token in the normalised text
    end: int
    understood: bool = False
    words: bool = False  # has a token at all
    negate: bool = False
    k: float = 1.0


def resolve_instructions(*texts: Optional[str]) -> StyleResult:
    """The ChatTTS controls for OpenAI ``instructions`` (see the module docstring). Several texts
    (a dialogue's own instructions, then a turn's) are read in order as one, each ending a
    clause, so the later one wins a control both set. None or "" add nothing. A text longer
    than ``MAX_INSTRUCTIONS_CHARS``: ``InvalidInstructionsError`` (400; the API refuses such a
    field before it gets here). Each text is bounded, not their sum: each is a field the API
    bounds on its own, and reading is linear in all of them."""
    for text in texts:
        if text is not None and not isinstance(text, str):
            raise TypeError(f"instructions must be str, got {type(text).__name__}")
        if text and len(text) > MAX_INSTRUCTIONS_CHARS:
            raise InvalidInstructionsError(
                f"instructions are {len(text)} characters; at most {MAX_INSTRUCTIONS_CHARS} are read"
            )
    if not any(texts):
        return StyleResult()
    norm = "\n".join(_normalise(text) for text in texts if text)  # "\n" ends a clause
    tokens = [(m.group(), m.start(), m.end(), bool(m.group("sep"))) for m in _TOKEN_RE.finditer(norm)]
    presets: List[Tuple[str, StyleControls]] = []
    words: List[Tuple[str, StyleControls]] = []
    ignored: List[str] = []
    clause: Optional[_Clause] = None

    def end_clause() -> None:
        if clause is not None and clause.words and not clause.understood:
            snippet = norm[clause.start : clause.end].strip()
            ignored.append(snippet if len(snippet) <= MAX_REPORTED_CHARS else snippet[: MAX_REPORTED_CHARS - 1] + "…")

    i, n = 0, len(tokens)
    while i < n:
        tok, start, end, sep = tokens[i]
        if sep or tok in _CLAUSE_WORDS:
            end_clause()
            clause = None
            i += 1
            continue
        if clause is None:
            clause = _Clause(start, end)
        # "1.5x", "2 倍", "0.8倍速": a speed factor as a number.
        if tok[0].isdigit() and i + 1 < n and tokens[i + 1][0] in _SPEED_SUFFIXES:
            factor = float(tok)
            step = 3 if i + 2 < n and tokens[i + 2][0] == "速" else 2
            clause.end = tokens[i + step - 1][2]
            clause.words = clause.understood = True
            if MIN_SPEED <= factor <= MAX_SPEED:
                words.append((f"speed {factor:g}x", StyleControls(speed=factor)))
            else:
                ignored.append(f"speed {factor:g}x")
            clause.negate, clause.k = False, 1.0
            i += step
            continue
        entry, length = None, 1
        for size in _LENGTHS.get(tok, ()):
            candidate = tuple(t[0] for t in tokens[i : i + size])
            if len(candidate) == size and candidate in _PHRASES and not any(t[3] for t in tokens[i : i + size]):
                entry, length = _PHRASES[candidate], size
                break
        clause.end = tokens[i + length - 1][2]
        i += length
        if entry is not None and entry.kind == "carrier":
            continue
        clause.words = True
        if entry is None:
            continue
        if entry.kind == "modifier":
            clause.k *= entry.factor
            continue
        if entry.kind == "negation":
            clause.negate = True
            continue
        clause.understood = True
        negate, k = clause.negate, clause.k
        clause.negate, clause.k = False, 1.0
        if entry.kind == "unsupported":
            if not negate:  # "don't whisper" asks for nothing ChatTTS would do anyway
                ignored.append(entry.key)
            continue
        if negate:
            if entry.negated is None:
                ignored.append(f"not {entry.key}")
                continue
            name, controls = f"not {entry.key}", entry.negated
        else:
            name, controls = _intensity_word(k) + entry.key, _scaled(entry.controls, k)
        (presets if entry.kind == "preset" else words).append((name, controls))
    end_clause()

    oral = laugh = break_level = None
    speed: Optional[float] = None
    applied: Dict[str, None] = {}
    for name, c in presets + words:  # presets first, then words; the last mention wins
        oral = c.oral if c.oral is not None else oral
        laugh = c.laugh if c.laugh is not None else laugh
        break_level = c.break_level if c.break_level is not None else break_level
        speed = c.speed if c.speed is not None else speed
        applied.setdefault(name, None)
    prompt = "".join(tag for _, tag in _tags(oral, laugh, break_level))
    return StyleResult(
        prompt, speed, oral, laugh, break_level, tuple(applied), tuple(dict.fromkeys(ignored))[:MAX_REPORTED]
    )


# Every printable ASCII character but "%" (the escape) and "," (the separator) stays as it is.
_HEADER_SAFE = "".join(chr(c) for c in range(0x20, 0x7F) if chr(c) not in "%,")


def header_value(items: Iterable[str], max_chars: int = 256) -> str:
    """``items`` as one HTTP header value: comma-separated, each percent-encoded (UTF-8) where
    it is not printable ASCII or holds a "%" or ",", cut after the last whole item that fits in
    ``max_chars``. For ``StyleResult.applied`` / ``ignored`` and ``SsmlDocument.unsupported``."""
    out = ""
    for item in items:
        encoded = quote(item, safe=_HEADER_SAFE)
        joined = f"{out}, {encoded}" if out else encoded
        if len(joined) > max_chars:
            break
        out = joined
    return out
