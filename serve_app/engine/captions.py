"""Captions for synthesized speech: timed segment texts -> SRT and WebVTT.

Input: ``TimedText(start_s, end_s, text, speaker)`` items in audio order, one per synthesized
segment (or plain 4-tuples in that order). The service knows each segment's exact start and end
in the audio; it has no word timing (ChatTTS has no aligner). So:

* **Segment boundaries are exact**: a segment's first cue starts at its start, its last cue ends
  at its end.
* **Inside a segment the times are an estimate**: a text that needs several cues is split into
  consecutive cues whose times divide the segment's span in proportion to their expected
  speaking time (``pacing.expected_seconds``: a CJK character speaks ~3x a Latin letter, a pause
  mark adds its pause), not to their character counts.

Layout (``CaptionLayout``): at most ``max_lines`` (2) lines per cue, each at most
``max_line_chars`` (42) characters for Latin-script text, or ``max_cjk_line_chars`` (16)
characters for Chinese text. 42 is the common limit for Latin scripts (Netflix's English timed
text style guide, the BBC's 37-42); 16 is Netflix's for Simplified and Traditional Chinese, as
full-width characters take about twice a Latin letter's width and are read one by one. Widths
are measured in display columns (a full-width character counts 2, anything else 1), and the
limit is ``max_line_chars`` columns for text whose dominant script is Latin,
``2 * max_cjk_line_chars`` for text whose dominant script is CJK, so Latin words inside Chinese
text count what they take on screen.

Cuts: a cue ends at a sentence end if it can, else at a clause mark (，、；：,;: ...), else between
words (Latin, at spaces) or between characters (CJK, never before closing punctuation or after
an opening bracket); a Latin word is never cut (one longer than a line gets a line of its own).
Inside a cue the line break goes after punctuation when both lines fit, else where the two lines
are most even. ChatTTS control tags (``[uv_break]``, ``[laugh]``) are dropped.

Speakers: WebVTT puts a cue's speaker in a voice span, ``<v Name>...</v>``; SRT has none, so the
cue's first line starts with ``Name: ``. That prefix counts against the first line's width (at
most half of it) in both formats, so a cue is cut the same in either. Every cue of a speaker
carries it (each cue stands alone in a player).

Timestamps are whole milliseconds (SRT ``00:00:01,250``, WebVTT ``00:00:01.250``); cues never
overlap and always have end > start (a segment shorter than 1 ms gets no cue).
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Tuple, Union

from .pacing import expected_seconds
from .text.chars import CJK_RE
from .text.lang import detect_language
from .text.tags import CONTROL_TAG_RE

__all__ = [
    "CAPTION_TYPES",
    "CaptionLayout",
    "Cue",
    "TimedText",
    "build_cues",
    "caption_file",
    "caption_text",
    "format_timestamp",
    "to_srt",
    "to_webvtt",
]

# What a caption file is served as (WebVTT's registered type; SubRip has none, this is common use).
CAPTION_TYPES: dict[str, str] = {"srt": "application/x-subrip", "vtt": "text/vtt"}


@dataclass(frozen=True)
class TimedText:
    start_s: float  # where the segment's audio starts in the response
    end_s: float
    text: str
    speaker: Optional[str] = None


@dataclass(frozen=True)
class CaptionLayout:
    max_line_chars: int = 42
    max_cjk_line_chars: int = 16
    max_lines: int = 2

    def __post_init__(self) -> None:
        for name in ("max_line_chars", "max_cjk_line_chars", "max_lines"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class Cue:
    start_ms: int
    end_ms: int
    lines: Tuple[str, ...]
    speaker: Optional[str] = None


Item = Union[TimedText, Tuple[float, float, str], Tuple[float, float, str, Optional[str]]]

# --------------------------------------------------------------------------- #
# Atoms: the pieces a line is made of, and where a cut may go
# --------------------------------------------------------------------------- #

_SENTENCE_END = "。！？!?…."
_CLAUSE_END = "，、；：,;:—–"
_CLOSERS = "\"'”’」』）)】》〉]}"
# Never at the start of a line (closing punctuation), never at the end of one (opening brackets).
_NO_LINE_START = frozenset(_SENTENCE_END + _CLAUSE_END + _CLOSERS + "%‰·～~")
_NO_LINE_END = frozenset("“‘「『（(【《〈[{")
_FULL_WIDTH_PUNCT = frozenset("，。、；：！？…）」』】》〉”’—～")


@dataclass(frozen=True)
class _Atom:
    text: str
    space_after: bool  # a space separates it from the next atom
    level: int  # what a cut after it ends: 2 a sentence, 1 a clause, 0 neither
    width: int


def _width(text: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)


def _is_cjk(ch: str) -> bool:
    return bool(CJK_RE.match(ch))


def _level(text: str) -> int:
    tail = text.rstrip(_CLOSERS)
    if tail and tail[-1] in _SENTENCE_END:
        return 2
    return 1 if tail and tail[-1] in _CLAUSE_END else 0


def _atoms(text: str) -> List[_Atom]:
    """Whitespace-separated words, and within them a cut between CJK characters (a Latin run
    stays whole; punctuation stays with what it closes)."""
    atoms: List[_Atom] = []
    for m in re.finditer(r"(\S+)(\s*)", text):
        run, space = m.groups()
        pieces, current = [], run[0]
        for prev, ch in zip(run, run[1:]):
            cut = (
                (_is_cjk(ch) or _is_cjk(prev) or prev in _FULL_WIDTH_PUNCT)
                and ch not in _NO_LINE_START
                and prev not in _NO_LINE_END
            )
            if cut:
                pieces.append(current)
                current = ""
            current += ch
        pieces.append(current)
        for i, piece in enumerate(pieces):
            last = i == len(pieces) - 1
            atoms.append(_Atom(piece, bool(space) and last, _level(piece), _width(piece)))
    return atoms


def _join(atoms: Sequence[_Atom]) -> str:
    return "".join(a.text + (" " if a.space_after and i < len(atoms) - 1 else "") for i, a in enumerate(atoms))


def _line_width(atoms: Sequence[_Atom]) -> int:
    return sum(a.width for a in atoms) + sum(1 for a in atoms[:-1] if a.space_after)


# --------------------------------------------------------------------------- #
# Layout: atoms -> cues -> lines
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class _Layout:
    width: int  # columns of a line
    first_width: int  # of a cue's first line (less a speaker prefix in SRT)
    max_lines: int

    def wrap(self, atoms: Sequence[_Atom]) -> List[List[_Atom]]:
        """Greedy lines (the fewest lines); an atom wider than a line gets a line alone."""
        lines: List[List[_Atom]] = []
        line: List[_Atom] = []
        width = 0
        for atom in atoms:
            limit = self.first_width if not lines else self.width
            grown = width + atom.width + (1 if line and line[-1].space_after else 0)
            if line and grown > limit:
                lines.append(line)
                line, grown = [], atom.width
            line.append(atom)
            width = grown
        if line:
            lines.append(line)
        return lines

    def fits(self, atoms: Sequence[_Atom]) -> bool:
        return len(self.wrap(atoms)) <= self.max_lines

    def lines(self, atoms: Sequence[_Atom]) -> Tuple[str, ...]:
        """A cue's lines: greedy, except that two lines break after punctuation when both
        lines still fit, else where they are most even (subtitle style guides)."""
        greedy = self.wrap(atoms)
        if len(greedy) != 2:
            return tuple(_join(line) for line in greedy)
        best, best_key = None, None
        total = _line_width(atoms)
        top = 0  # the width of atoms[:j], grown one atom at a time
        for j in range(1, len(atoms)):
            top += atoms[j - 1].width + (1 if j > 1 and atoms[j - 2].space_after else 0)
            bottom = total - top - (1 if atoms[j - 1].space_after else 0)  # the space at the break goes
            if top > self.first_width or bottom > self.width:
                continue
            key = (-atoms[j - 1].level, abs(top - bottom))
            if best_key is None or key < best_key:
                best, best_key = j, key
        if best is None:
            return tuple(_join(line) for line in greedy)
        return _join(atoms[:best]), _join(atoms[best:])

    def cues(self, atoms: List[_Atom]) -> List[List[_Atom]]:
        """Atoms -> the atoms of each cue: whole sentences where they fit, else whole clauses,
        neighbours merged while they fit. A clause too long for one cue fills cues word by word
        (CJK: character by character), starting in the cue before it when that one is less than
        half full, so a short clause before a long one is no cue of its own."""
        units: List[List[_Atom]] = []
        for sentence in _split_after(atoms, 2):
            units.extend([sentence] if self.fits(sentence) else _split_after(sentence, 1))
        half = (self.first_width + self.width * (self.max_lines - 1)) / 2
        cues: List[List[_Atom]] = []
        for unit in units:
            if self.fits(unit):
                if cues and self.fits(cues[-1] + unit):
                    cues[-1] = cues[-1] + unit
                else:
                    cues.append(unit)
                continue
            current = cues.pop() if cues and _line_width(cues[-1]) < half else []
            for atom in unit:
                if current and not self.fits(current + [atom]):
                    cues.append(current)
                    current = []
                current.append(atom)
            cues.append(current)
        return cues


def _split_after(atoms: List[_Atom], level: int) -> List[List[_Atom]]:
    out: List[List[_Atom]] = []
    current: List[_Atom] = []
    for atom in atoms:
        current.append(atom)
        if atom.level >= level:
            out.append(current)
            current = []
    if current:
        out.append(current)
    return out


# --------------------------------------------------------------------------- #
# Timing
# --------------------------------------------------------------------------- #


def _item(item: Item) -> TimedText:
    if isinstance(item, TimedText):
        return item
    start_s, end_s, text, *speaker = item  # (start, end, text) or (start, end, text, speaker)
    return TimedText(start_s, end_s, text, speaker[0] if speaker else None)


def _check(item: TimedText, previous_end: float) -> None:
    if not (math.isfinite(item.start_s) and math.isfinite(item.end_s)) or item.start_s < 0:
        raise ValueError(f"caption times must be finite and not negative, got {item.start_s!r}..{item.end_s!r}")
    if item.end_s < item.start_s:
        raise ValueError(f"a caption item ends before it starts: {item.start_s!r}..{item.end_s!r}")
    if item.start_s < previous_end - 0.001:  # rounding of the same boundary is not an overlap
        raise ValueError(
            f"caption items must be in audio order without overlap: one starts at {item.start_s!r} "
            f"before the previous one ends at {previous_end!r}"
        )


def _prefix(speaker: Optional[str]) -> str:
    return f"{_clean_speaker(speaker)}: " if speaker else ""


def _clean_speaker(speaker: str) -> str:
    return re.sub(r"\s+", " ", speaker).strip()


_SPACE_BEFORE_PUNCT_RE = re.compile(r" +(?=[，。、；：！？,.;:!?…])")  # where a tag was dropped


def caption_text(text: str) -> str:
    """A segment's text as its captions show it: ChatTTS's control tags dropped, spaces folded
    (the one rule the caption files, the segments of an answer and the web page all use)."""
    return _SPACE_BEFORE_PUNCT_RE.sub("", re.sub(r"\s+", " ", CONTROL_TAG_RE.sub(" ", text))).strip()


def build_cues(items: Iterable[Item], settings: CaptionLayout = CaptionLayout()) -> List[Cue]:
    """The cues for ``items`` (see the module docstring): in order, never overlapping, each
    with end > start. ``ValueError`` for items out of order, overlapping or with bad times."""
    cues: List[Cue] = []
    previous_end_s = 0.0
    previous_end_ms = 0
    for raw in items:
        item = _item(raw)
        _check(item, previous_end_s)
        previous_end_s = max(previous_end_s, item.end_s)
        text = caption_text(item.text)
        start_ms = max(round(item.start_s * 1000), previous_end_ms)
        end_ms = round(item.end_s * 1000)
        atoms = _atoms(text)
        if not atoms or end_ms <= start_ms:
            continue
        cjk = detect_language(text) == "zh"
        width = 2 * settings.max_cjk_line_chars if cjk else settings.max_line_chars
        speaker = _clean_speaker(item.speaker) if item.speaker and item.speaker.strip() else None
        reserve = min(_width(_prefix(speaker)), width // 2)
        layout = _Layout(width, width - reserve, settings.max_lines)
        groups = layout.cues(atoms)
        if len(groups) > end_ms - start_ms:  # under 1 ms a cue: one cue, whatever its lines
            groups = [atoms]
        weights = [expected_seconds(_join(g)) for g in groups]
        total = sum(weights)
        bounds = [start_ms]
        acc = 0.0
        for w in weights[:-1]:
            acc += w
            # Strictly increasing, leaving at least 1 ms for each cue still to come.
            b = start_ms + round((end_ms - start_ms) * acc / total)
            bounds.append(min(max(b, bounds[-1] + 1), end_ms - (len(groups) - len(bounds))))
        bounds.append(end_ms)
        for group, a, b in zip(groups, bounds, bounds[1:]):
            cues.append(Cue(a, b, layout.lines(group), speaker))
        previous_end_ms = end_ms
    return cues


# --------------------------------------------------------------------------- #
# Formats
# --------------------------------------------------------------------------- #


def format_timestamp(ms: int, separator: str = ",") -> str:
    """``HH:MM:SS,mmm`` (SRT; ``separator="."`` for WebVTT); hours take more digits past 99."""
    if ms < 0:
        raise ValueError(f"a timestamp cannot be negative, got {ms}")
    seconds, millis = divmod(ms, 1000)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{millis:03d}"


def to_srt(items: Iterable[Item], settings: CaptionLayout = CaptionLayout()) -> str:
    """SubRip: numbered cues, ``00:00:01,250 --> 00:00:02,000``, a speaker as a ``Name: ``
    prefix on the cue's first line."""
    blocks = []
    for n, cue in enumerate(build_cues(items, settings), 1):
        lines = list(cue.lines)
        lines[0] = _prefix(cue.speaker) + lines[0]
        timing = f"{format_timestamp(cue.start_ms)} --> {format_timestamp(cue.end_ms)}"
        blocks.append("\n".join([str(n), timing, *lines]))
    return "\n\n".join(blocks) + "\n" if blocks else ""


def _vtt_escape(text: str) -> str:
    # WebVTT cue text is markup: &, < and > are escaped (a ">" also keeps "-->" out of it).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def to_webvtt(items: Iterable[Item], settings: CaptionLayout = CaptionLayout()) -> str:
    """WebVTT: ``00:00:01.250 --> 00:00:02.000``, a speaker as a voice span ``<v Name>``."""
    blocks = ["WEBVTT"]
    for cue in build_cues(items, settings):
        lines = [_vtt_escape(line) for line in cue.lines]
        if cue.speaker:
            lines[0] = f"<v {_vtt_escape(cue.speaker)}>" + lines[0]
            lines[-1] += "</v>"
        timing = f"{format_timestamp(cue.start_ms, '.')} --> {format_timestamp(cue.end_ms, '.')}"
        blocks.append("\n".join([timing, *lines]))
    return "\n\n".join(blocks) + "\n"


def caption_file(items: Iterable[Item], fmt: str) -> str:
    """The caption file of ``items`` in ``fmt``: ``"srt"`` (SubRip) or ``"vtt"`` (WebVTT)."""
    if fmt not in CAPTION_TYPES:
        raise ValueError(f"unknown caption format {fmt!r}")
    return to_srt(items) if fmt == "srt" else to_webvtt(items)
