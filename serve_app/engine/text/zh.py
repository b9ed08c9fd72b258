"""Chinese readings of numbers, dates, times, money, units and symbols (``normalize_numbers_zh``)."""

from __future__ import annotations

import re
from typing import Match, Tuple

from . import data
from .chars import CJK
from .patterns import (
    CHINESE_SCALES,
    DOMAIN_RE,
    EXPR_TOKEN_RE,
    EXPRESSIONS,
    FRACTION_RE,
    ISO_DATE_RE,
    MONEY_RE,
    NEGATIVE_RE,
    ORDINAL_RE,
    PERCENT_RE,
    PHONE_RE,
    PLAIN_NUM_RE,
    RANGE_RE,
    RATIO_RE,
    TIME_RE,
    UNIT_RE,
    UNITS,
    Rule,
    apply_rules,
    common_prep,
    read_decimal,
    symbol_rule,
    valid_date,
    valid_time,
)
from .tags import map_chunks

__all__ = ["normalize_numbers_zh", "zh_integer", "zh_number"]

_TABLES = data.load("zh.json")
_DIGITS = "零一二三四五六七八九"
_SMALL_UNITS = ("", "十", "百", "千")
_BIG_UNITS = ("", "万", "亿", "万亿")
_MAX_DIGITS = 12  # longer integers read digit by digit (ids, card numbers)


def _digits(s: str, one: str = "一") -> str:
    return "".join(one if c == "1" else _DIGITS[int(c)] for c in s if c.isdigit())


def _group(n: int) -> str:
    """Read 1..9999; zeros between digits collapse to one 零."""
    out, pending_zero = "", False
    for pos in (3, 2, 1, 0):
        d = n // 10**pos % 10
        if d == 0:
            pending_zero = bool(out)
            continue
        if pending_zero:
            out += "零"
            pending_zero = False
        out += _DIGITS[d] + _SMALL_UNITS[pos]
    return out


def zh_integer(n: int) -> str:
    """Cardinal reading of a non-negative integer below 10**16 (1234 -> 一千二百三十四)."""
    if n == 0:
        return "零"
    groups = []
    while n:
        groups.append(n % 10000)
        n //= 10000
    out, gap = "", False
    for i in reversed(range(len(groups))):
        g = groups[i]
        if g == 0:
            gap = bool(out)
            continue
        if out and (gap or g < 1000):
            out += "零"
        out += _group(g) + _BIG_UNITS[i]
        gap = False
    return out[1:] if out.startswith("一十") else out  # 10..19 read 十X


def zh_number(s: str) -> str:
    """Read a decimal string ("-3.05" -> 负三点零五); long ids/leading zeros digit by digit."""
    return read_decimal(s, zh_integer, _digits, _MAX_DIGITS, point="点", minus="负")


def _trim_zeros(s: str) -> str:
    """Money amounts: 3.50 -> 3.5, 3.00 -> 3."""
    return s.rstrip("0").rstrip(".") if "." in s else s


def _date(m: Match[str]) -> str:
    year, _, month, day = m.groups()
    if not valid_date(month, day):
        return m.group()
    return f"{_digits(year)}年{zh_integer(int(month))}月{zh_integer(int(day))}日"


_OPERATORS = {"+": "加", "-": "减", "*": "乘", "×": "乘", "/": "除以", "÷": "除以", "=": "等于"}


def _expr(m: Match[str]) -> str:
    return "".join(zh_number(num) + _OPERATORS.get(op, "") for num, op in EXPR_TOKEN_RE.findall(m.group()))


def _time(m: Match[str]) -> str:
    h, mi, s = m.groups()
    if not valid_time(h, mi, s):
        return m.group()
    out = zh_integer(int(h)) + "点"
    if int(mi) == 0 and not s:
        return out if m.string.startswith("整", m.end()) else out + "整"  # "12:00整" has its own
    out += ("零" if mi.startswith("0") and mi != "00" else "") + zh_integer(int(mi)) + "分"
    return out + (zh_integer(int(s)) + "秒" if s else "")


def _phone(m: Match[str]) -> str:
    """Digit by digit with 幺 for 1 (as phone numbers are read); groups keep a pause."""
    groups = re.findall(r"\+|\d+", m.group())
    words = ["加" if g == "+" else _digits(g, one="幺") for g in groups]
    return "，".join(w for w in words if w).replace("加，", "加")


def _money(m: Match[str]) -> str:
    neg, cur, amount, scale = m.groups()
    scale_word = ""
    if scale:
        scale_word = scale if scale in CHINESE_SCALES else _TABLES["scales"][scale.lower()]
    return ("负" if neg else "") + zh_number(_trim_zeros(amount)) + scale_word + _TABLES["currency"][cur]


def _unit(m: Match[str]) -> str:
    return m.group(1) + UNITS[m.group(2)]["zh"]  # the number itself is read by a later pass


def _range(m: Match[str]) -> str:
    a, pa, b, pb = m.groups()
    if pa or pb:  # "3-5%" means 3% to 5%
        return f"百分之{zh_number(a)}到百分之{zh_number(b)}"
    return f"{zh_number(a)}到{zh_number(b)}"


def _percent(m: Match[str]) -> str:
    neg, num, sign = m.groups()
    return ("负" if neg else "") + ("百分之" if sign == "%" else "千分之") + zh_number(num)


def _plain(m: Match[str]) -> str:
    s = m.group()
    if s.count(".") >= 2:  # version numbers: 1.2.3
        return "点".join(zh_number(p) for p in s.split("."))
    return zh_number(s)


def _domain(m: Match[str]) -> str:
    s = re.sub(r"^https?://", "", m.group())
    return s.replace(".", "点").replace("/", " ")


def _time_span(m: Match[str]) -> str:
    """Two clock times joined by a dash ("8:00-22:00") read 到 between them."""
    a, b = (TIME_RE.fullmatch(t) for t in m.groups())
    return _time(a) + "到" + _time(b) if a and b else m.group()


_TIME_SPAN_RE = re.compile(r"(?<![\d:.])(\d{1,2}:\d{2}(?::\d{2})?)\s*[-~～–—至]\s*(\d{1,2}:\d{2}(?::\d{2})?)(?![\d:])")
# Service numbers ("12345热线", "拨打110") are read digit by digit, as phone numbers are.
_SERVICE_NUMBER_RE = re.compile(
    r"(?:(?<=拨打)|(?<=致电)|(?<=呼叫)|(?<=拨))\s*(\d{3,6})(?![\d.])|(?<![\d.])(\d{3,6})(?=热线|专线|客服电话|服务电话)"
)


# "/" after a measure word reads 每 (元/斤); other slashes become a space.
_PER_RE = re.compile(rf"(?<=[{CJK}])/(?=(?:{'|'.join(_TABLES['per_words'])}))")

PASSES: Tuple[Rule, ...] = (
    (DOMAIN_RE, _domain),
    (ISO_DATE_RE, _date),
    (re.compile(r"(?<![\d.])(\d{4})(?=\s*年)"), lambda m: _digits(m.group(1))),  # years digit by digit
    (EXPRESSIONS, _expr),
    (_TIME_SPAN_RE, _time_span),
    (TIME_RE, _time),
    (PHONE_RE, _phone),
    (_SERVICE_NUMBER_RE, lambda m: _digits(m.group(1) or m.group(2), one="幺")),
    (MONEY_RE, _money),
    (UNIT_RE, _unit),
    (ORDINAL_RE, lambda m: "第" + zh_number(m.group(1))),
    (RANGE_RE, _range),
    (PERCENT_RE, _percent),
    (RATIO_RE, lambda m: f"{zh_number(m.group(1))}比{zh_number(m.group(2))}"),
    (FRACTION_RE, lambda m: f"{zh_number(m.group(2))}分之{zh_number(m.group(1))}"),
    (NEGATIVE_RE, lambda m: "负"),
    (PLAIN_NUM_RE, _plain),
    (_PER_RE, lambda m: "每"),
    symbol_rule(_TABLES["symbols"]),
    (re.compile(r"/"), lambda m: " "),
)


def normalize_numbers_zh(text: str) -> str:
    """Chinese readings for numbers and symbols; control tags are left untouched."""
    return map_chunks(text, lambda s: apply_rules(common_prep(s), PASSES))
