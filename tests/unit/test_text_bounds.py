"""The text front end in bounded time on hostile input: digit runs past 15 digits are read digit
by digit by every number rule, and no pass rescans (4096-character floods of digits, separators,
currency signs, fraction slashes, ordinal suffixes, operators, dots finish well under a second).

Readings of ordinary numbers are held by tests/test_text.py; here only what changes past the bound."""

from __future__ import annotations

import random
import time

import pytest

from serve_app.engine.text import TextFrontend
from serve_app.engine.text.en import normalize_numbers_en
from serve_app.engine.text.zh import normalize_numbers_zh

N = 4096  # ingress.max_input_chars
LONG = "1234567890123456"  # 16 digits: one past the bound


def flood(unit: str, n: int = N) -> str:
    return (unit * (n // len(unit) + 1))[:n]


_rng = random.Random(5)
DIGITS = "".join(_rng.choice("123456789") for _ in range(N))
FLOODS = {
    "digits": DIGITS,
    "thousands separators": ",".join(DIGITS[i : i + 3] for i in range(0, N * 3 // 4, 3)),
    "currency": "$" + DIGITS[:-1],
    "currency with cents": "$" + DIGITS[: N - 4] + ".99",
    "currency separated": "£" + ",".join(DIGITS[i : i + 3] for i in range(0, 3000, 3)) + ".50",
    "fraction": DIGITS[:2000] + "/" + DIGITS[2000:4000],
    "fraction small denominator": DIGITS[: N - 2] + "/3",
    "ordinal": DIGITS[: N - 2] + "th",
    "percent": DIGITS[: N - 1] + "%",
    "decimal": DIGITS[:2000] + "." + DIGITS[2000:4000],
    "range": DIGITS[:2000] + "-" + DIGITS[2000:4000],
    "yuan": "¥" + DIGITS[: N - 2] + "元",
    "many amounts": flood("$7 "),
    "many ordinals": flood("77th "),
    "many fractions": flood("7/8 "),
    "many percents": flood("7%"),
    "operators": flood("1+"),
    "operators, an equals at the end": flood("12+")[: N - 2] + "=3",
    "minus signs": flood("1-"),
    "slashes": flood("1/"),
    "dots": flood("1."),
    "colons": flood("1:"),
    "spaced operators": flood("1 - "),
    "dotted labels": flood("a1."),
    "mixed": flood("$1,234.5/6th-7%:"),
}


@pytest.fixture(scope="module")
def frontend() -> TextFrontend:
    fe = TextFrontend()
    fe.warmup()
    return fe


def _timed(fn, *args, **kwargs) -> float:
    t0 = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - t0


@pytest.mark.parametrize("name", list(FLOODS))
def test_floods_finish_well_under_a_second(frontend: TextFrontend, name: str) -> None:
    """Each number pass alone, the whole normaliser and the segmenter: 4096 characters each, in
    both languages. (Before: OverflowError from num2words on long amounts, ordinals and
    fractions; 0.3-0.4 s for one arithmetic pass over "1+1+...".)"""
    text = FLOODS[name]
    worst = 0.0
    for normalize in (normalize_numbers_en, normalize_numbers_zh):
        worst = max(worst, _timed(normalize, text))
    for lang in ("en", "zh"):
        worst = max(worst, _timed(frontend.normalize, text, lang=lang))
        worst = max(worst, _timed(frontend.process, text, lang=lang, max_chars=120, max_seconds=4.0))
    assert worst < 1.0, f"{name}: {worst:.3f}s"


@pytest.mark.parametrize("unit", ["1+", "1.", "a1.", "1 - "])
def test_passes_are_linear_not_quadratic(unit: str) -> None:
    """Four times the text takes about four times as long (a rescanning pass took ~8-16x:
    2.7 s at 16k characters of "1+")."""
    def best(n: int) -> float:
        text = flood(unit, n)
        return min(_timed(normalize_numbers_en, text) for _ in range(3))

    small, big = best(4096), best(4 * 4096)
    assert big < 8 * small + 0.02, (small, big)


@pytest.mark.parametrize("raw, expected", [
    # Past 15 digits: digit by digit, whatever the rule.
    (f"${LONG}", "one two three four five six seven eight nine zero one two three four five six dollars"),
    (f"${LONG}.50", "one two three four five six seven eight nine zero one two three four five six point five zero dollars"),
    (f"{LONG}th", "one two three four five six seven eight nine zero one two three four five six"),
    (f"{LONG}/3", "one two three four five six seven eight nine zero one two three four five six over three"),
    (f"1/{LONG}", "one over one two three four five six seven eight nine zero one two three four five six"),
    ("$1,234,567,890,123,456", "one two three four five six seven eight nine zero one two three four five six dollars"),
    # Up to 15 digits: read as numbers, as before.
    ("$123456789012345", "one hundred and twenty three trillion four hundred and fifty six billion seven hundred "
                         "and eighty nine million twelve thousand three hundred and forty five dollars"),
    ("123456789012345th", "one hundred and twenty three trillion four hundred and fifty six billion seven hundred "
                          "and eighty nine million twelve thousand three hundred and forty fifth"),
    ("3/4", "three quarters"),
    ("$3.50", "three dollars and fifty cents"),
])
def test_english_long_runs_digit_by_digit(raw: str, expected: str) -> None:
    assert normalize_numbers_en(raw).strip() == expected


@pytest.mark.parametrize("raw, expected", [
    (f"¥{LONG}", "一二三四五六七八九零一二三四五六元"),
    (f"第{LONG}th", "第第一二三四五六七八九零一二三四五六"),
    (f"{LONG}/3", "三分之一二三四五六七八九零一二三四五六"),
    ("¥1234", "一千二百三十四元"),
])
def test_chinese_long_runs_digit_by_digit(raw: str, expected: str) -> None:
    assert normalize_numbers_zh(raw) == expected


def test_expressions_read_as_before_around_chains() -> None:
    """The linear arithmetic pass finds what the single regex found: after a match the scan
    goes on inside the same operator chain."""
    assert normalize_numbers_zh("01/06 = 61+5+856 = 5") == "零一除以零六等于六十一加五加八百五十六等于五"
    assert normalize_numbers_en("1+2=3").strip() == "one plus two equals three"
    assert normalize_numbers_en("x+2*3=6").strip() == "x plus two times three equals six"
    assert "dot com" in normalize_numbers_en("see 7http://a1.example.com now")
