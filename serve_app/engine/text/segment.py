"""Splitting text into segments of at most ``max_chars`` and, optionally, ``max_seconds``.

Cuts at sentence ends (。！？.!? and newlines) first, then at clause marks (，、；,;：:), then at
whitespace, then hard; a control tag is never cut. Every split here is lossless: the pieces
joined give the text back.

Length: ``max_chars`` is measured by ``text_length`` (whitespace runs count as one character,
each control tag as ONE: it is a single token for the model; counting it keeps tag-heavy input
bounded without penalising a tag for its spelling). ``max_seconds`` bounds a segment's expected
speech (``pacing.expected_seconds``): the same for every script, where a character limit lets a
Chinese segment speak ~3x longer than an English one.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable, List, Optional, Sequence, Tuple

# The module, not its names: pacing imports .chars and .tags from this package (an import cycle).
from .. import pacing
from . import data
from .chars import WS_RE, is_speakable, sanitize, text_length
from .tags import ATOM_RE, CONTROL_TAG_RE

__all__ = [
    "CLAUSE_PUNCT",
    "CLOSERS",
    "SENTENCE_PUNCT",
    "locate_pieces",
    "pack_text",
    "segment_fits",
    "split_segments",
    "split_sentences",
    "split_unfinished",
]

# Sentence ends, clause breaks, closing quotes/brackets that belong to the sentence they close:
# the one home of these boundaries (the one text cutter: segments here, and a job's chunks with pack_text).
SENTENCE_PUNCT = "。！？!?…"
CLAUSE_PUNCT = "，、；,;：:"
CLOSERS = "\"'”’」』）)】》"
# Words whose trailing "." is not a sentence end.
_ABBREVIATIONS = frozenset(data.load("en.json")["abbreviations"])
_ABBR_TAIL_RE = re.compile(r"[A-Za-z.]{1,12}$")


def _is_full_stop(text: str, i: int) -> bool:
    """Whether the '.' at ``i`` ends a sentence (not 3.5, e.g., Mr., U.S., example.com)."""
    nxt = text[i + 1] if i + 1 < len(text) else ""
    if nxt.isdigit() or (nxt.isascii() and nxt.isalpha()):
        return False
    tail = _ABBR_TAIL_RE.search(text, max(0, i - 12), i)
    if tail:
        word = tail.group().strip(".")
        if word.lower() in _ABBREVIATIONS or "." in word:  # Mr. / e.g. / U.S.
            return False
        if len(word) == 1 and word.isupper():  # initials: J. K. Rowling
            return False
    return True


# Where a sentence may end, or a control tag begin: the only characters split_sentences looks at
# (the rest is skipped in C, so a book is cut in a fraction of a second).
# A "." inside a word or number (3.5, e.g., example.com) is never a boundary: skipped here too.
_BOUNDARY_RE = re.compile("[" + re.escape(SENTENCE_PUNCT) + r"\n\[]|\.(?![A-Za-z0-9])")
_SENTENCE_TAIL_RE = re.compile("[" + re.escape(SENTENCE_PUNCT + "." + CLOSERS) + "]*")


def split_sentences(text: str) -> List[str]:
    """Split after sentence ends (their closing quotes and brackets included) and newlines; never
    inside a control tag. Lossless, linear in the text."""
    pieces: List[str] = []
    start = i = 0
    n = len(text)
    while True:
        m = _BOUNDARY_RE.search(text, i)
        if m is None:
            break
        j = m.start()
        ch = text[j]
        if ch == "[":
            tag = CONTROL_TAG_RE.match(text, j)
            i = tag.end() if tag else j + 1
            continue
        if ch == "\n":
            i = j + 1
        elif ch in SENTENCE_PUNCT or _is_full_stop(text, j):
            i = _SENTENCE_TAIL_RE.match(text, j + 1).end()
        else:  # Mr., U.S., initials
            i = j + 1
            continue
        pieces.append(text[start:i])
        start = i
    if start < n:
        pieces.append(text[start:])
    return pieces


def _split_clauses(text: str) -> List[str]:
    """Split after commas/semicolons/colons, except inside numbers (1,000 / 10:30)."""
    pieces: List[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch not in CLAUSE_PUNCT:
            continue
        if ch in ",:" and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit():
            continue
        pieces.append(text[start : i + 1])
        start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _split_words(text: str) -> List[str]:
    """Split at whitespace (tags contain none, so they stay whole)."""
    return [p for p in re.findall(r"\s*\S+\s*|\s+", text)]


def _hard_cut(text: str, fits: Callable[[str], bool]) -> List[str]:
    """Last resort: greedy runs of atoms that fit (a control tag is one atom, never cut)."""
    out: List[str] = []
    cur = ""
    for atom in ATOM_RE.findall(WS_RE.sub(" ", text)):
        if cur and not fits(cur + atom):
            out.append(cur)
            cur = ""
        cur += atom
    if cur:
        out.append(cur)
    return out


_SPLITTERS: Tuple[Callable[[str], List[str]], ...] = (_split_clauses, _split_words)


def _fit(
    piece: str, fits: Callable[[str], bool], level: int = 0, prefer: Optional[Callable[[str], bool]] = None
) -> List[str]:
    """Break ``piece`` into pieces that each fit, using ever finer cut points. ``prefer`` (a
    stricter test) only drives the first, clause-level cut: never a cut inside a clause."""
    if (prefer if prefer is not None and level == 0 else fits)(piece):
        return [piece]
    if level >= len(_SPLITTERS):
        return _hard_cut(piece, fits)
    parts = _SPLITTERS[level](piece)
    if len(parts) <= 1:
        return _fit(piece, fits, level + 1)
    return [fitted for part in parts for fitted in _fit(part, fits, level + 1)]


def _pack(pieces: Sequence[str], fits: Callable[[str], bool]) -> List[str]:
    """Greedily merge neighbouring pieces while the result fits."""
    out: List[str] = []
    cur = ""
    for p in pieces:
        if not p.strip():
            cur += p
            continue
        if cur.strip() and not fits(cur + p):
            out.append(cur)
            cur = p
        else:
            cur += p
    if cur.strip():
        out.append(cur)
    return [WS_RE.sub(" ", s).strip() for s in out]


def _absorb_unspeakable(segments: List[str], fits: Callable[[str], bool]) -> List[str]:
    """Attach tag/punctuation-only segments to a neighbour when they fit, else drop them."""
    out: List[str] = []
    carry = ""
    for seg in segments:
        if carry:
            joined = f"{carry} {seg}"
            if fits(joined):
                seg = joined
            carry = ""
        if is_speakable(seg):
            out.append(seg)
            continue
        joined = f"{out[-1]} {seg}" if out else ""
        if out and fits(joined):
            out[-1] = joined
        else:
            carry = seg
    return out


def check_max_chars(max_chars: int) -> None:
    if not isinstance(max_chars, int) or isinstance(max_chars, bool) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive int, got {max_chars!r}")


def _check_max_seconds(max_seconds: Optional[float]) -> None:
    if max_seconds is not None and (isinstance(max_seconds, bool) or not max_seconds > 0):
        raise ValueError(f"max_seconds must be a positive number or None, got {max_seconds!r}")


def segment_fits(text: str, max_chars: int, max_seconds: Optional[float] = None) -> bool:
    """Whether ``text`` is short enough for one segment: ``max_chars`` (``text_length``) and,
    when given, ``max_seconds`` of expected speech (``pacing.expected_seconds``), which is the
    same for every script where characters are not (a CJK character speaks ~3x a Latin one).
    ``max_seconds`` is met by cuts at sentence ends and clauses only; a longer clause stays whole."""
    if text_length(text) > max_chars:
        return False
    return max_seconds is None or pacing.expected_seconds(text) <= max_seconds


def split_segments(text: str, max_chars: int = 120, max_seconds: Optional[float] = None) -> List[str]:
    """Split text into speakable segments of at most ``max_chars`` (see ``text_length``) and,
    when given, ``max_seconds`` of expected speech (reached by cuts at sentence ends and
    clauses only: a clause that speaks longer stays whole, never cut inside).

    Cuts at sentence ends (。！？.!? and newlines) first, then at ，、；,;：: for
    sentences that are still too long, then at whitespace, then hard. Control tags are
    never cut; neighbouring short sentences are merged greedily up to the limits; segments
    with nothing speakable are attached to a neighbour or dropped (so "。。。" -> []).
    Whitespace runs are collapsed to one space.
    """
    if not isinstance(text, str):
        raise ValueError(f"text must be str, got {type(text).__name__}")
    check_max_chars(max_chars)
    _check_max_seconds(max_seconds)

    def fits(piece: str) -> bool:
        return segment_fits(piece, max_chars, max_seconds)

    def fits_chars(piece: str) -> bool:
        return text_length(piece) <= max_chars

    text = sanitize(text)
    if not is_speakable(text):
        return []
    segments: List[str] = []
    current = ""
    for sentence in split_sentences(text):
        if fits(sentence):
            if current.strip() and not fits(current + sentence):
                segments.append(current)
                current = ""
            current += sentence  # short sentences merge greedily
            continue
        # A sentence cut at commas starts its own segment (the cut before it stays at the
        # sentence end); its last chunk may still take in the short sentences after it.
        if current.strip():
            segments.append(current)
        chunks = _pack(_fit(sentence, fits_chars, prefer=fits), fits)
        segments.extend(chunks[:-1])
        current = chunks[-1] if chunks else ""
    if current.strip():
        segments.append(current)
    segments = [WS_RE.sub(" ", s).strip() for s in segments]
    return _absorb_unspeakable(segments, fits_chars)


def split_unfinished(text: str, max_chars: int = 120, max_seconds: Optional[float] = None) -> Tuple[str, str]:
    """Incremental cutting of text that is still being written (a streaming session): returns
    ``(complete, rest)``, the part that can be spoken now and the unfinished part to keep
    buffering; ``complete + rest == text`` (whitespace runs aside).

    A sentence is complete once more text follows it, or at once when it ends with 。！？!?…
    (closing quotes after it included), a newline, or a "." that ends a sentence (not Mr., e.g.,
    initials). A final "." after a digit waits for the next character: it may become 3.5.
    (LLM tokens rarely end in the "." of example.com: ".com" is one token.) An unfinished sentence that no longer fits ``max_chars``
    / ``max_seconds`` (``segment_fits``) is cut where ``split_segments`` would cut it (clauses,
    then whitespace for a clause over ``max_chars``), and its last piece stays buffered, as it
    may still grow. Splitting ``complete`` into segments is the caller's (``split_segments``).
    """
    check_max_chars(max_chars)
    _check_max_seconds(max_seconds)
    sentences = split_sentences(text)
    if not sentences:
        return "", text
    last = sentences[-1]
    done = "".join(sentences[:-1])
    tail = last.rstrip(CLOSERS)
    stop = tail.endswith(".") and not tail[-2:-1].isdigit() and _is_full_stop(tail, len(tail) - 1)
    if stop or tail.endswith("\n") or (tail and tail[-1] in SENTENCE_PUNCT):
        return done + last, ""
    if segment_fits(last, max_chars, max_seconds):
        return done, last
    pieces = _fit(last, lambda p: text_length(p) <= max_chars, prefer=lambda p: segment_fits(p, max_chars, max_seconds))
    return done + "".join(pieces[:-1]), pieces[-1]


def pack_text(text: str, max_chars: int) -> List[str]:
    """``text`` cut into pieces of at most ``max_chars`` characters (``len``), for work that is cut
    before it is planned (a job's chunks): whole sentences packed greedily; a sentence longer than
    that cut after its last clause mark that fits, else its last whitespace, else at
    ``max_chars`` (never inside a control tag). Lossless (joined, the pieces are the text) and
    linear in the text: a book of a million characters is cut in well under a second."""
    check_max_chars(max_chars)
    pieces: List[str] = []
    current = ""
    for sentence in split_sentences(text):
        if len(current) + len(sentence) <= max_chars:
            current += sentence  # short sentences pack greedily
            continue
        if current:
            pieces.append(current)
            current = ""
        at = 0
        while len(sentence) - at > max_chars:
            cut = _cut_point(sentence, at, max_chars)
            pieces.append(sentence[at:cut])
            at = cut
        current = sentence[at:]
    if current:
        pieces.append(current)
    return pieces


# A clause mark that may end a piece: not the "," or ":" inside a number (1,000 / 10:30).
_CLAUSE_CUT_RE = re.compile(
    r"[" + re.escape(CLAUSE_PUNCT.replace(",", "").replace(":", "")) + r"]|[,:](?!\d)|(?<!\d)[,:]"
)
_SPACE_CUT_RE = re.compile(r"\s+")


def _cut_point(text: str, at: int, max_chars: int) -> int:
    """Where the piece of ``text`` from ``at`` (longer than ``max_chars``) ends: after the last
    clause mark within ``max_chars``, else after the last whitespace, else ``max_chars`` on; never
    inside a control tag."""
    end = at + max_chars
    cut = 0
    for pattern in (_CLAUSE_CUT_RE, _SPACE_CUT_RE):
        for m in pattern.finditer(text, at, end + 1):  # one past: "1," at the edge is no clause end
            if m.end() <= end:
                cut = m.end()
        if cut:
            return cut
    cut = end
    for tag in CONTROL_TAG_RE.finditer(text, max(at, cut - _LONGEST_TAG), cut + _LONGEST_TAG):
        if tag.start() < cut < tag.end():  # the tag runs past the cut: before it, or (at the start) after
            return tag.start() if tag.start() > at else tag.end()
    return cut


# Characters of the longest control tag looked for around a cut (CONTROL_TAG_RE; a number of
# more digits than any tag takes is not kept whole).
_LONGEST_TAG = 64


def _skipped(ch: str) -> bool:
    """Characters ``sanitize`` and the splitter drop or turn into the whitespace they collapse."""
    return ch.isspace() or unicodedata.category(ch) in ("Cf", "Cc", "Cs", "Co", "Zl", "Zp")


def locate_pieces(text: str, pieces: List[str]) -> List[Optional[tuple[int, int]]]:
    """Where each of ``pieces`` (``split_segments(text)``, in order) lies in ``text``: (start, end)
    character offsets from its first to its last non-blank character. The splitter only drops
    control characters and collapses whitespace, so a piece's other characters appear in ``text``
    in order; a piece that cannot be matched (it should not happen) gets None and the next piece is
    looked for from the same place."""
    spans: List[Optional[tuple[int, int]]] = []
    pos = 0
    for piece in pieces:
        want = [c for c in piece if not _skipped(c)]
        i, k, start = pos, 0, None
        while k < len(want) and i < len(text):
            ch = text[i]
            if _skipped(ch):
                i += 1
                continue
            if ch != want[k]:
                break
            if start is None:
                start = i
            k += 1
            i += 1
        if want and k == len(want) and start is not None:
            spans.append((start, i))
            pos = i
        else:
            spans.append(None)
    return spans
