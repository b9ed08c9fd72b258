"""English readings of numbers, dates, times, money, units and symbols (``normalize_numbers_en``).

Number words come from ``num2words``; its hyphens and commas are removed, because ChatTTS reads
both as pauses.
"""

from __future__ import annotations

import re
from typing import Match, Optional, Tuple

from num2words import num2words

from . import data
from .patterns import (
    CHINESE_SCALES,
    DOMAIN_RE,
    EXPR_TOKEN_RE,
    EXPRESSIONS,
    FRACTION_RE,
    ISO_DATE_RE,
    MAX_DIGITS,
    MONEY_RE,
    NEGATIVE_RE,
    ORDINAL_RE,
    PERCENT_RE,
    PHONE_RE,
    PLAIN_NUM_RE,
    RANGE_RE,
    RATIO_RE,
    UNIT_RE,
    UNITS,
    Rule,
    apply_rules,
    common_prep,
    read_decimal,
    symbol_rule,
    too_long,
    valid_date,
    valid_time,
)
from .tags import map_chunks

__all__ = ["en_integer", "en_number", "en_ordinal", "en_year", "normalize_numbers_en"]

_TABLES = data.load("en.json")
_DIGITS = "zero one two three four five six seven eight nine".split()
_MAX_DIGITS = MAX_DIGITS  # longer integers read digit by digit (ids, card numbers), by every rule


def _clean(words: str) -> str:
    # ChatTTS turns "-" into a comma (a pause) and commas are pauses too.
    return words.replace("-", " ").replace(",", "")


def _digits(s: str) -> str:
    return " ".join(_DIGITS[int(c)] for c in s if c.isdigit())


def en_integer(n: int) -> str:
    return _clean(num2words(n))


def en_number(s: str) -> str:
    """Read a decimal string ("-3.05" -> minus three point zero five)."""
    return read_decimal(s, en_integer, _digits, _MAX_DIGITS, point=" point ", minus="minus ")


def en_year(n: int) -> str:
    return _clean(num2words(n, to="year"))


def en_ordinal(n: int) -> str:
    return _clean(num2words(n, to="ordinal"))


def _pad(words: str) -> str:
    """Space out a reading so it never glues onto neighbouring letters (5G -> five G)."""
    return f" {words} "


def _is_year(s: str) -> bool:
    return len(s) == 4 and 1100 <= int(s) <= 2099


# --------------------------------------------------------------------------- #
# Dates
# --------------------------------------------------------------------------- #

_MONTHS = _TABLES["months"]  # January .. December
_MONTH_BY_PREFIX = {m[:3].lower(): m for m in _MONTHS} | {"sept": "September"}
_SHORT_MONTHS = [m[:3] for m in _MONTHS if m[:3] != m]  # "May" is its own short form
_SHORT_MONTHS.insert(_SHORT_MONTHS.index("Sep"), "Sept")
_MONTH_NAMES = "|".join(_MONTHS + _SHORT_MONTHS)
_MONTH_DAY_RE = re.compile(
    rf"(?<![A-Za-z])({_MONTH_NAMES})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?(?!\d|\.\d)"
)
_DAY_MONTH_RE = re.compile(
    rf"(?<![\d.])(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH_NAMES})\.?(?:,?\s+(\d{{4}}))?(?!\d|\.\d)"
)


def _month(name: str) -> str:
    prefix = name[:4].lower()
    return _MONTH_BY_PREFIX[prefix if prefix == "sept" else prefix[:3]]


def _date_tail(year: Optional[str]) -> str:
    return f", {en_year(int(year))}" if year else ""


def _iso_date(m: Match[str]) -> str:
    year, _, month, day = m.groups()
    if not valid_date(month, day):
        return m.group()
    return _pad(f"{_MONTHS[int(month) - 1]} {en_ordinal(int(day))}{_date_tail(year)}")


def _month_day(m: Match[str]) -> str:
    month, day, year = m.groups()
    if not 1 <= int(day) <= 31:
        return m.group()
    return _pad(f"{_month(month)} {en_ordinal(int(day))}{_date_tail(year)}")


def _day_month(m: Match[str]) -> str:
    day, month, year = m.groups()
    if not 1 <= int(day) <= 31:
        return m.group()
    return _pad(f"the {en_ordinal(int(day))} of {_month(month)}{_date_tail(year)}")


def _decade(m: Match[str]) -> str:
    century, decade = m.groups()
    words = en_year(int(century + decade)) if century else en_integer(int(decade))
    words = words[:-1] + "ies" if words.endswith("y") else words + "s"
    return _pad(words)


_YEAR_CONTEXT = r"in|since|by|from|until|till|through|during|before|after|around|circa|year|early|late|mid"
_YEAR_RE = re.compile(
    rf"(?i)(?<![A-Za-z])((?:{_YEAR_CONTEXT})\s+)(\d{{4}})(?![\d%]|\.\d|\s?%|\s?[-–~]\s?\d)"
    rf"|(?<![\d.])(\d{{4}})(?=\s?(?:AD|BC|BCE|CE)(?![A-Za-z]))"
)


# "from 2010 to 2015", "between 1990 and 2000": the second year has no context word of its own.
_YEAR_SPAN_RE = re.compile(
    r"(?i)(?<![A-Za-z])((?:from|between)\s+)(\d{4})(\s+(?:to|and|until|till|through)\s+)(\d{4})"
    r"(?![\d%]|\.\d|\s?%)"
)


def _year_span(m: Match[str]) -> str:
    first_word, first, joiner, second = m.groups()
    if not (_is_year(first) and _is_year(second)):
        return m.group()
    return first_word + _pad(en_year(int(first))) + joiner.strip() + _pad(en_year(int(second)))


def _year_in_context(m: Match[str]) -> str:
    prefix, year, bare = m.groups()
    y = year or bare
    if not _is_year(y):
        return m.group()
    return (prefix or "") + _pad(en_year(int(y)))


# --------------------------------------------------------------------------- #
# Times, phone numbers, arithmetic
# --------------------------------------------------------------------------- #

_TIME_RE = re.compile(r"(?<![\d:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])(?:\s?([AaPp])\.?[Mm]\.?(?![A-Za-z]))?")
_HOUR_AMPM_RE = re.compile(r"(?<![\d:.])(\d{1,2})\s?([AaPp])\.?[Mm]\.?(?![A-Za-z])")


def _time(m: Match[str]) -> str:
    h, mi, s, ampm = m.groups()
    if not valid_time(h, mi, s):
        return m.group()
    out = en_integer(int(h))
    if int(mi) == 0 and not s:
        out += "" if ampm else " o clock"  # ChatTTS drops the apostrophe of o'clock
    elif mi.startswith("0"):
        out += " oh " + en_integer(int(mi))
    else:
        out += " " + en_integer(int(mi))
    if s:
        out += f" and {en_integer(int(s))} seconds"
    if ampm:
        out += f" {ampm.lower()} m"
    return _pad(out)


def _hour_ampm(m: Match[str]) -> str:
    h, ampm = m.groups()
    if int(h) > 12:
        return m.group()
    return _pad(f"{en_integer(int(h))} {ampm.lower()} m")


def _phone(m: Match[str]) -> str:
    groups = re.findall(r"\+|\d+", m.group())
    words = ["plus" if g == "+" else _digits(g) for g in groups]
    return _pad(", ".join(words).replace("plus,", "plus"))


_OPERATORS = {
    "+": "plus",
    "-": "minus",
    "*": "times",
    "×": "times",
    "/": "divided by",
    "÷": "divided by",
    "=": "equals",
}


def _expr(m: Match[str]) -> str:
    words = []
    for num, op in EXPR_TOKEN_RE.findall(m.group()):
        words.append(en_number(num))
        if op:
            words.append(_OPERATORS[op])
    return _pad(" ".join(words))


# --------------------------------------------------------------------------- #
# Money, units, ranges, percentages, fractions
# --------------------------------------------------------------------------- #


def _plural(n_str: str, singular: str, plural: str) -> str:
    return singular if n_str in ("1", "1.0") else plural


def _money(m: Match[str]) -> str:
    neg, cur, amount, scale = m.groups()
    major1, major, minor1, minor = _TABLES["currency"][cur]
    sign = "minus " if neg else ""
    if scale:
        scale_word = _TABLES["scales"].get(scale.lower(), scale.lower())
        if scale_word in CHINESE_SCALES:
            return m.group()  # Chinese scale inside an English sentence: leave to plain rules
        return _pad(f"{sign}{en_number(amount)} {scale_word} {major}")
    whole, _, frac = amount.partition(".")
    if len(frac) > 2 or (frac and not minor) or too_long(whole):
        return _pad(f"{sign}{en_number(amount)} {major}")  # a long amount: its digits, then the currency
    cents = int(frac.ljust(2, "0")) if frac else 0
    parts = []
    if int(whole) or not cents:
        parts.append(f"{en_integer(int(whole))} {_plural(whole, major1, major)}")
    if cents:
        parts.append(f"{en_integer(cents)} {minor1 if cents == 1 else minor}")
    return _pad(sign + " and ".join(parts))


def _unit(m: Match[str]) -> str:
    num, unit = m.groups()
    return f"{num} {_plural(num, *UNITS[unit]['en'])} "  # the number itself is read by a later pass


def _range(m: Match[str]) -> str:
    a, pa, b, pb = m.groups()
    if _is_year(a) and _is_year(b):
        return _pad(f"{en_year(int(a))} to {en_year(int(b))}")
    suffix = " percent" if (pa or pb) else ""
    first = en_number(a) + (" percent" if pa and pb else "")
    return _pad(f"{first} to {en_number(b)}{suffix}")


def _percent(m: Match[str]) -> str:
    neg, num, sign = m.groups()
    word = "percent" if sign == "%" else "per mille"
    return _pad(("minus " if neg else "") + f"{en_number(num)} {word}")


def _fraction(m: Match[str]) -> str:
    if too_long(m.group(1), m.group(2)):
        return _pad(f"{en_number(m.group(1))} over {en_number(m.group(2))}")  # digit by digit
    num, den = int(m.group(1)), int(m.group(2))
    if den == 0 or den > 100:
        return _pad(f"{en_number(m.group(1))} over {en_number(m.group(2))}")
    if den == 1:
        return _pad(f"{en_integer(num)} over one")
    if den == 2:
        name = "half" if num == 1 else "halves"
    elif den == 4:
        name = "quarter" if num == 1 else "quarters"
    else:
        name = en_ordinal(den) + ("" if num == 1 else "s")
    return _pad(f"{en_integer(num)} {name}")


def _plain(m: Match[str]) -> str:
    s = m.group()
    if s.count(".") >= 2:  # version numbers: 1.2.3
        return _pad(" point ".join(en_number(p) for p in s.split(".")))
    return _pad(en_number(s))


def _domain(m: Match[str]) -> str:
    s = re.sub(r"^https?://", "", m.group())
    return _pad(s.replace(".", " dot ").replace("/", " slash ").replace("_", " underscore "))


# --------------------------------------------------------------------------- #
# The passes
# --------------------------------------------------------------------------- #

# Abbreviations read as words, before the number passes ("No. 5", "#1" need the digits).
_ABBREVIATIONS = (
    (re.compile(r"(?<![A-Za-z])Mr\.(?=\s|$)"), "Mister"),
    (re.compile(r"(?<![A-Za-z])Mrs\.(?=\s|$)"), "Missus"),
    (re.compile(r"(?<![A-Za-z])Ms\.(?=\s|$)"), "Miz"),
    (re.compile(r"(?<![A-Za-z])Dr\.(?=\s|$)"), "Doctor"),
    (re.compile(r"(?<![A-Za-z])Prof\.(?=\s|$)"), "Professor"),
    (re.compile(r"(?<![A-Za-z])Jr\.(?=\s|,|$)"), "Junior"),
    (re.compile(r"(?<![A-Za-z])Sr\.(?=\s|,|$)"), "Senior"),
    (re.compile(r"(?i)(?<![A-Za-z])e\.g\.?(?![A-Za-z])"), "for example"),
    (re.compile(r"(?i)(?<![A-Za-z])i\.e\.?(?![A-Za-z])"), "that is"),
    (re.compile(r"(?i)(?<![A-Za-z])vs\.?(?![A-Za-z])"), "versus"),
    (re.compile(r"(?i)(?<![A-Za-z])approx\.(?![A-Za-z])"), "approximately"),
    (re.compile(r"(?i)(?<![A-Za-z])etc\.(?![A-Za-z])"), "et cetera."),
    (re.compile(r"(?<![A-Za-z])No\.\s?(?=\d)"), "number "),
    (re.compile(r"#(?=\d)"), "number "),
    (re.compile(r"~\s?(?=\d)"), "about "),
)

PASSES: Tuple[Rule, ...] = (
    (DOMAIN_RE, _domain),
    (ISO_DATE_RE, _iso_date),
    (_MONTH_DAY_RE, _month_day),
    (_DAY_MONTH_RE, _day_month),
    (EXPRESSIONS, _expr),
    (_TIME_RE, _time),
    (_HOUR_AMPM_RE, _hour_ampm),
    (PHONE_RE, _phone),
    (MONEY_RE, _money),
    (UNIT_RE, _unit),
    (re.compile(r"(?<![\d.])'?(1[0-9]|20)?(\d0)s(?![A-Za-z])"), _decade),  # 1990s, '80s
    (_YEAR_SPAN_RE, _year_span),
    (_YEAR_RE, _year_in_context),
    (ORDINAL_RE, lambda m: _pad(_digits(m.group(1)) if too_long(m.group(1)) else en_ordinal(int(m.group(1))))),
    (RANGE_RE, _range),
    (PERCENT_RE, _percent),
    (RATIO_RE, lambda m: _pad(f"{en_number(m.group(1))} to {en_number(m.group(2))}")),
    (FRACTION_RE, _fraction),
    (NEGATIVE_RE, lambda m: " minus "),
    (PLAIN_NUM_RE, _plain),
    (re.compile(r"(?<=[A-Za-z])-(?=[A-Za-z])"), lambda m: " "),  # well-known -> well known
    symbol_rule(_TABLES["symbols"]),
)

_SPACE_BEFORE_PUNCT_RE = re.compile(r"[ \t]+(?=[,.;:!?，。、；：！？])")
_MULTI_SPACE_RE = re.compile(r"[ \t]{2,}")


def _chunk(text: str) -> str:
    text = common_prep(text)
    for pattern, word in _ABBREVIATIONS:
        text = pattern.sub(word, text)
    text = apply_rules(text, PASSES)
    text = _MULTI_SPACE_RE.sub(" ", text)
    return _SPACE_BEFORE_PUNCT_RE.sub("", text)


def normalize_numbers_en(text: str) -> str:
    """English readings for numbers and symbols; control tags are left untouched."""
    return map_chunks(text, _chunk)
