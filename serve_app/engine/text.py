"""Text front end for ChatTTS: language detection, segmentation and normalisation.

ChatTTS can only pronounce CJK ideographs, Latin letters and ``，。、,. `` (plus its
control tags); anything else (digits, %, $, :, ...) is silently dropped by its
``Normalizer``. This module turns numbers and symbols into words first, per
language, then hands the text to ChatTTS's ``Normalizer`` for homophone
replacement and invalid-character removal.

Library choice (measured on CPython 3.11, see the closing note of the change):
English readings use ``num2words`` (pure Python, ~1.5 MB, ~0.03 s import,
offline). Chinese readings are done here: cn2an's ``transform`` misreads phone
numbers, times and money, and wetext/WeTextProcessing are heavy (FST data /
pynini). The rules below cover what a TTS service sees most.

Nothing here imports Ray, HTTP code or, at module import, ChatTTS/torch:
``split_segments``, ``detect_language`` and the ``normalize_numbers_*``
functions are light; only ``TextFrontend`` imports ``ChatTTS.norm``.

Conventions:
* Control tags: only the ChatTTS tags a user may write are recognised
  (``CONTROL_TAG_RE``: ``[uv_break]``, ``[v_break]``, ``[lbreak]``,
  ``[llbreak]``, ``[laugh]``, ``[laugh_N]``, ``[break_N]``, ``[oral_N]``,
  ``[speed_N]``). Any other ``[`` / ``]`` is treated as plain punctuation and
  removed during normalisation, so users cannot inject internal tokens such as
  ``[spk_emb]``.
* Length: ``max_chars`` is measured by ``text_length``: whitespace runs count as
  one character and each control tag counts as ONE character (it is a single
  token for the model; counting it keeps tag-heavy input bounded without
  penalising a tag for its spelling). ``max_seconds`` (optional) bounds a segment's
  expected speech (``pacing.expected_seconds``): the same for every script, where a
  character limit lets a Chinese segment speak ~3x longer than an English one.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import unicodedata
import warnings
from dataclasses import dataclass
from typing import Callable, List, Literal, Match, Optional, Pattern, Sequence, Tuple

from num2words import num2words

from .pacing import expected_seconds

__all__ = [
    "CONTROL_TAG_RE",
    "Lang",
    "Segment",
    "TextFrontend",
    "detect_language",
    "is_speakable",
    "normalize_numbers_en",
    "normalize_numbers_zh",
    "segment_fits",
    "split_segments",
    "text_length",
]

Lang = Literal["zh", "en"]
_LANGS = ("zh", "en")

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------- #
# Character classes and tags
# --------------------------------------------------------------------------- #

_TAG_PATTERN = r"\[(?:uv_break|v_break|lbreak|llbreak|laugh|(?:laugh|break|oral|speed)_\d+)\]"
CONTROL_TAG_RE: Pattern[str] = re.compile(_TAG_PATTERN)
_ATOM_RE = re.compile(_TAG_PATTERN + r"|.", re.S)  # a tag or one character
_TAG_SPLIT_RE = re.compile("(" + _TAG_PATTERN + ")")

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{_CJK}]")
_LATIN_WORD_RE = re.compile(r"[A-Za-z]+")
_SPEAKABLE_RE = re.compile(f"[{_CJK}A-Za-z0-9０-９Ａ-Ｚａ-ｚ]")  # full-width: normalised later
_WS_RE = re.compile(r"\s+")

# Sentence ends (。！？.!? and newlines), clause breaks, closing quotes/brackets
# that belong to the sentence they close.
_SENT_PUNCT = "。！？!?…"
_CLAUSE_PUNCT = "，、；,;：:"
_CLOSERS = "\"'”’」』）)】》"
# Words whose trailing "." is not a sentence end.
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc inc ltd corp fig vol approx dept "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split()
)
_ABBR_TAIL_RE = re.compile(r"[A-Za-z.]{1,12}$")

# Full-width ASCII variants (！ ＄ １ Ａ ...) -> ASCII so one set of rules applies;
# ChatTTS maps Chinese punctuation back for zh itself.
_FULLWIDTH = {c: c - 0xFEE0 for c in range(0xFF01, 0xFF5F)}
_FULLWIDTH.update({0x3000: 0x20, 0xFFE5: ord("¥"), 0xFFE0: ord("¢"), 0xFFE1: ord("£")})


def text_length(text: str) -> int:
    """Length counted against ``max_chars``: whitespace runs and control tags count as 1."""
    text = _WS_RE.sub(" ", text).strip()
    return len(text) - sum(len(m.group()) - 1 for m in CONTROL_TAG_RE.finditer(text))


def is_speakable(text: str) -> bool:
    """True if, tags aside, the text has something ChatTTS can say (CJK, Latin, digits)."""
    return bool(_SPEAKABLE_RE.search(CONTROL_TAG_RE.sub("", text)))


def _map_chunks(text: str, fn: Callable[[str], str]) -> str:
    """Apply ``fn`` to the text between control tags, leaving tags untouched."""
    parts = _TAG_SPLIT_RE.split(text)
    return "".join(p if i % 2 else fn(p) for i, p in enumerate(parts))


def _sanitize(text: str) -> str:
    """Drop control/format characters (they confuse splitting and tokenising)."""
    out = []
    for ch in text:
        if ch in "\n\t\r":
            out.append("\n" if ch == "\n" else " ")
            continue
        cat = unicodedata.category(ch)
        if cat == "Cf":  # zero-width spaces, BOM, bidi marks
            continue
        out.append(" " if cat in ("Cc", "Cs", "Co", "Zl", "Zp") else ch)
    return "".join(out)


def _strip_stray_brackets(text: str) -> str:
    """Replace '[' / ']' that are not part of a known control tag with spaces.

    ChatTTS's own tag splitter treats any ``[...]`` as a tag (and loses text after
    an unclosed ``[``), so only recognised tags may keep their brackets.
    """
    return _map_chunks(text, lambda s: s.replace("[", " ").replace("]", " "))


# --------------------------------------------------------------------------- #
# Language detection
# --------------------------------------------------------------------------- #


def _script_counts(text: str) -> Tuple[int, int]:
    text = CONTROL_TAG_RE.sub(" ", text)
    return len(_CJK_RE.findall(text)), len(_LATIN_WORD_RE.findall(text))


def detect_language(text: str) -> Lang:
    """Dominant script: CJK characters vs Latin words; ties (and no evidence) -> "en"."""
    cjk, latin = _script_counts(text)
    return "zh" if cjk > latin else "en"


def _detect_or(text: str, default: Lang) -> Lang:
    """Like ``detect_language`` but falls back to ``default`` when there is no letter at all."""
    cjk, latin = _script_counts(text)
    if cjk == latin == 0:
        return default
    return "zh" if cjk > latin else "en"


# --------------------------------------------------------------------------- #
# Shared number patterns
# --------------------------------------------------------------------------- #

_NUM = r"\d+(?:\.\d+)?"
_NB = r"(?<![\d.])"  # number start: not inside another number
_NE = r"(?![\d])"  # number end
_THOUSANDS_RE = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
_ISO_DATE_RE = re.compile(r"(?<![\d.])(\d{4})\s*([-/.])\s*(\d{1,2})\s*\2\s*(\d{1,2})(?![\d.])")
_EXPR_RE = re.compile(
    rf"{_NB}-?{_NUM}(?:\s*[-+*/×÷]\s*-?{_NUM})+\s*=\s*-?{_NUM}(?![\d.])"
)
_EXPR_TOKEN_RE = re.compile(rf"(-?{_NUM})\s*([-+*/×÷=]?)\s*")
_TIME_RE = re.compile(r"(?<![\d:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])")
_PHONE_RE = re.compile(
    r"""(?<![\dA-Za-z+-])(?:
        \+\d{1,3}[-\s]?\(?\d{1,4}\)?(?:[-\s]?\d{2,4}){2,4}
      | \(\d{3}\)\s?\d{3}-\d{4}
      | \d{3}-\d{3,4}-\d{4}
      | 0\d{2,3}-\d{7,8}
      | 1[3-9]\d{9}
    )(?![\d-])""",
    re.X,
)
_RANGE_RE = re.compile(rf"{_NB}({_NUM})(%?)\s*[-~～–—]\s*({_NUM})(%?)(?![\d.])")
_PERCENT_RE = re.compile(rf"(?<![\dA-Za-z.])(-?)({_NUM})\s*([%‰])")
_RATIO_RE = re.compile(r"(?<![\d:.])(\d+):(\d+)(?![\d:])")
_FRACTION_RE = re.compile(r"(?<![\d/.])(\d+)/(\d+)(?![\d/])")
_ORDINAL_RE = re.compile(r"(?<![\d.])(\d+)(st|nd|rd|th)(?![A-Za-z])")
_LETTER_DASH_DIGIT_RE = re.compile(r"(?<=[A-Za-z])-(?=\d)|(?<=\d)-(?=[A-Za-z])")
_NEGATIVE_RE = re.compile(r"(?<![\dA-Za-z.])-(?=\d)")
_PLAIN_NUM_RE = re.compile(r"\d+(?:\.\d+)*")
_DOMAIN_RE = re.compile(
    r"(?:https?://)?(?:[A-Za-z0-9_-]+\.)+(?:com|net|org|cn|io|ai|edu|gov|co|uk|me|dev|app|info)(?![A-Za-z])"
    r"(?:/[A-Za-z0-9_/-]*)?"
)
_MONEY_RE = re.compile(
    rf"(-?)([$€£¥])\s?({_NUM})(?:\s?(thousand|million|billion|trillion|bn|[kKmMbB]|万亿|亿|万|千)(?![A-Za-z]))?"
)
_UNIT_NAMES = (
    r"km/h|m/s|km²|m²|㎡|cm²|km|kg|cm|mm|mg|ml|mL|mph|lbs|lb|ft|m|g|L|℃|°C|°F|°"
)
_UNIT_RE = re.compile(rf"{_NB}({_NUM})\s?({_UNIT_NAMES})(?![A-Za-z0-9²])")


def _common_prep(text: str) -> str:
    """Language-independent clean-up before the rules run."""
    text = _THOUSANDS_RE.sub(lambda m: m.group().replace(",", ""), text)
    text = text.translate(_FULLWIDTH)
    return _LETTER_DASH_DIGIT_RE.sub(" ", text)  # "COVID-19" -> "COVID 19"


def _apply_rules(text: str, rules: Sequence[Tuple[Pattern[str], Callable[[Match[str]], str]]]) -> str:
    for pattern, repl in rules:
        text = pattern.sub(repl, text)
    return text


def _valid_date(month: str, day: str) -> bool:
    return 1 <= int(month) <= 12 and 1 <= int(day) <= 31


def _valid_time(h: str, m: str, s: Optional[str]) -> bool:
    return int(h) <= 24 and int(m) <= 59 and (s is None or int(s) <= 59)


def _split_decimal(s: str) -> Tuple[bool, str, str]:
    neg = s.startswith("-")
    int_part, _, frac = s.lstrip("-+").partition(".")
    return neg, int_part, frac


def _is_code(int_part: str, max_len: int) -> bool:
    """Digit strings read one digit at a time: leading zeros (007) or very long ids."""
    return (len(int_part) > 1 and int_part.startswith("0")) or len(int_part) > max_len


# --------------------------------------------------------------------------- #
# Chinese readings
# --------------------------------------------------------------------------- #

_ZH_DIGITS = "零一二三四五六七八九"
_ZH_SMALL_UNITS = ("", "十", "百", "千")
_ZH_BIG_UNITS = ("", "万", "亿", "万亿")
_ZH_MAX_DIGITS = 12  # longer integers read digit by digit (ids, card numbers)


def _zh_digits(s: str, one: str = "一") -> str:
    return "".join(one if c == "1" else _ZH_DIGITS[int(c)] for c in s if c.isdigit())


def _zh_group(n: int) -> str:
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
        out += _ZH_DIGITS[d] + _ZH_SMALL_UNITS[pos]
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
        out += _zh_group(g) + _ZH_BIG_UNITS[i]
        gap = False
    return out[1:] if out.startswith("一十") else out  # 10..19 read 十X


def zh_number(s: str) -> str:
    """Read a decimal string ("-3.05" -> 负三点零五); long ids/leading zeros digit by digit."""
    neg, int_part, frac = _split_decimal(s)
    if _is_code(int_part, _ZH_MAX_DIGITS):
        out = _zh_digits(int_part)
    else:
        out = zh_integer(int(int_part or "0"))
    if frac:
        out += "点" + _zh_digits(frac)
    return ("负" if neg else "") + out


def _zh_trim_zeros(s: str) -> str:
    """Money amounts: 3.50 -> 3.5, 3.00 -> 3."""
    return s.rstrip("0").rstrip(".") if "." in s else s


def _zh_date(m: Match[str]) -> str:
    year, _, month, day = m.groups()
    if not _valid_date(month, day):
        return m.group()
    return f"{_zh_digits(year)}年{zh_integer(int(month))}月{zh_integer(int(day))}日"


def _zh_expr(m: Match[str]) -> str:
    ops = {"+": "加", "-": "减", "*": "乘", "×": "乘", "/": "除以", "÷": "除以", "=": "等于"}
    return "".join(zh_number(num) + ops.get(op, "") for num, op in _EXPR_TOKEN_RE.findall(m.group()))


def _zh_time(m: Match[str]) -> str:
    h, mi, s = m.groups()
    if not _valid_time(h, mi, s):
        return m.group()
    out = zh_integer(int(h)) + "点"
    if int(mi) == 0 and not s:
        return out + "整"
    out += ("零" if mi.startswith("0") and mi != "00" else "") + zh_integer(int(mi)) + "分"
    return out + (zh_integer(int(s)) + "秒" if s else "")


def _zh_phone(m: Match[str]) -> str:
    """Digit by digit with 幺 for 1 (as phone numbers are read); groups keep a pause."""
    groups = re.findall(r"\+|\d+", m.group())
    words = ["加" if g == "+" else _zh_digits(g, one="幺") for g in groups]
    return "，".join(w for w in words if w).replace("加，", "加")


_ZH_CURRENCY = {"$": "美元", "€": "欧元", "£": "英镑", "¥": "元"}
_ZH_SCALE = {"k": "千", "thousand": "千", "m": "百万", "million": "百万", "b": "十亿",
             "bn": "十亿", "billion": "十亿", "trillion": "万亿"}


def _zh_money(m: Match[str]) -> str:
    neg, cur, amount, scale = m.groups()
    scale_word = ""
    if scale:
        scale_word = scale if scale in ("万亿", "亿", "万", "千") else _ZH_SCALE[scale.lower()]
    return ("负" if neg else "") + zh_number(_zh_trim_zeros(amount)) + scale_word + _ZH_CURRENCY[cur]


_ZH_UNITS = {
    "km/h": "公里每小时", "m/s": "米每秒", "km²": "平方公里", "m²": "平方米", "㎡": "平方米",
    "cm²": "平方厘米", "km": "公里", "kg": "千克", "cm": "厘米", "mm": "毫米", "mg": "毫克",
    "ml": "毫升", "mL": "毫升", "mph": "英里每小时", "lbs": "磅", "lb": "磅", "ft": "英尺",
    "m": "米", "g": "克", "L": "升", "℃": "摄氏度", "°C": "摄氏度", "°F": "华氏度", "°": "度",
}


def _zh_unit(m: Match[str]) -> str:
    return m.group(1) + _ZH_UNITS[m.group(2)]  # number itself is read by a later rule


def _zh_range(m: Match[str]) -> str:
    a, pa, b, pb = m.groups()
    if pa or pb:  # "3-5%" means 3% to 5%
        return f"百分之{zh_number(a)}到百分之{zh_number(b)}"
    return f"{zh_number(a)}到{zh_number(b)}"


def _zh_percent(m: Match[str]) -> str:
    neg, num, sign = m.groups()
    return ("负" if neg else "") + ("百分之" if sign == "%" else "千分之") + zh_number(num)


def _zh_plain(m: Match[str]) -> str:
    s = m.group()
    if s.count(".") >= 2:  # version numbers: 1.2.3
        return "点".join(zh_number(p) for p in s.split("."))
    return zh_number(s)


def _zh_domain(m: Match[str]) -> str:
    s = re.sub(r"^https?://", "", m.group())
    return s.replace(".", "点").replace("/", " ")


_ZH_SYMBOLS = {
    "&": "和", "@": "艾特", "+": "加", "=": "等于", "×": "乘", "÷": "除以", "≈": "约等于",
    "≤": "小于等于", "≥": "大于等于", "?": "。", "…": "。", "—": "，", "_": " ", "*": " ",
    "%": "百分号", "‰": "千分号", "#": " ", "~": "，", "～": "，", "|": "，", "\\": " ",
    "\n": "。",
}
_ZH_SYMBOL_RE = re.compile("|".join(re.escape(k) for k in _ZH_SYMBOLS))
# "/" after a measure word reads 每 (元/斤); other slashes become a space.
_ZH_PER_RE = re.compile(
    rf"(?<=[{_CJK}])/(?=(?:小时|分钟|公里|千克|公斤|平方米|[斤克个人次天年月日周时秒米升件台吨]))"
)

_ZH_RULES: Tuple[Tuple[Pattern[str], Callable[[Match[str]], str]], ...] = (
    (_DOMAIN_RE, _zh_domain),
    (_ISO_DATE_RE, _zh_date),
    (re.compile(r"(?<![\d.])(\d{4})(?=\s*年)"), lambda m: _zh_digits(m.group(1))),
    (_EXPR_RE, _zh_expr),
    (_TIME_RE, _zh_time),
    (_PHONE_RE, _zh_phone),
    (_MONEY_RE, _zh_money),
    (_UNIT_RE, _zh_unit),
    (_ORDINAL_RE, lambda m: "第" + zh_number(m.group(1))),
    (_RANGE_RE, _zh_range),
    (_PERCENT_RE, _zh_percent),
    (_RATIO_RE, lambda m: f"{zh_number(m.group(1))}比{zh_number(m.group(2))}"),
    (_FRACTION_RE, lambda m: f"{zh_number(m.group(2))}分之{zh_number(m.group(1))}"),
    (_NEGATIVE_RE, lambda m: "负"),
    (_PLAIN_NUM_RE, _zh_plain),
    (_ZH_PER_RE, lambda m: "每"),
    (_ZH_SYMBOL_RE, lambda m: _ZH_SYMBOLS[m.group()]),
    (re.compile(r"/"), lambda m: " "),
)


def normalize_numbers_zh(text: str) -> str:
    """Chinese readings for numbers and symbols; control tags are left untouched."""
    return _map_chunks(text, lambda s: _apply_rules(_common_prep(s), _ZH_RULES))


# --------------------------------------------------------------------------- #
# English readings (num2words)
# --------------------------------------------------------------------------- #

_EN_DIGITS = "zero one two three four five six seven eight nine".split()
_EN_MAX_DIGITS = 15


def _en_clean(words: str) -> str:
    # ChatTTS turns "-" into a comma (a pause) and commas are pauses too.
    return words.replace("-", " ").replace(",", "")


def _en_digits(s: str) -> str:
    return " ".join(_EN_DIGITS[int(c)] for c in s if c.isdigit())


def en_integer(n: int) -> str:
    return _en_clean(num2words(n))


def en_number(s: str) -> str:
    """Read a decimal string ("-3.05" -> minus three point zero five)."""
    neg, int_part, frac = _split_decimal(s)
    if _is_code(int_part, _EN_MAX_DIGITS):
        out = _en_digits(int_part)
    else:
        out = en_integer(int(int_part or "0"))
    if frac:
        out += " point " + _en_digits(frac)
    return ("minus " if neg else "") + out


def en_year(n: int) -> str:
    return _en_clean(num2words(n, to="year"))


def en_ordinal(n: int) -> str:
    return _en_clean(num2words(n, to="ordinal"))


def _pad(words: str) -> str:
    """Space out a reading so it never glues onto neighbouring letters (5G -> five G)."""
    return f" {words} "


def _is_year(s: str) -> bool:
    return len(s) == 4 and 1100 <= int(s) <= 2099


_MONTHS = {
    "jan": "January", "feb": "February", "mar": "March", "apr": "April", "may": "May",
    "jun": "June", "jul": "July", "aug": "August", "sep": "September", "sept": "September",
    "oct": "October", "nov": "November", "dec": "December",
}
_MONTH_NAMES = (
    r"January|February|March|April|May|June|July|August|September|October|November|December"
    r"|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec"
)
_EN_MONTH_DAY_RE = re.compile(
    rf"(?<![A-Za-z])({_MONTH_NAMES})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?(?:,?\s+(\d{{4}}))?(?![\d.])"
)
_EN_DAY_MONTH_RE = re.compile(
    rf"(?<![\d.])(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH_NAMES})\.?(?:,?\s+(\d{{4}}))?(?![\d.])"
)


def _month(name: str) -> str:
    return _MONTHS[name[:4].lower()] if name[:4].lower() == "sept" else _MONTHS[name[:3].lower()]


def _en_date_tail(year: Optional[str]) -> str:
    return f", {en_year(int(year))}" if year else ""


def _en_iso_date(m: Match[str]) -> str:
    year, _, month, day = m.groups()
    if not _valid_date(month, day):
        return m.group()
    month_name = list(dict.fromkeys(_MONTHS.values()))[int(month) - 1]
    return _pad(f"{month_name} {en_ordinal(int(day))}{_en_date_tail(year)}")


def _en_month_day(m: Match[str]) -> str:
    month, day, year = m.groups()
    if not 1 <= int(day) <= 31:
        return m.group()
    return _pad(f"{_month(month)} {en_ordinal(int(day))}{_en_date_tail(year)}")


def _en_day_month(m: Match[str]) -> str:
    day, month, year = m.groups()
    if not 1 <= int(day) <= 31:
        return m.group()
    return _pad(f"the {en_ordinal(int(day))} of {_month(month)}{_en_date_tail(year)}")


def _en_expr(m: Match[str]) -> str:
    ops = {"+": "plus", "-": "minus", "*": "times", "×": "times", "/": "divided by",
           "÷": "divided by", "=": "equals"}
    words = []
    for num, op in _EXPR_TOKEN_RE.findall(m.group()):
        words.append(en_number(num))
        if op:
            words.append(ops[op])
    return _pad(" ".join(words))


_EN_TIME_RE = re.compile(
    r"(?<![\d:.])(\d{1,2}):(\d{2})(?::(\d{2}))?(?![\d:])(?:\s?([AaPp])\.?[Mm]\.?(?![A-Za-z]))?"
)
_EN_HOUR_AMPM_RE = re.compile(r"(?<![\d:.])(\d{1,2})\s?([AaPp])\.?[Mm]\.?(?![A-Za-z])")


def _en_time(m: Match[str]) -> str:
    h, mi, s, ampm = m.groups()
    if not _valid_time(h, mi, s):
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


def _en_hour_ampm(m: Match[str]) -> str:
    h, ampm = m.groups()
    if int(h) > 12:
        return m.group()
    return _pad(f"{en_integer(int(h))} {ampm.lower()} m")


def _en_phone(m: Match[str]) -> str:
    groups = re.findall(r"\+|\d+", m.group())
    words = ["plus" if g == "+" else _en_digits(g) for g in groups]
    return _pad(", ".join(words).replace("plus,", "plus"))


# major singular, major plural, minor singular, minor plural
_EN_CURRENCY = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yuan", "yuan", "", ""),
}
_EN_SCALE = {"k": "thousand", "m": "million", "b": "billion", "bn": "billion"}


def _plural(n_str: str, singular: str, plural: str) -> str:
    return singular if n_str in ("1", "1.0") else plural


def _en_money(m: Match[str]) -> str:
    neg, cur, amount, scale = m.groups()
    major1, major, minor1, minor = _EN_CURRENCY[cur]
    sign = "minus " if neg else ""
    if scale:
        scale_word = _EN_SCALE.get(scale.lower(), scale.lower())
        if scale_word in ("万亿", "亿", "万", "千"):
            return m.group()  # Chinese scale inside an English sentence: leave to plain rules
        return _pad(f"{sign}{en_number(amount)} {scale_word} {major}")
    whole, _, frac = amount.partition(".")
    if len(frac) > 2 or (frac and not minor):
        return _pad(f"{sign}{en_number(amount)} {major}")
    cents = int(frac.ljust(2, "0")) if frac else 0
    parts = []
    if int(whole) or not cents:
        parts.append(f"{en_integer(int(whole))} {_plural(whole, major1, major)}")
    if cents:
        parts.append(f"{en_integer(cents)} {minor1 if cents == 1 else minor}")
    return _pad(sign + " and ".join(parts))


_EN_UNITS = {
    "km/h": ("kilometer per hour", "kilometers per hour"), "m/s": ("meter per second", "meters per second"),
    "km²": ("square kilometer", "square kilometers"), "m²": ("square meter", "square meters"),
    "㎡": ("square meter", "square meters"), "cm²": ("square centimeter", "square centimeters"),
    "km": ("kilometer", "kilometers"), "kg": ("kilogram", "kilograms"), "cm": ("centimeter", "centimeters"),
    "mm": ("millimeter", "millimeters"), "mg": ("milligram", "milligrams"), "ml": ("milliliter", "milliliters"),
    "mL": ("milliliter", "milliliters"), "mph": ("mile per hour", "miles per hour"),
    "lbs": ("pound", "pounds"), "lb": ("pound", "pounds"), "ft": ("foot", "feet"), "m": ("meter", "meters"),
    "g": ("gram", "grams"), "L": ("liter", "liters"), "℃": ("degree Celsius", "degrees Celsius"),
    "°C": ("degree Celsius", "degrees Celsius"), "°F": ("degree Fahrenheit", "degrees Fahrenheit"),
    "°": ("degree", "degrees"),
}


def _en_unit(m: Match[str]) -> str:
    num, unit = m.groups()
    return f"{num} {_plural(num, *_EN_UNITS[unit])} "  # number itself is read by a later rule


def _en_decade(m: Match[str]) -> str:
    century, decade = m.groups()
    words = en_year(int(century + decade)) if century else en_integer(int(decade))
    words = words[:-1] + "ies" if words.endswith("y") else words + "s"
    return _pad(words)


_YEAR_CONTEXT = r"in|since|by|from|until|till|through|during|before|after|around|circa|year|early|late|mid"
_EN_YEAR_RE = re.compile(
    rf"(?i)(?<![A-Za-z])((?:{_YEAR_CONTEXT})\s+)(\d{{4}})(?![\d%]|\.\d|\s?%|\s?[-–~]\s?\d)"
    rf"|(?<![\d.])(\d{{4}})(?=\s?(?:AD|BC|BCE|CE)(?![A-Za-z]))"
)


def _en_year_ctx(m: Match[str]) -> str:
    prefix, year, bare = m.groups()
    y = year or bare
    if not _is_year(y):
        return m.group()
    return (prefix or "") + _pad(en_year(int(y)))


def _en_range(m: Match[str]) -> str:
    a, pa, b, pb = m.groups()
    if _is_year(a) and _is_year(b):
        return _pad(f"{en_year(int(a))} to {en_year(int(b))}")
    suffix = " percent" if (pa or pb) else ""
    first = en_number(a) + (" percent" if pa and pb else "")
    return _pad(f"{first} to {en_number(b)}{suffix}")


def _en_percent(m: Match[str]) -> str:
    neg, num, sign = m.groups()
    word = "percent" if sign == "%" else "per mille"
    return _pad(("minus " if neg else "") + f"{en_number(num)} {word}")


def _en_fraction(m: Match[str]) -> str:
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


def _en_plain(m: Match[str]) -> str:
    s = m.group()
    if s.count(".") >= 2:
        return _pad(" point ".join(en_number(p) for p in s.split(".")))
    return _pad(en_number(s))


def _en_domain(m: Match[str]) -> str:
    s = re.sub(r"^https?://", "", m.group())
    return _pad(s.replace(".", " dot ").replace("/", " slash ").replace("_", " underscore "))


_EN_ABBREVIATIONS = (
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

_EN_SYMBOLS = {
    "&": " and ", "@": " at ", "+": " plus ", "=": " equals ", "×": " times ",
    "÷": " divided by ", "≈": " approximately ", "≤": " at most ", "≥": " at least ",
    "%": " percent ", "‰": " per mille ", "？": ".", "?": ".", "…": ".", "。": ".", "、": ",",
    "—": ", ", "–": ", ", "_": " ", "*": " ", "/": " ", "\\": " ", "|": ", ", "#": " ",
    "~": " ", "\n": ". ",
}
_EN_SYMBOL_RE = re.compile("|".join(re.escape(k) for k in _EN_SYMBOLS))

_EN_RULES: Tuple[Tuple[Pattern[str], Callable[[Match[str]], str]], ...] = (
    (_DOMAIN_RE, _en_domain),
    (_ISO_DATE_RE, _en_iso_date),
    (_EN_MONTH_DAY_RE, _en_month_day),
    (_EN_DAY_MONTH_RE, _en_day_month),
    (_EXPR_RE, _en_expr),
    (_EN_TIME_RE, _en_time),
    (_EN_HOUR_AMPM_RE, _en_hour_ampm),
    (_PHONE_RE, _en_phone),
    (_MONEY_RE, _en_money),
    (_UNIT_RE, _en_unit),
    (re.compile(r"(?<![\d.])'?(1[0-9]|20)?(\d0)s(?![A-Za-z])"), _en_decade),  # 1990s, '80s
    (_EN_YEAR_RE, _en_year_ctx),
    (_ORDINAL_RE, lambda m: _pad(en_ordinal(int(m.group(1))))),
    (_RANGE_RE, _en_range),
    (_PERCENT_RE, _en_percent),
    (_RATIO_RE, lambda m: _pad(f"{en_number(m.group(1))} to {en_number(m.group(2))}")),
    (_FRACTION_RE, _en_fraction),
    (_NEGATIVE_RE, lambda m: " minus "),
    (_PLAIN_NUM_RE, _en_plain),
    (re.compile(r"(?<=[A-Za-z])-(?=[A-Za-z])"), lambda m: " "),  # well-known -> well known
    (_EN_SYMBOL_RE, lambda m: _EN_SYMBOLS[m.group()]),
)

_SPACE_BEFORE_PUNCT_RE = re.compile(r"[ \t]+(?=[,.;:!?，。、；：！？])")
_MULTI_SPACE_RE = re.compile(r"[ \t]{2,}")


def _en_chunk(text: str) -> str:
    text = _common_prep(text)
    for pattern, word in _EN_ABBREVIATIONS:
        text = pattern.sub(word, text)
    text = _apply_rules(text, _EN_RULES)
    text = _MULTI_SPACE_RE.sub(" ", text)
    return _SPACE_BEFORE_PUNCT_RE.sub("", text)


def normalize_numbers_en(text: str) -> str:
    """English readings for numbers and symbols; control tags are left untouched."""
    return _map_chunks(text, _en_chunk)


# --------------------------------------------------------------------------- #
# Segmentation
# --------------------------------------------------------------------------- #


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


def _split_sentences(text: str) -> List[str]:
    """Lossless split after sentence ends and newlines; never inside a control tag."""
    pieces: List[str] = []
    start = i = 0
    n = len(text)
    while i < n:
        tag = CONTROL_TAG_RE.match(text, i)
        if tag:
            i = tag.end()
            continue
        ch = text[i]
        if ch == "\n":
            i += 1
        elif ch in _SENT_PUNCT or (ch == "." and _is_full_stop(text, i)):
            i += 1
            while i < n and (text[i] in _SENT_PUNCT or text[i] == "." or text[i] in _CLOSERS):
                i += 1
        else:
            i += 1
            continue
        pieces.append(text[start:i])
        start = i
    if start < n:
        pieces.append(text[start:])
    return pieces


def _split_clauses(text: str) -> List[str]:
    """Lossless split after commas/semicolons/colons, except inside numbers (1,000 / 10:30)."""
    pieces: List[str] = []
    start = 0
    for i, ch in enumerate(text):
        if ch not in _CLAUSE_PUNCT:
            continue
        if ch in ",:" and 0 < i < len(text) - 1 and text[i - 1].isdigit() and text[i + 1].isdigit():
            continue
        pieces.append(text[start:i + 1])
        start = i + 1
    if start < len(text):
        pieces.append(text[start:])
    return pieces


def _split_words(text: str) -> List[str]:
    """Lossless split at whitespace (tags contain none, so they stay whole)."""
    return [p for p in re.findall(r"\s*\S+\s*|\s+", text)]


def _hard_cut(text: str, fits: Callable[[str], bool]) -> List[str]:
    """Last resort: greedy runs of atoms that fit (a control tag is one atom, never cut)."""
    out: List[str] = []
    cur = ""
    for atom in _ATOM_RE.findall(_WS_RE.sub(" ", text)):
        if cur and not fits(cur + atom):
            out.append(cur)
            cur = ""
        cur += atom
    if cur:
        out.append(cur)
    return out


_SPLITTERS: Tuple[Callable[[str], List[str]], ...] = (_split_clauses, _split_words)


def _fit(piece: str, fits: Callable[[str], bool], level: int = 0,
         prefer: Optional[Callable[[str], bool]] = None) -> List[str]:
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
    return [_WS_RE.sub(" ", s).strip() for s in out]


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


def _check_max_chars(max_chars: int) -> None:
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
    return max_seconds is None or expected_seconds(text) <= max_seconds


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
    _check_max_chars(max_chars)
    _check_max_seconds(max_seconds)

    def fits(piece: str) -> bool:
        return segment_fits(piece, max_chars, max_seconds)

    def fits_chars(piece: str) -> bool:
        return text_length(piece) <= max_chars

    text = _sanitize(text)
    if not is_speakable(text):
        return []
    segments: List[str] = []
    current = ""
    for sentence in _split_sentences(text):
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
    segments = [_WS_RE.sub(" ", s).strip() for s in segments]
    return _absorb_unspeakable(segments, fits_chars)


# --------------------------------------------------------------------------- #
# Front end owning ChatTTS's Normalizer
# --------------------------------------------------------------------------- #


@dataclass(frozen=True)
class Segment:
    text: str  # normalised, ready for the ChatTTS tokenizer
    lang: Lang


# Commas right after another mark add nothing ("，，" / "。，" / ", ,").
_FINAL_PUNCT_RUN_RE = re.compile(r"[，、,]+(?=[。.])|(?<=[，。、,.])\s*[，、,]+")
_LEADING_PUNCT_RE = re.compile(r"^[\s，。、,.]+")


def _tidy(text: str) -> str:
    text = _WS_RE.sub(" ", text)
    text = re.sub(r" +(?=[，。、,.])", "", text)
    text = _FINAL_PUNCT_RUN_RE.sub("", text)
    text = re.sub(r"(?<=[,.])(?=[A-Za-z])", " ", text)  # "(approx.)" left "cents,approximately"
    return _LEADING_PUNCT_RE.sub("", text).strip()


def _check_lang(lang: Optional[str]) -> None:
    if lang is not None and lang not in _LANGS:
        raise ValueError(f"lang must be 'zh', 'en' or None, got {lang!r}")


def _default_homophones_path() -> str:
    import ChatTTS  # heavy (torch); imported only when a front end is built

    return os.path.join(os.path.dirname(ChatTTS.__file__), "res", "homophones_map.json")


class TextFrontend:
    """Owns one ChatTTS ``Normalizer`` with the zh/en number normalisers registered.

    Thread-safe: the Normalizer (numba JIT'd helpers, shared dict of normalisers) is
    not documented as thread-safe, so every call into it holds a lock; it takes well
    under a millisecond per sentence.
    """

    def __init__(self, homophones_map_path: Optional[str] = None) -> None:
        from ChatTTS.norm import Normalizer

        # ChatTTS logs replaced homophones at INFO and invalid characters at WARNING,
        # both quoting user text: give it a child logger that only lets errors through.
        norm_logger = logging.getLogger(f"{__name__}.chattts_normalizer")
        norm_logger.setLevel(logging.ERROR)
        self._lock = threading.Lock()
        self._normalizer = Normalizer(homophones_map_path or _default_homophones_path(), norm_logger)
        for name, fn in (("zh", normalize_numbers_zh), ("en", normalize_numbers_en)):
            if not self._normalizer.register(name, fn):
                raise RuntimeError(f"could not register the {name} normaliser with ChatTTS")

    def warmup(self) -> float:
        """Run every numba-compiled path once (first call JIT-compiles); returns seconds taken."""
        start = time.perf_counter()
        samples = (("你好[uv_break]，价格是$20。", "zh"), ("行不行", "zh"),
                   ("Hello [laugh] world 3.5%.", "en"), ("plain text", "en"))
        with warnings.catch_warnings():
            # numba warns (once, while compiling ChatTTS's helpers) about reflected lists.
            warnings.filterwarnings("ignore", message=r"(?s).*reflected list")
            for sample, lang in samples:
                self.normalize(sample, lang=lang)
                self.normalize(sample, lang=lang, do_normalize=False, do_homophones=False)
        elapsed = time.perf_counter() - start
        logger.info("text front end warm-up took %.2fs", elapsed)
        return elapsed

    def _run_normalizer(self, text: str, lang: Lang, do_normalize: bool, do_homophones: bool) -> str:
        with self._lock:
            return self._normalizer(
                text,
                do_text_normalization=do_normalize,
                do_homophone_replacement=do_homophones,
                lang=lang,
            )

    def normalize(
        self,
        text: str,
        lang: Optional[str] = None,
        do_normalize: bool = True,
        do_homophones: bool = True,
    ) -> str:
        """Numbers/symbols to words (per sentence language unless ``lang`` is given), then
        ChatTTS's homophone replacement and invalid-character removal. Keeps control tags.
        Returns "" when nothing speakable remains."""
        if not isinstance(text, str):
            raise ValueError(f"text must be str, got {type(text).__name__}")
        _check_lang(lang)
        text = _strip_stray_brackets(_sanitize(text))
        if not text.strip():
            return ""
        default: Lang = lang or detect_language(text)  # type: ignore[assignment]
        out = []
        for sentence in _split_sentences(text):
            if not sentence.strip():
                out.append(" ")
                continue
            sentence_lang: Lang = lang or _detect_or(sentence, default)  # type: ignore[assignment]
            out.append(self._run_normalizer(sentence.replace("\n", " "), sentence_lang, do_normalize, do_homophones))
        result = _tidy("".join(out))
        return result if is_speakable(result) else ""

    def process(
        self,
        text: str,
        lang: Optional[str] = None,
        normalize: bool = True,
        max_chars: int = 120,
        max_seconds: Optional[float] = None,
    ) -> List[Segment]:
        """Split (on the raw text), normalise each segment, drop empty ones.

        ``normalize=False`` skips number/symbol normalisation only: the text still goes
        through homophone replacement and invalid-character removal, so it is always safe
        for the tokenizer (digits are then dropped, as ChatTTS would). Segments that grow
        past ``max_chars`` when normalised are split again; text is never truncated.
        """
        if not isinstance(text, str):
            raise ValueError(f"text must be str, got {type(text).__name__}")
        _check_lang(lang)
        _check_max_chars(max_chars)
        segments: List[Segment] = []
        for raw in split_segments(text, max_chars, max_seconds):
            normed = self.normalize(raw, lang=lang, do_normalize=normalize)
            if not normed:
                continue
            fits = segment_fits(normed, max_chars, max_seconds)
            parts = [normed] if fits else split_segments(normed, max_chars, max_seconds)
            # Detected on the normalised text: numbers are words by now, in the
            # language they were normalised in.
            segments.extend(Segment(text=p, lang=lang or detect_language(p)) for p in parts)  # type: ignore[arg-type]
        logger.debug("text front end produced %d segment(s) from %d chars", len(segments), len(text))
        return segments
