"""say-as readings: the speakable words for ``<say-as interpret-as>`` content (characters,
cardinal, ordinal, digits, date, telephone) in Chinese or English.

They use the text front end's number words (``en.py``, ``zh.py``) and have no number rules of
their own. Apart from the XML handling (``ssml_handler.py``), which reads a say-as element's
content with ``_read_say_as`` once the document is read and the piece's language is known."""

from __future__ import annotations

import re
from typing import Optional

from . import data
from .chars import CJK_RE
from .en import en_integer, en_number, en_ordinal, en_year
from .lang import Lang
from .patterns import MAX_DIGITS
from .zh import zh_integer, zh_number

MAX_DATE_FIELD_DIGITS = 4  # a year; a month or a day is fewer

_SAY_AS = {
    "characters": "characters",
    "spell-out": "characters",
    "letters": "characters",
    "verbatim": "characters",
    "cardinal": "cardinal",
    "number": "cardinal",
    "ordinal": "ordinal",
    "digits": "digits",
    "date": "date",
    "telephone": "telephone",
}
_DATE_FORMATS = ("ymd", "mdy", "dmy", "ym", "my", "md", "dm", "y", "m", "d")
_MONTHS = data.load("en.json")["months"]


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
    if (
        (month is not None and not 1 <= int(month) <= 12)
        or (day is not None and not 1 <= int(day) <= 31)
        or (year is not None and len(year) > 4)
    ):
        raise _NotThat(f"{content.strip()!r} is not a date in format {fmt!r}")
    if lang == "zh":  # always year, month, day; years digit by digit, as zh.py reads them
        return "".join(
            (
                (_digit_words(year, "zh") + "年") if year else "",
                (zh_integer(int(month)) + "月") if month else "",
                (zh_integer(int(day)) + "日") if day else "",
            )
        )
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
    return {
        "characters": _characters,
        "cardinal": _cardinal,
        "ordinal": _ordinal,
        "digits": _digits_reading,
        "telephone": _telephone,
    }[kind](content, lang)
