"""The SSML parser's event handler: defusedxml's parser streams its events (start, end, data)
into ``_Handler``, which keeps the open elements on a stack (``max_depth`` deep at most), maps
the parser's byte positions back to characters of the caller's input, checks each element and
its attributes, totals the breaks, and makes the pieces as elements close; once the whole
document is read, it reads say-as content in its piece's language and joins each piece's text.

Apart from ``ssml.py``, the entry point that sets the parser up and turns its errors into
``InvalidSSMLError``, because it is most of the parser."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from ..errors import InvalidSSMLError, RequestTooLarge
from ..types import MAX_SPEAKER_CHARS
from .chars import CJK_RE
from .lang import Lang, detect_language, detect_or
from .lexicon import MARKER_CHARS, phoneme_marker
from .pinyin import PinyinError, parse_pinyin
from .ssml_attributes import (
    _KNOWN_ATTRIBUTES,
    _SILENT_ELEMENTS,
    _STRENGTH_SECONDS,
    _XML_LANG,
    MAX_BREAK_SECONDS,
    MAX_RATE,
    MIN_RATE,
    _lang_of,
    _local,
    _parse_duration,
    _parse_rate,
)
from .ssml_pieces import Span, SsmlBreak, SsmlDocument, SsmlPiece, SsmlText
from .ssml_say_as import _DATE_FORMATS, _SAY_AS, _NotThat, _read_say_as


@dataclass
class _Frame:
    """An open element and what it sets for its content."""

    name: str
    offset: int  # of its start tag, in the input
    voice: Optional[str]
    rate: float
    lang: Optional[Lang]
    kind: str = "normal"  # normal | silent | say-as | sub | phoneme | break
    say_as: str = ""
    fmt: Optional[str] = None
    alias: str = ""  # sub: the alias; phoneme: the pinyin
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
        self._char += len(self.encoded[self._byte : byte_index].decode("utf-8", errors="replace"))
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
        text = text.translate(_NO_MARKERS)  # a phoneme's marker characters are ours alone
        if top.kind in ("say-as", "sub", "phoneme"):
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
        if parent.kind in ("say-as", "sub", "phoneme", "break"):
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
                    raise self.error(
                        f"rate {attrib['rate']!r} is not a rate (x-slow, slow, medium, fast, x-fast, "
                        "80%, +20%, -20% or a multiplier such as 1.5)",
                        offset,
                        name,
                    )
                frame.rate = min(MAX_RATE, max(MIN_RATE, parent.rate * factor))
        elif name == "voice":
            voice = attrib.get("name", "").strip()
            if not voice:
                raise self.error("needs a name attribute", offset, name)
            if len(voice) > MAX_SPEAKER_CHARS:
                raise self.error(
                    f"name is {len(voice)} characters; a voice is at most {MAX_SPEAKER_CHARS}", offset, name
                )
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
                        raise self.error(
                            f"format {fmt!r} is not a date format ({', '.join(_DATE_FORMATS)})", offset, name
                        )
                    frame.fmt = fmt.strip().lower()
            else:
                self.report(f"say-as:{value}")  # time, currency, fraction...: the front end reads them
        elif name == "sub":
            if "alias" not in attrib:
                raise self.error("needs an alias attribute", offset, name)
            frame.kind, frame.alias = "sub", attrib["alias"]
        elif name == "phoneme":
            alphabet = attrib.get("alphabet", "").strip().lower()
            if alphabet in ("pinyin", "x-pinyin"):
                frame.kind, frame.alias = "phoneme", attrib.get("ph", "")
            else:  # IPA, X-SAMPA...: ChatTTS reads characters; the content is read as written
                self.report(f"phoneme@alphabet={alphabet[:16]}")
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
                raise self.error(
                    f"time {attrib['time']!r} is longer than the {MAX_BREAK_SECONDS:g} s a break may last",
                    offset,
                    "break",
                )
        else:
            strength = attrib.get("strength", "medium").strip().lower()
            if strength not in _STRENGTH_SECONDS:
                raise self.error(
                    f"strength {attrib['strength']!r} is not one of {', '.join(_STRENGTH_SECONDS)}", offset, "break"
                )
            seconds = _STRENGTH_SECONDS[strength]
        self.break_total += seconds
        if self.break_total > self.max_break_total_s:
            raise RequestTooLarge(
                f"the breaks add up to more than {self.max_break_total_s:g} s of silence (at "
                f"<break> line {self.line_column(offset)[0]}): use fewer or shorter breaks"
            )
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
        elif frame.kind == "phoneme":
            self.add(_Part(self.phoneme(frame), frame.offset, self.element_end(frame, offset), resolved=True))
        elif frame.kind == "say-as":
            self.add(
                _Part(
                    "".join(frame.content),
                    frame.offset,
                    self.element_end(frame, offset),
                    resolved=True,
                    say_as=frame.say_as,
                    fmt=frame.fmt,
                    lang=frame.lang,
                )
            )
        elif frame.name in ("p", "s") and frame.kind == "normal":
            self.flush()
            self.boundary = True

    def phoneme(self, frame: _Frame) -> str:
        """A pinyin phoneme as it travels in the piece's text (``lexicon.phoneme_marker``)."""
        written = " ".join("".join(frame.content).split())
        if not written or not all(CJK_RE.match(c) for c in written):
            raise self.error("pinyin is for Chinese characters: put only them inside", frame.offset, "phoneme")
        try:
            syllables = parse_pinyin(frame.alias, chars=len(written))
        except PinyinError as exc:
            raise self.error(f"ph {frame.alias[:40]!r}: {exc}", frame.offset, "phoneme") from None
        return phoneme_marker(written, " ".join(syllables))

    def close(self) -> SsmlDocument:
        return SsmlDocument(tuple(self.finish()), tuple(self.unsupported))

    # ---- pieces once the whole document is read --------------------------- #

    def finish(self) -> List[SsmlPiece]:
        # The language say-as content falls back to: the document's, from all its plain text.
        plain = " ".join(
            p.text for piece in self.pieces if isinstance(piece, _OpenPiece) for p in piece.parts if not p.resolved
        )
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
        src = self.source[part.start : part.end]
        stripped = src.strip()
        if not stripped:
            return part.start, part.start
        lead = len(src) - len(src.lstrip())
        return part.start + lead, part.start + lead + len(stripped)


_NO_MARKERS = {ord(c): " " for c in MARKER_CHARS}
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
