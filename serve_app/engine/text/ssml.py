"""A subset of SSML (Speech Synthesis Markup Language) -> ordered pieces the planner speaks.

``parse_ssml(text)`` reads a ``<speak>`` document into an ``SsmlDocument``:

* ``pieces``: ``SsmlText`` and ``SsmlBreak`` in document order.

  - ``SsmlText(text, span, voice, rate, boundary_before)``: text to speak, whitespace collapsed,
    ``say-as`` and ``sub`` already resolved to speakable words (numbers elsewhere are left to the
    text front end, which reads them as it reads plain input). ``span = (start, end)``: the
    character offsets in the original input the piece came from (``input[start:end]``, from its
    first to its last non-blank character, markup inside it included). ``voice``: the innermost
    ``<voice name>`` around it, passed through as written (None: the request's voice).
    ``rate``: the speed factor of the ``<prosody rate>`` elements around it, multiplied, within
    the service's speed range (1.0: unchanged). ``boundary_before``: a ``speak``/``p``/``s``
    boundary lies between this piece and the previous text piece (True for the first one);
    False when it continues the same sentence and was cut off only by a voice or rate change or
    a break.
  - ``SsmlBreak(seconds, span)``: silence of exactly ``seconds``, ``span`` its ``<break>`` tag.

  Every piece is spoken as its own segments: two pieces are never joined into one segment
  (their voice or rate differ, a break or a sentence boundary lies between them).
* ``unsupported``: what was read but not acted on, once each in order of appearance: element
  names (``emphasis``, ``phoneme``, ``audio``, ``mark``, ``lang``, anything unknown; their text
  is spoken, except ``desc``/``meta``/``metadata``/``lexicon``, whose content is not speech),
  ``element@attribute`` for attributes ignored on a supported element (``prosody@pitch``), and
  ``say-as:<value>`` for an interpretation not listed below (its text is read as plain input).

Supported: ``speak`` (the root), ``p``/``s`` (each a segment boundary), ``break`` (``time`` as
``500ms``/``1.5s``, else ``strength``, default ``medium``; at most ``MAX_BREAK_SECONDS`` each and
``max_break_total_s`` in all), ``prosody rate`` (``x-slow`` .. ``x-fast``, ``80%``, ``+20%``/
``-20%``, a number multiplier; nested rates multiply), ``voice name``, ``say-as interpret-as``
(``characters``/``spell-out``, ``cardinal``/``number``, ``ordinal``, ``digits``, ``date`` with
``format`` ymd/mdy/dmy/ym/my/md/dm/y/m/d, ``telephone``), ``sub alias``. ``xml:lang`` (on any
element, the innermost wins) picks the language say-as content is read in; without it the
``lang`` argument, else the language of the piece's own text.

Safety: the input length is checked before parsing (``max_chars``), the parser is defusedxml's
(a DTD, entity declarations and external references are refused), and the nesting depth is
counted as elements open (``max_depth``), with no recursion and no tree built: pieces are made
as the parser streams its events. Errors are ``InvalidSSMLError`` naming the element and its
line and column (1-based), or ``RequestTooLarge`` for an input or a total of breaks over its
limit.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from defusedxml.common import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser, ParseError

from ..errors import InvalidSSMLError, RequestTooLarge
from ..types import MAX_SPEAKER_CHARS, SynthesisOptions
from . import data
from .chars import CJK_RE
from .en import en_integer, en_number, en_ordinal, en_year
from .lang import Lang, check_lang, detect_language, detect_or
from .patterns import MAX_DIGITS
from .zh import zh_integer, zh_number

__all__ = [
    "MAX_BREAK_SECONDS",
    "MAX_SSML_CHARS",
    "SsmlBreak",
    "SsmlDocument",
    "SsmlPiece",
    "SsmlText",
    "looks_like_ssml",
    "parse_ssml",
]

# The Ingress refuses input over ingress.max_input_chars (4096) before this is reached; this
# bound is for other callers, and the caller passes its own limit as ``max_chars``.
MAX_SSML_CHARS = 16_384
MAX_DEPTH = 32
MAX_BREAK_SECONDS = 10.0
# Silence costs no GPT work but is audio to encode and send: a 4096-character input could hold
# ~450 ten-second breaks.
MAX_BREAK_TOTAL_SECONDS = 120.0
MAX_DATE_FIELD_DIGITS = 4  # a year; a month or a day is fewer

_speed_meta = SynthesisOptions.model_fields["speed"].metadata
MIN_RATE = next(m.ge for m in _speed_meta if hasattr(m, "ge"))  # the service's speed range
MAX_RATE = next(m.le for m in _speed_meta if hasattr(m, "le"))

Span = Tuple[int, int]


@dataclass(frozen=True)
class SsmlText:
    text: str
    span: Span
    voice: Optional[str] = None
    rate: float = 1.0
    boundary_before: bool = True


@dataclass(frozen=True)
class SsmlBreak:
    seconds: float
    span: Span


SsmlPiece = Union[SsmlText, SsmlBreak]


@dataclass(frozen=True)
class SsmlDocument:
    pieces: Tuple[SsmlPiece, ...]
    unsupported: Tuple[str, ...] = ()

    @property
    def break_seconds(self) -> float:
        return sum(p.seconds for p in self.pieces if isinstance(p, SsmlBreak))

    @property
    def texts(self) -> Tuple[SsmlText, ...]:
        return tuple(p for p in self.pieces if isinstance(p, SsmlText))


_SPEAK_START_RE = re.compile(r"\ufeff?\s*(?:<\?xml[^>]*\?>\s*)?<speak[\s>/]")


def looks_like_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document: it starts with ``<speak`` (after blanks, a byte
    order mark or an XML declaration)."""
    return _SPEAK_START_RE.match(text) is not None


# --------------------------------------------------------------------------- #
# Attribute values
# --------------------------------------------------------------------------- #

# Azure's strength lengths (Google's are close): what listeners of those services are used to.
_STRENGTH_SECONDS = {"none": 0.0, "x-weak": 0.25, "weak": 0.5, "medium": 0.75, "strong": 1.0, "x-strong": 1.25}
_DURATION_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s)\s*", re.I)

# Two speed levels per doubling (pacing.speed_tag_level): each word lands on its own level.
_RATE_WORDS = {"x-slow": 0.5, "slow": 0.75, "medium": 1.0, "default": 1.0, "fast": 1.5, "x-fast": 2.0}
_PERCENT_RE = re.compile(r"\s*([+-])?(\d+(?:\.\d*)?|\.\d+)\s*%\s*")
_MULTIPLIER_RE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*")

_SAY_AS = {
    "characters": "characters", "spell-out": "characters", "letters": "characters", "verbatim": "characters",
    "cardinal": "cardinal", "number": "cardinal",
    "ordinal": "ordinal",
    "digits": "digits",
    "date": "date",
    "telephone": "telephone",
}
_DATE_FORMATS = ("ymd", "mdy", "dmy", "ym", "my", "md", "dm", "y", "m", "d")
_MONTHS = data.load("en.json")["months"]

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


# --------------------------------------------------------------------------- #
# say-as readings (the front end's number words; no number rules of their own)
# --------------------------------------------------------------------------- #


class _NotThat(ValueError):
    """say-as content that does not fit its interpretation (the message says why)."""


def _digit_words(digits: str, lang: Lang, one: Optional[str] = None) -> str:
    if lang == "zh":
        return "".join(one if one and c == "1" else zh_integer(int(c)) for c in digits)
    return " ".join(en_integer(int(c)) for c in digits)


def _cardinal(content: str, lang: Lang) -> str:
    s = content.strip()
    if re.fullmatch(r"[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
        s = s.replace(",", "")
    if not re.fullmatch(r"[-+]?\d+(?:\.\d+)?", s):
        raise _NotThat(f"{content.strip()!r} is not a number")
    return zh_number(s) if lang == "zh" else en_number(s)


def _ordinal(content: str, lang: Lang) -> str:
    m = re.fullmatch(r"\s*第?\s*(\d+)\s*(?:st|nd|rd|th)?\s*", content, re.I)
    if not m:
        raise _NotThat(f"{content.strip()!r} is not an ordinal number")
    n = m.group(1)
    if lang == "zh":
        return "第" + zh_number(n)
    # Past MAX_DIGITS the front end reads numbers digit by digit (no number word table sees them).
    return _digit_words(n, lang) if len(n) > MAX_DIGITS else en_ordinal(int(n))


def _digits_reading(content: str, lang: Lang) -> str:
    if not re.fullmatch(r"[\d\s.,-]*\d[\d\s.,-]*", content):
        raise _NotThat(f"{content.strip()!r} is not a run of digits")
    return _digit_words(re.sub(r"\D", "", content), lang)


def _telephone(content: str, lang: Lang) -> str:
    if not re.fullmatch(r"\s*\+?[\d\s().-]*\d[\d\s().-]*", content):
        raise _NotThat(f"{content.strip()!r} is not a telephone number")
    groups = re.findall(r"\d+", content)
    # Group by group, digit by digit, with 幺 for 1 in Chinese: as zh.py reads phone numbers.
    words = [_digit_words(g, lang, one="幺") for g in groups]
    plus = ("加" if lang == "zh" else "plus ") if content.strip().startswith("+") else ""
    return plus + ("，" if lang == "zh" else ", ").join(words)


def _characters(content: str, lang: Lang) -> str:
    out = []
    for ch in content:
        if ch.isdigit() and ch.isascii():
            out.append(_digit_words(ch, lang))
        elif ch.isascii() and ch.isalpha():
            out.append(ch.upper())  # a lone lower-case "a" reads as the article
        elif CJK_RE.match(ch) or ch.isalpha():
            out.append(ch)
    if not out:
        raise _NotThat(f"{content.strip()!r} has no characters to spell")
    return " ".join(out)


def _date(content: str, lang: Lang, fmt: Optional[str]) -> str:
    fields = re.split(r"[-/.\s]+", content.strip())
    # isdecimal, not isdigit: int() reads only the former ("²" is a digit it refuses). The
    # length bound comes before any int(): thousands of digits are past int()'s own limit.
    if not all(f.isdecimal() for f in fields):
        raise _NotThat(f"{content.strip()!r} is not a date of numbers")
    if any(len(f) > MAX_DATE_FIELD_DIGITS for f in fields):
        raise _NotThat(f"{content.strip()[:40]!r} has a field of more than {MAX_DATE_FIELD_DIGITS} digits")
    if fmt is None:  # documented default: ISO order when it starts with a year, else US order
        fmt = {3: "ymd" if len(fields[0]) == 4 else "mdy", 2: "md", 1: "y"}.get(len(fields), "")
    if len(fields) != len(fmt):
        raise _NotThat(f"{content.strip()!r} does not have the {len(fmt)} field(s) of format {fmt!r}")
    parts = dict(zip(fmt, fields))
    year, month, day = parts.get("y"), parts.get("m"), parts.get("d")
    if (month is not None and not 1 <= int(month) <= 12) or (day is not None and not 1 <= int(day) <= 31) or \
            (year is not None and len(year) > 4):
        raise _NotThat(f"{content.strip()!r} is not a date in format {fmt!r}")
    if lang == "zh":  # always year, month, day; years digit by digit, as zh.py reads them
        return "".join(((_digit_words(year, "zh") + "年") if year else "",
                        (zh_integer(int(month)) + "月") if month else "",
                        (zh_integer(int(day)) + "日") if day else ""))
    month_name = _MONTHS[int(month) - 1] if month else ""
    year_words = en_year(int(year)) if year else ""
    if day and fmt.startswith("d"):
        head = f"the {en_ordinal(int(day))}" + (f" of {month_name}" if month else "")
    elif day:
        head = f"{month_name} {en_ordinal(int(day))}".strip()
    else:
        head = month_name
    return f"{head}, {year_words}" if head and year_words and day else " ".join(w for w in (head, year_words) if w)


def _read_say_as(kind: str, content: str, lang: Lang, fmt: Optional[str]) -> str:
    if kind == "date":
        return _date(content, lang, fmt)
    return {"characters": _characters, "cardinal": _cardinal, "ordinal": _ordinal, "digits": _digits_reading,
            "telephone": _telephone}[kind](content, lang)


# --------------------------------------------------------------------------- #
# The parser's event handler
# --------------------------------------------------------------------------- #


@dataclass
class _Frame:
    """An open element and what it sets for its content."""

    name: str
    offset: int  # of its start tag, in the input
    voice: Optional[str]
    rate: float
    lang: Optional[Lang]
    kind: str = "normal"  # normal | silent | say-as | sub | break
    say_as: str = ""
    fmt: Optional[str] = None
    alias: str = ""
    seconds: float = 0.0
    content: List[str] = field(default_factory=list)


@dataclass
class _Part:
    text: str
    start: int
    end: int
    resolved: bool = False  # say-as or sub: already speakable words
    say_as: str = ""  # say-as content is read when the document's language is known
    fmt: Optional[str] = None
    lang: Optional[Lang] = None


@dataclass
class _OpenPiece:
    voice: Optional[str]
    rate: float
    boundary_before: bool
    parts: List[_Part] = field(default_factory=list)


class _Handler:
    """The target of defusedxml's parser: makes pieces as elements open and close."""

    def __init__(self, text: str, base: int, lang: Optional[Lang], max_depth: int, max_break_total_s: float):
        self.input = text  # the caller's input
        self.base = base  # where the parsed part starts in it
        self.source = text[base:]  # what the parser reads; offsets below are into it
        self.encoded = self.source.encode("utf-8")
        self.lang = lang
        self.max_depth = max_depth
        self.max_break_total_s = max_break_total_s
        self.expat = None  # the parser's expat object, set once the parser exists
        self.stack: List[_Frame] = []
        self.pieces: List[Union[_OpenPiece, SsmlBreak]] = []
        self.open: Optional[_OpenPiece] = None
        self.boundary = True
        self.break_total = 0.0
        self.unsupported: Dict[str, None] = {}
        self.pending: Optional[Tuple[int, str]] = None  # a text chunk waiting for its end offset
        self._byte, self._char = 0, 0

    # ---- positions -------------------------------------------------------- #

    def char_offset(self, byte_index: int) -> int:
        """Character offset in ``source`` of a byte offset of its UTF-8 form; events arrive in
        order, so each byte is decoded once."""
        if byte_index < self._byte:
            self._byte, self._char = 0, 0
        self._char += len(self.encoded[self._byte:byte_index].decode("utf-8", errors="replace"))
        self._byte = byte_index
        return self._char

    def here(self) -> int:
        offset = self.char_offset(self.expat.CurrentByteIndex)
        self.close_chunk(offset)
        return offset

    def line_column(self, offset: int) -> Tuple[int, int]:
        """1-based line and column in the caller's input of an offset into ``source``."""
        offset += self.base
        line = self.input.count("\n", 0, offset) + 1
        return line, offset - (self.input.rfind("\n", 0, offset) + 1) + 1

    def error(self, message: str, offset: int, element: Optional[str] = None) -> InvalidSSMLError:
        line, column = self.line_column(offset)
        where = f"<{element}> at line {line}, column {column}" if element else f"line {line}, column {column}"
        return InvalidSSMLError(f"{where}: {message}", element, line, column)

    def element_end(self, frame: _Frame, offset: int) -> int:
        """Offset just past the element whose end event came at ``offset``: there for an
        empty-element tag (``<break/>``: its end event comes after the ``/>``), else past the
        end tag that starts there."""
        if self.start_tag_end(frame.offset) == offset and self.source.startswith("/>", offset - 2):
            return offset
        return self.source.index(">", offset) + 1

    def start_tag_end(self, offset: int) -> int:
        """Offset just past the start tag at ``offset`` (a ">" inside a quoted value is no end)."""
        quote = None
        for i in range(offset + 1, len(self.source)):
            ch = self.source[i]
            if quote:
                quote = None if ch == quote else quote
            elif ch in "\"'":
                quote = ch
            elif ch == ">":
                return i + 1
        return len(self.source)

    # ---- pieces ----------------------------------------------------------- #

    def report(self, name: str) -> None:
        self.unsupported.setdefault(name, None)

    def flush(self) -> None:
        self.open = None

    def add(self, part: _Part) -> None:
        top = self.stack[-1]
        if self.open is None or (self.open.voice, self.open.rate) != (top.voice, top.rate):
            if not part.resolved and not part.text.strip():
                if self.open is not None:  # a separator: it opens no piece of its own
                    self.open.parts.append(part)
                return
            self.open = _OpenPiece(top.voice, top.rate, self.boundary)
            self.pieces.append(self.open)
        if part.resolved or part.text.strip():
            self.boundary = False  # consumed by the first piece with something in it
        self.open.parts.append(part)

    def close_chunk(self, end: int) -> None:
        if self.pending is not None:
            start, text = self.pending
            self.pending = None
            self.add(_Part(text, start, end))

    # ---- parser events ---------------------------------------------------- #

    def data(self, text: str) -> None:
        offset = self.here()
        top = self.stack[-1]
        if top.kind in ("say-as", "sub"):
            top.content.append(text)
        elif top.kind == "normal":
            self.pending = (offset, text)
        elif text.strip():  # silent elements' text is dropped; <break> has no content
            if top.kind == "break":
                raise self.error("may not contain text", top.offset, "break")

    def comment(self, text: str) -> None:
        self.here()  # a text chunk before a comment ends there

    def pi(self, target: str, text: str) -> None:
        self.here()

    def start(self, tag: str, attrib: Dict[str, str]) -> None:
        offset = self.here()
        name = _local(tag)
        if len(self.stack) >= self.max_depth:
            raise self.error(f"elements nest deeper than {self.max_depth} levels", offset, name)
        if not self.stack:
            if name != "speak":
                raise self.error("the root element must be <speak>", offset, name)
            self.stack.append(_Frame(name, offset, None, 1.0, _lang_of(attrib.get(_XML_LANG)) or self.lang))
            self.check_attributes(name, attrib)
            return
        parent = self.stack[-1]
        if parent.kind in ("say-as", "sub", "break"):
            raise self.error(f"<{parent.name}> may only contain text", offset, name)
        frame = _Frame(name, offset, parent.voice, parent.rate, _lang_of(attrib.get(_XML_LANG)) or parent.lang)
        if parent.kind == "silent":  # nothing inside is spoken or reported
            frame.kind = "silent"
            self.stack.append(frame)
            return
        if name == "speak":
            raise self.error("<speak> may only be the root element", offset, name)
        elif name in ("p", "s"):
            self.flush()
            self.boundary = True
        elif name == "break":
            frame.kind = "break"
            frame.seconds = self.break_seconds(attrib, offset)
        elif name == "prosody":
            if "rate" in attrib:
                factor = _parse_rate(attrib["rate"])
                if factor is None:
                    raise self.error(f"rate {attrib['rate']!r} is not a rate (x-slow, slow, medium, fast, x-fast, "
                                     "80%, +20%, -20% or a multiplier such as 1.5)", offset, name)
                frame.rate = min(MAX_RATE, max(MIN_RATE, parent.rate * factor))
        elif name == "voice":
            voice = attrib.get("name", "").strip()
            if not voice:
                raise self.error("needs a name attribute", offset, name)
            if len(voice) > MAX_SPEAKER_CHARS:
                raise self.error(f"name is {len(voice)} characters; a voice is at most {MAX_SPEAKER_CHARS}",
                                 offset, name)
            frame.voice = voice
        elif name == "say-as":
            value = attrib.get("interpret-as", "").strip().lower()
            if not value:
                raise self.error("needs an interpret-as attribute", offset, name)
            fmt = attrib.get("format")
            if value in _SAY_AS:
                frame.kind, frame.say_as = "say-as", _SAY_AS[value]
                if fmt is not None and frame.say_as == "date":
                    if fmt.strip().lower() not in _DATE_FORMATS:
                        raise self.error(f"format {fmt!r} is not a date format ({', '.join(_DATE_FORMATS)})",
                                         offset, name)
                    frame.fmt = fmt.strip().lower()
            else:
                self.report(f"say-as:{value}")  # time, currency, fraction...: the front end reads them
        elif name == "sub":
            if "alias" not in attrib:
                raise self.error("needs an alias attribute", offset, name)
            frame.kind, frame.alias = "sub", attrib["alias"]
        elif name in _SILENT_ELEMENTS:
            frame.kind = "silent"
            self.report(name)
        else:
            self.report(name)
        self.check_attributes(name, attrib)
        self.stack.append(frame)

    def check_attributes(self, name: str, attrib: Dict[str, str]) -> None:
        known = _KNOWN_ATTRIBUTES.get(name)
        if known is None:
            return  # the element itself is reported
        for attr in attrib:
            if not attr.startswith("{") and attr not in known:  # namespaced ones: xml:lang, vendors'
                self.report(f"{name}@{attr}")

    def break_seconds(self, attrib: Dict[str, str], offset: int) -> float:
        if "time" in attrib:  # SSML: time wins over strength
            seconds = _parse_duration(attrib["time"])
            if seconds is None:
                raise self.error(f"time {attrib['time']!r} is not a duration (e.g. 500ms, 1.5s)", offset, "break")
            if seconds > MAX_BREAK_SECONDS:
                raise self.error(f"time {attrib['time']!r} is longer than the {MAX_BREAK_SECONDS:g} s a break may "
                                 "last", offset, "break")
        else:
            strength = attrib.get("strength", "medium").strip().lower()
            if strength not in _STRENGTH_SECONDS:
                raise self.error(f"strength {attrib['strength']!r} is not one of {', '.join(_STRENGTH_SECONDS)}",
                                 offset, "break")
            seconds = _STRENGTH_SECONDS[strength]
        self.break_total += seconds
        if self.break_total > self.max_break_total_s:
            raise RequestTooLarge(f"the breaks add up to more than {self.max_break_total_s:g} s of silence (at "
                                  f"<break> line {self.line_column(offset)[0]}): use fewer or shorter breaks")
        return seconds

    def end(self, tag: str) -> None:
        offset = self.here()
        frame = self.stack.pop()
        if frame.kind == "break":
            self.flush()
            if frame.seconds > 0:
                span = (self.base + frame.offset, self.base + self.element_end(frame, offset))
                self.pieces.append(SsmlBreak(frame.seconds, span))
        elif frame.kind == "sub":
            self.add(_Part(frame.alias, frame.offset, self.element_end(frame, offset), resolved=True))
        elif frame.kind == "say-as":
            self.add(_Part("".join(frame.content), frame.offset, self.element_end(frame, offset), resolved=True,
                           say_as=frame.say_as, fmt=frame.fmt, lang=frame.lang))
        elif frame.name in ("p", "s") and frame.kind == "normal":
            self.flush()
            self.boundary = True

    def close(self) -> SsmlDocument:
        return SsmlDocument(tuple(self.finish()), tuple(self.unsupported))

    # ---- pieces once the whole document is read --------------------------- #

    def finish(self) -> List[SsmlPiece]:
        # The language say-as content falls back to: the document's, from all its plain text.
        plain = " ".join(p.text for piece in self.pieces if isinstance(piece, _OpenPiece) for p in piece.parts
                         if not p.resolved)
        doc_lang = self.lang or detect_language(plain)
        out: List[SsmlPiece] = []
        boundary = True
        for piece in self.pieces:
            if isinstance(piece, SsmlBreak):
                out.append(piece)
                continue
            boundary = boundary or piece.boundary_before
            text_piece = self.text_piece(piece, doc_lang, boundary)
            if text_piece is not None:
                out.append(text_piece)
                boundary = False
        return out

    def text_piece(self, piece: _OpenPiece, doc_lang: Lang, boundary: bool) -> Optional[SsmlText]:
        own = " ".join(p.text for p in piece.parts if not p.resolved)
        lang = detect_or(own, doc_lang)
        texts: List[Tuple[str, bool]] = []
        start = end = None
        for part in piece.parts:
            if part.say_as:
                try:
                    words = _read_say_as(part.say_as, part.text, part.lang or lang, part.fmt)
                except _NotThat as exc:
                    raise self.error(f"interpret-as {part.say_as!r}: {exc}", part.start, "say-as") from None
            else:
                words = part.text
            texts.append((words, part.resolved))
            s, e = self.trimmed(part)
            if s < e:
                start = s if start is None else min(start, s)
                end = e if end is None else max(end, e)
        text = _PUNCT_SPACE_RE.sub("", re.sub(r"\s+", " ", _join(texts))).strip()
        if not text or start is None:
            return None
        return SsmlText(text, (self.base + start, self.base + end), piece.voice, piece.rate, boundary)

    def trimmed(self, part: _Part) -> Span:
        if part.resolved:
            return part.start, part.end
        src = self.source[part.start:part.end]
        stripped = src.strip()
        if not stripped:
            return part.start, part.start
        lead = len(src) - len(src.lstrip())
        return part.start + lead, part.start + lead + len(stripped)


_PUNCT_SPACE_RE = re.compile(r" +(?=[，。、；：！？,.;:!?])")


def _join(texts: List[Tuple[str, bool]]) -> str:
    """The piece's text: say-as and sub words are words of their own, so a space keeps them off
    Latin letters and digits beside them ("Call" + "one two" -> "Call one two"); beside CJK
    text they join without one, as Chinese is written."""
    out = ""
    prev_resolved = False
    for words, resolved in texts:
        if out and words and (resolved or prev_resolved) and _word_char(out[-1]) and _word_char(words[0]):
            out += " "
        out += words
        prev_resolved = resolved
    return out


def _word_char(ch: str) -> bool:
    return ch.isalnum() and not CJK_RE.match(ch)


def parse_ssml(
    text: str,
    *,
    lang: Optional[Lang] = None,
    max_chars: int = MAX_SSML_CHARS,
    max_depth: int = MAX_DEPTH,
    max_break_total_s: float = MAX_BREAK_TOTAL_SECONDS,
) -> SsmlDocument:
    """Read an SSML document (see the module docstring). ``lang``: the request's language, for
    say-as content where no ``xml:lang`` says it. ``max_chars``: the longest input read (the
    Ingress passes ``ingress.max_input_chars``); ``max_depth``: the deepest nesting;
    ``max_break_total_s``: the most silence all breaks together may ask for.

    Raises ``InvalidSSMLError`` (400) for what cannot be read, ``RequestTooLarge`` (413) for an
    input or breaks over their limits."""
    if not isinstance(text, str):
        raise TypeError(f"SSML must be str, got {type(text).__name__}")
    check_lang(lang)
    if len(text) > max_chars:
        raise RequestTooLarge(f"SSML input is {len(text)} characters; the limit is {max_chars}")
    # Blanks and a byte order mark before the document are not XML: parse from its first "<",
    # and count offsets from the caller's input.
    base = len(text) - len(text.lstrip("\ufeff \t\r\n"))
    handler = _Handler(text, base, lang, max_depth, max_break_total_s)
    # The encoding is fixed: the text is a str already, whatever its XML declaration says.
    parser = DefusedXMLParser(target=handler, encoding="utf-8", forbid_dtd=True, forbid_entities=True,
                              forbid_external=True)
    expat = parser.parser
    expat.buffer_text = False  # each text chunk as it comes, at its own position
    handler.expat = expat
    try:
        parser.feed(handler.encoded)
        return parser.close()
    except ParseError as exc:
        message = str(exc).split(":", 1)[0]  # expat's reason; the position is ours (characters)
        offset = handler.char_offset(expat.ErrorByteIndex)
        if handler.source.startswith("</", offset - 2):  # expat points at a mismatched end tag's name
            offset -= 2
        raise handler.error(f"not well-formed SSML: {message}", offset) from None
    except DefusedXmlException:
        doctype = handler.source.find("<!DOCTYPE")
        offset = doctype if doctype >= 0 else handler.char_offset(expat.CurrentByteIndex)
        raise handler.error("DTDs and entity declarations are not allowed in SSML", offset) from None
