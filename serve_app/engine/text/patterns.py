"""Number patterns and helpers shared by the Chinese and English rules (``zh.py``, ``en.py``).

Each language is an ordered list of passes ``(pattern, replacement)``: the specific shapes
(dates, times, phone numbers, money, units) are read before the generic ones (ranges, plain
numbers), so a later pass never sees digits an earlier one has already turned into words.

Time is linear in the text: every pass is one left-to-right scan whose attempts start only
where a number (or domain) can begin, never again inside one that failed (``EXPR``, a chain
test first; ``DOMAIN_RE``'s lookbehinds), and digit runs longer than a language's bound (``MAX_DIGITS``:
ids, card numbers, floods) are read digit by digit by every rule, so no number word table or
``int()`` ever sees a long run.
"""

from __future__ import annotations

import re
from typing import Callable, Match, Optional, Protocol, Sequence, Tuple

from . import data
from .chars import FULLWIDTH


class Substitution(Protocol):
    """What a pass scans with: a compiled pattern, or an object with the same ``sub``."""

    def sub(self, repl: Callable[[Match[str]], str], string: str) -> str: ...


Rule = Tuple[Substitution, Callable[[Match[str]], str]]

NUM = r"\d+(?:\.\d+)?"
_NB = r"(?<![\d.])"  # number start: not inside another number
MAX_DIGITS = 15  # longer digit runs are read digit by digit (WeTextProcessing's guard is 15 too)

_THOUSANDS_RE = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
_LETTER_DASH_DIGIT_RE = re.compile(r"(?<=[A-Za-z])-(?=\d)|(?<=\d)-(?=[A-Za-z])")

ISO_DATE_RE = re.compile(r"(?<![\d.])(\d{4})\s*([-/.])\s*(\d{1,2})\s*\2\s*(\d{1,2})(?!\d|\.\d)")
EXPR_RE = re.compile(rf"{_NB}-?{NUM}(?:\s*[-+*/×÷]\s*-?{NUM})+\s*=\s*-?{NUM}(?![\d.])")
# A run of numbers joined by operators, maximal: an expression can only end where its chain ends.
_EXPR_CHAIN_RE = re.compile(rf"{_NB}-?{NUM}(?:\s*[-+*/×÷]\s*-?{NUM})*")
_EQUALS_RE = re.compile(r"\s*=")
EXPR_TOKEN_RE = re.compile(rf"(-?{NUM})\s*([-+*/×÷=]?)\s*")
TIME_RE = re.compile(r"(?<![\d:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])")
PHONE_RE = re.compile(
    r"""(?<![\dA-Za-z+-])(?:
        \+\d{1,3}[-\s]?\(?\d{1,4}\)?(?:[-\s]?\d{2,4}){2,4}
      | \(\d{3}\)\s?\d{3}-\d{4}
      | \d{3}-\d{3,4}-\d{4}
      | 0\d{2,3}-\d{7,8}
      | 1[3-9]\d{9}
    )(?![\d-])""",
    re.X,
)
RANGE_RE = re.compile(rf"{_NB}({NUM})(%?)\s*[-~～–—]\s*({NUM})(%?)(?![\d.])")
PERCENT_RE = re.compile(rf"(?<![\dA-Za-z.])(-?)({NUM})\s*([%‰])")
RATIO_RE = re.compile(r"(?<![\d:.])(\d+):(\d+)(?![\d:])")
FRACTION_RE = re.compile(r"(?<![\d/.])(\d+)/(\d+)(?![\d/])")
ORDINAL_RE = re.compile(r"(?<![\d.])(\d+)(st|nd|rd|th)(?![A-Za-z])")
NEGATIVE_RE = re.compile(r"(?<![\dA-Za-z.])-(?=\d)")
PLAIN_NUM_RE = re.compile(r"\d+(?:\.\d+)*")
# Starts at "http(s)://" or where a label begins (not inside "a1.b2.c3...": a match inside one would
# also match from its start): without the lookbehinds a dotted run was scanned again from each label.
DOMAIN_RE = re.compile(
    r"(?:https?://|(?<![A-Za-z0-9_-])(?<![A-Za-z0-9_-]\.))"
    r"(?:[A-Za-z0-9_-]+\.)+(?:com|net|org|cn|io|ai|edu|gov|co|uk|me|dev|app|info)(?![A-Za-z])"
    r"(?:/[A-Za-z0-9_/-]*)?"
)
MONEY_RE = re.compile(
    rf"(-?)([$€£¥])\s?({NUM})(?:\s?(thousand|million|billion|trillion|bn|[kKmMbB]|万亿|亿|万|千)(?![A-Za-z]))?"
)
CHINESE_SCALES = ("万亿", "亿", "万", "千")  # scale words of MONEY_RE that are already Chinese

UNITS = data.load("units.json")["units"]  # symbol -> readings, longest symbol first
UNIT_RE = re.compile(rf"{_NB}({NUM})\s?({'|'.join(re.escape(u) for u in UNITS)})(?![A-Za-z0-9²])")


def common_prep(text: str) -> str:
    """Language-independent clean-up before the rules run."""
    text = _THOUSANDS_RE.sub(lambda m: m.group().replace(",", ""), text)
    text = text.translate(FULLWIDTH)
    return _LETTER_DASH_DIGIT_RE.sub(" ", text)  # "COVID-19" -> "COVID 19"


class _Expressions:
    """``EXPR_RE.sub`` in linear time. ``EXPR_RE`` alone retries from every number of a chain
    that has no "=" after it ("1+1+1+..." scanned again from each "1": quadratic); a match can
    only start where a maximal chain starts and end where it ends, so each chain is tried once."""

    pattern = EXPR_RE.pattern

    def sub(self, repl: Callable[[Match[str]], str], text: str) -> str:
        out, last = [], 0
        pos = 0
        while (chain := _EXPR_CHAIN_RE.search(text, pos)) is not None:
            m = EXPR_RE.match(text, chain.start()) if _EQUALS_RE.match(text, chain.end()) else None
            if m:
                out += [text[last : m.start()], repl(m)]
                last = pos = m.end()  # the scan goes on after the match, as re.sub's does
            else:
                pos = chain.end()
        return "".join(out) + text[last:] if out else text


EXPRESSIONS = _Expressions()  # the arithmetic pass ("1+2=3"), used as a Rule's pattern


def apply_rules(text: str, rules: Sequence[Rule]) -> str:
    for pattern, repl in rules:
        text = pattern.sub(repl, text)
    return text


def symbol_rule(symbols: dict) -> Rule:
    """The pass that reads single symbols (``&`` -> "and") from a ``symbol -> reading`` table."""
    pattern = re.compile("|".join(re.escape(k) for k in symbols))
    return pattern, lambda m: symbols[m.group()]


def valid_date(month: str, day: str) -> bool:
    return 1 <= int(month) <= 12 and 1 <= int(day) <= 31


def valid_time(h: str, m: str, s: Optional[str]) -> bool:
    return int(h) <= 24 and int(m) <= 59 and (s is None or int(s) <= 59)


def _is_code(int_part: str, max_len: int) -> bool:
    """Digit strings read one digit at a time: leading zeros (007) or very long ids."""
    return (len(int_part) > 1 and int_part.startswith("0")) or len(int_part) > max_len


def too_long(*digit_runs: str, max_len: int = MAX_DIGITS) -> bool:
    """Any of these digit strings longer than ``max_len`` (then read digit by digit)."""
    return any(len(d) > max_len for d in digit_runs)


def read_decimal(
    s: str, integer: Callable[[int], str], digits: Callable[[str], str], max_digits: int, point: str, minus: str
) -> str:
    """Read a decimal string ("-3.05"): the integer part as a cardinal (digit by digit when it is
    a code: leading zero or longer than ``max_digits``), the fraction digit by digit."""
    neg = s.startswith("-")
    int_part, _, frac = s.lstrip("-+").partition(".")
    out = digits(int_part) if _is_code(int_part, max_digits) else integer(int(int_part or "0"))
    if frac:
        out += point + digits(frac)
    return (minus if neg else "") + out
