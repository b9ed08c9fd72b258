"""Tests for serve_app.engine.text (language detection, splitting, normalisation).

The torch-free import and the package data are checked in test_text_import.py."""

from __future__ import annotations

import json
import logging
import random
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.lib.procs import REPO_ROOT as REPO
from serve_app.engine.text import (
    CONTROL_TAG_RE,
    Segment,
    TextFrontend,
    detect_language,
    is_speakable,
    normalize_numbers_en,
    normalize_numbers_zh,
    split_segments,
    text_length,
)

SPEAKABLE = re.compile(r"[\u4e00-\u9fffA-Za-z0-9]")


def speakable_chars(text: str) -> str:
    return "".join(SPEAKABLE.findall(CONTROL_TAG_RE.sub("", text)))


@pytest.fixture(scope="module")
def frontend() -> TextFrontend:
    fe = TextFrontend()
    fe.warmup()
    return fe


# --------------------------------------------------------------------------- #
# Chinese number normalisation
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("2024年3月5日", "二零二四年三月五日"),
        ("2024-03-05", "二零二四年三月五日"),
        ("增长了3.5%", "增长了百分之三点五"),
        ("下降-2%", "下降负百分之二"),
        ("价格$20", "价格二十美元"),
        ("¥20", "二十元"),
        ("￥20", "二十元"),
        ("20元", "二十元"),
        ("$3.50", "三点五美元"),
        ("10:30开会", "十点三十分开会"),
        ("10:05", "十点零五分"),
        ("10:00", "十点整"),
        ("12:00整出发", "十二点整出发"),
        ("营业时间8:00-22:00", "营业时间八点整到二十二点整"),
        ("请拨打12345热线", "请拨打幺二三四五热线"),
        ("拨打110报警", "拨打幺幺零报警"),
        ("共12345人", "共一万二千三百四十五人"),
        ("误差±2", "误差正负二"),
        ("12:30:15", "十二点三十分十五秒"),
        ("-3.2度", "负三点二度"),
        ("0.5", "零点五"),
        ("电话13812345678", "电话幺三八幺二三四五六七八"),
        ("010-12345678", "零幺零，幺二三四五六七八"),
        ("3-5天", "三到五天"),
        ("1~3", "一到三"),
        ("3%-5%", "百分之三到百分之五"),
        ("1234个", "一千二百三十四个"),
        ("10010", "一万零一十"),
        ("100000001", "一亿零一"),
        ("15", "十五"),
        ("1,234,567元", "一百二十三万四千五百六十七元"),
        ("１２３", "一百二十三"),
        ("007", "零零七"),
        ("第1名", "第一名"),
        ("1/3", "三分之一"),
        ("3:2", "三比二"),
        ("5-3=2", "五减三等于二"),
        ("a+b=c", "a加b等于c"),
        ("A&B", "A和B"),
        ("x@y.com", "x艾特y点com"),
        ("气温25°C", "气温二十五摄氏度"),
        ("25℃", "二十五摄氏度"),
        ("5km", "五公里"),
        ("3kg", "三千克"),
        ("10元/斤", "十元每斤"),
        ("版本1.2.3", "版本一点二点三"),
        ("iPhone 15", "iPhone 十五"),
    ],
)
def test_zh_numbers(raw: str, expected: str) -> None:
    assert normalize_numbers_zh(raw) == expected


# --------------------------------------------------------------------------- #
# English number normalisation
# --------------------------------------------------------------------------- #


def en(text: str) -> str:
    return " ".join(normalize_numbers_en(text).split())


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("It is 10:30 now", "It is ten thirty now"),
        ("at 10:00", "at ten o clock"),
        ("10:05 a.m.", "ten oh five a m"),
        ("at 5pm", "at five p m"),
        ("3.5%", "three point five percent"),
        ("$20", "twenty dollars"),
        ("$3.50", "three dollars and fifty cents"),
        ("$1", "one dollar"),
        ("$0.99", "ninety nine cents"),
        ("$2.5 million", "two point five million dollars"),
        ("the 1st place", "the first place"),
        ("the 22nd time", "the twenty second time"),
        ("in 2024 we", "in twenty twenty four we"),
        ("from 2020-2024", "from twenty twenty to twenty twenty four"),
        ("from 2010 to 2015.", "from twenty ten to twenty fifteen."),
        ("±2 mm", "plus or minus two millimeters"),
        ("between 1990 and 2000", "between nineteen ninety and two thousand"),
        ("from 5000 to 6000 people", "from five thousand to six thousand people"),
        ("the 1990s", "the nineteen nineties"),
        ("1234 apples", "one thousand two hundred and thirty four apples"),
        ("1,000,000 people", "one million people"),
        ("0.5", "zero point five"),
        ("-7 degrees", "minus seven degrees"),
        ("3-5 days", "three to five days"),
        ("A & B", "A and B"),
        ("5 + 3 = 8", "five plus three equals eight"),
        ("5 - 3 = 2", "five minus three equals two"),
        ("me@x.com", "me at x dot com"),
        ("25°C", "twenty five degrees Celsius"),
        ("1 kg", "one kilogram"),
        ("12.5 km", "twelve point five kilometers"),
        ("March 5, 2024", "March fifth, twenty twenty four"),
        ("1/2", "one half"),
        ("2/3", "two thirds"),
        ("call 555-123-4567", "call five five five, one two three, four five six seven"),
        ("Mr. Smith, e.g. here", "Mister Smith, for example here"),
        ("#1 fan", "number one fan"),
        ("well-known", "well known"),
    ],
)
def test_en_numbers(raw: str, expected: str) -> None:
    assert en(raw) == expected


def test_number_normalisers_keep_tags() -> None:
    assert normalize_numbers_zh("第[break_6]1[laugh_0]名") == "第[break_6]一[laugh_0]名"
    assert en("It costs [speed_5] $20 [uv_break] now") == "It costs [speed_5] twenty dollars [uv_break] now"


# --------------------------------------------------------------------------- #
# Language detection
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "text, lang",
    [
        ("你好世界", "zh"),
        ("Hello world", "en"),
        ("我用iPhone拍照", "zh"),
        ("I love 北京 very much", "en"),
        ("你 hello", "en"),  # tie -> en
        ("123", "en"),
        ("", "en"),
        ("[uv_break][laugh_0]你", "zh"),  # tags are not Latin words
        ("2024年3月5日", "zh"),
    ],
)
def test_detect_language(text: str, lang: str) -> None:
    assert detect_language(text) == lang


# --------------------------------------------------------------------------- #
# Splitting
# --------------------------------------------------------------------------- #


def check_segments(text: str, segments: list[str], max_chars: int) -> None:
    assert all(text_length(s) <= max_chars for s in segments), segments
    assert all(s and s == s.strip() and is_speakable(s) for s in segments), segments
    assert speakable_chars("".join(segments)) == speakable_chars(text)


def test_split_merges_short_sentences() -> None:
    text = "你好。我很好。谢谢！你呢？"
    assert split_segments(text, 120) == [text]
    assert split_segments("Hi. Ok. Yes.", 120) == ["Hi. Ok. Yes."]


def test_split_at_sentence_ends_first() -> None:
    text = "The first sentence is here. The second one follows! Is this the third? Yes."
    segments = split_segments(text, 40)
    assert segments == ["The first sentence is here.", "The second one follows!", "Is this the third? Yes."]


def test_split_long_sentence_at_commas() -> None:
    text = "第一句话很长很长，" * 20 + "结束。"
    segments = split_segments(text, 40)
    check_segments(text, segments, 40)
    assert all(s.endswith(("，", "。")) for s in segments)
    assert len(segments) == 5


def test_split_does_not_break_numbers_or_abbreviations() -> None:
    text = "Mr. Smith paid 3.5 dollars, e.g. for 1,000 items at 10:30. The U.S. grew."
    segments = split_segments(text, 30)
    check_segments(text, segments, 30)
    joined = " | ".join(segments)
    for token in ("Mr. Smith", "3.5", "e.g.", "1,000", "10:30", "U.S."):
        assert token in joined


def test_split_falls_back_to_words_and_hard_cut() -> None:
    text = "word " * 100
    segments = split_segments(text, 40)
    check_segments(text, segments, 40)
    assert all(not s.startswith("ord") for s in segments)  # cut at spaces, not inside words

    long_word = "x" * 5000
    segments = split_segments(long_word, 120)
    check_segments(long_word, segments, 120)
    assert "".join(segments) == long_word


def test_split_by_expected_seconds_is_the_same_for_every_script() -> None:
    from serve_app.engine.pacing import expected_seconds

    zh = "我们的系统会把长文本切成几个片段，分别生成语音，再按照顺序拼接起来，这样听众就能更早听到第一句话。"
    en = "A good speech service has to answer quickly, stay up under heavy load, and sound the same every time."
    # 48 characters of Chinese speak ~10 s: one segment by characters alone.
    assert split_segments(zh, 120) == [zh] and expected_seconds(zh) > 9
    for text, limits in ((zh, (4.0, 6.0)), (en, (3.0, 4.0))):
        for limit in limits:
            segments = split_segments(text, 120, max_seconds=limit)
            check_segments(text, segments, 120)
            assert all(expected_seconds(s) <= limit for s in segments), (limit, segments)
            assert len(segments) >= 2 and all(s.endswith(("，", "。", ",", ".")) for s in segments), segments
        # Below a clause's length: cut at every clause, never inside one.
        segments = split_segments(text, 120, max_seconds=1.0)
        check_segments(text, segments, 120)
        assert all(s.endswith(("，", "。", ",", ".")) for s in segments), segments
    # Short sentences still merge up to the limit; a looser limit never gives more segments.
    assert split_segments("你好。我很好。", 120, max_seconds=4.0) == ["你好。我很好。"]
    assert len(split_segments(zh, 120, max_seconds=6.0)) <= len(split_segments(zh, 120, max_seconds=4.0))
    # Characters still bound everything: a 300-letter word is hard-cut at max_chars, never lost.
    word = "x" * 300
    segments = split_segments(word, 100, max_seconds=3.0)
    assert "".join(segments) == word and [len(s) for s in segments] == [100, 100, 100]
    with pytest.raises(ValueError):
        split_segments(zh, 120, max_seconds=0)


def test_expected_seconds_counts_stray_bracket_words_as_speech() -> None:
    from serve_app.engine.pacing import expected_seconds

    # Not a control tag: the front end turns the brackets into spaces and the word is spoken.
    assert expected_seconds("[spk_emb] hello") == expected_seconds("spk emb hello") > expected_seconds("hello")
    # Control tags take no letters' time; break tags take a pause's.
    assert expected_seconds("[laugh_2]hello") == expected_seconds("hello")
    assert expected_seconds("hello[uv_break]") > expected_seconds("hello")


def test_split_never_cuts_tags() -> None:
    text = ("你好[uv_break]世界[laugh_0]" * 40) + "[break_6]" + "abc[oral_2]def " * 30
    for max_chars in (5, 13, 40, 120):
        segments = split_segments(text, max_chars)
        check_segments(text, segments, max_chars)
        for s in segments:
            assert "[" not in CONTROL_TAG_RE.sub("", s) and "]" not in CONTROL_TAG_RE.sub("", s)
        tags = [t for s in segments for t in CONTROL_TAG_RE.findall(s)]
        assert tags == CONTROL_TAG_RE.findall(text)


def test_tags_count_as_one_char() -> None:
    assert text_length("[uv_break]你好[laugh_0]") == 4
    assert split_segments("[uv_break]你好[laugh_0]", 4) == ["[uv_break]你好[laugh_0]"]


@pytest.mark.parametrize("text", ["", "   \n\t ", "。。。！！", "...!?", "[uv_break]", "[laugh][uv_break] 。", "😀😀"])
def test_split_nothing_speakable(text: str) -> None:
    assert split_segments(text) == []


def test_trailing_tag_is_kept_with_its_sentence() -> None:
    assert split_segments("好的。[laugh]") == ["好的。[laugh]"]


@pytest.mark.parametrize(
    "text",
    [
        "😀 Hello 😀 世界 🎉！" * 30,
        "\x00\x07你好\u200b世界\x1b[0m 再见\r\n" * 40,
        "Привет мир. こんにちは。안녕하세요. Hello 你好 123 %$#@!" * 20,
        "a[bc]d [[x]] ]] [[ [unknown_tag] [uv_break" * 20,
        "y" * 5000,
        "。" * 3000 + "好",
    ],
)
def test_split_odd_input(text: str) -> None:
    for max_chars in (1, 7, 120):
        check_segments(text, split_segments(text, max_chars), max_chars)


def test_split_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        split_segments(None)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        split_segments("hi", 0)


# --------------------------------------------------------------------------- #
# TextFrontend
# --------------------------------------------------------------------------- #


def test_warmup_is_cheap_once_done(frontend: TextFrontend) -> None:
    assert frontend.warmup() < 1.0


def test_normalize_zh_sentence(frontend: TextFrontend) -> None:
    text = "今天是2024年3月5日，气温25℃，涨了3.5%！"
    assert frontend.normalize(text) == "今天是二零二四年三月五日，气温二十五摄氏度，涨了百分之三点五。"


def test_normalize_en_sentence(frontend: TextFrontend) -> None:
    text = "It's 10:30, and the price is $3.50!"
    assert frontend.normalize(text) == "Its ten thirty, and the price is three dollars and fifty cents."


def test_normalize_mixed_languages_per_sentence(frontend: TextFrontend) -> None:
    assert frontend.normalize("我用iPhone 15拍了100张照片。") == "我用iPhone 十五拍了一百张照片。"
    assert frontend.normalize("我们在2024年见面。See you in 2024!") == (
        "我们在二零二四年见面。See you in twenty twenty four."
    )
    # Forcing a language overrides detection.
    assert frontend.normalize("in 2024", lang="zh") == "in 二千零二十四"


def test_normalize_homophones_and_invalid_chars(frontend: TextFrontend) -> None:
    assert frontend.normalize("這個國家😀很好") == "这个国家很好"
    assert frontend.normalize("這個國家", do_homophones=False) == "這個國家"


def test_normalize_keeps_control_tags(frontend: TextFrontend) -> None:
    text = "你好[uv_break]，我是[laugh_0]小明[break_6]，今年18岁。"
    assert frontend.normalize(text) == "你好[uv_break]，我是[laugh_0]小明[break_6]，今年十八岁。"
    assert frontend.normalize("Hello [laugh] world [speed_5] 2 times") == "Hello [laugh] world [speed_5] two times"


def test_normalize_strips_unknown_brackets(frontend: TextFrontend) -> None:
    # Internal ChatTTS tokens must not be injectable; an unclosed '[' must not eat text.
    assert frontend.normalize("[spk_emb]hack[Stts]") == "spk emb hack Stts"
    assert frontend.normalize("a[bc") == "a bc"


def test_normalize_without_number_normalisation(frontend: TextFrontend) -> None:
    # Digits are unpronounceable, so ChatTTS's Normalizer drops them.
    assert frontend.normalize("我有3个苹果", do_normalize=False) == "我有个苹果"


@pytest.mark.parametrize("text", ["", "   ", "。。。", "[uv_break]", "😀", "*** ~~~ |"])
def test_normalize_empty(frontend: TextFrontend, text: str) -> None:
    assert frontend.normalize(text) == ""


def test_non_str_input_raises(frontend: TextFrontend) -> None:
    for bad in (None, 123, b"bytes", ["list"]):
        with pytest.raises(ValueError, match="must be str"):
            frontend.normalize(bad)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="must be str"):
            frontend.process(bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        frontend.process("hi", lang="fr")


def test_process_segments(frontend: TextFrontend) -> None:
    segments = frontend.process("你好[uv_break]，今天是2024年3月5日。Hello there, it costs $20.")
    assert segments == [
        Segment(text="你好[uv_break]，今天是二零二四年三月五日。Hello there, it costs twenty dollars.", lang="zh")
    ]
    segments = frontend.process("你好。Hello there, it costs $20.", max_chars=10)
    assert segments[0] == Segment(text="你好。", lang="zh")
    assert len(segments) > 2 and {s.lang for s in segments[1:]} == {"en"}
    assert all(text_length(s.text) <= 10 for s in segments)


def test_process_long_text_is_split_not_truncated(frontend: TextFrontend) -> None:
    text = "第一段有123个字。" * 50 + "The 2nd part costs $5.50! " * 20
    segments = frontend.process(text, max_chars=60)
    assert all(text_length(s.text) <= 60 for s in segments)
    assert all(is_speakable(s.text) for s in segments)
    joined = "".join(s.text for s in segments)
    assert joined.count("一百二十三") == 50
    assert joined.count("five dollars and fifty cents") == 20
    assert {s.lang for s in segments} == {"zh", "en"}


@pytest.mark.parametrize("text", ["", "。。。！！", "[uv_break][laugh_0]", "😀😀😀", "   "])
def test_process_nothing_speakable(frontend: TextFrontend, text: str) -> None:
    assert frontend.process(text) == []


@pytest.mark.parametrize(
    "text",
    ["😀 Hello 😀 世界 🎉！" * 30, "\x00\x07你好\u200b世界\x1b[0m\r\n" * 40, "z" * 5000, "1" * 5000, "$" * 500 + "好"],
)
def test_process_odd_input(frontend: TextFrontend, text: str) -> None:
    for max_chars in (7, 120):
        segments = frontend.process(text, max_chars=max_chars)
        assert segments
        assert all(0 < text_length(s.text) <= max_chars and is_speakable(s.text) for s in segments)


def test_process_without_normalisation(frontend: TextFrontend) -> None:
    assert frontend.process("這個3.", normalize=False) == [Segment(text="这个.", lang="zh")]


def test_no_user_text_logged_at_info(frontend: TextFrontend, caplog: pytest.LogCaptureFixture) -> None:
    secret = "這個國家😀机密"
    with caplog.at_level(logging.DEBUG):
        frontend.process(secret)
        frontend.normalize(secret)
    for record in caplog.records:
        if record.levelno >= logging.INFO:
            message = record.getMessage()
            assert not set(message) & set("這個國家😀机密"), message


def _equivalence_inputs() -> list[str]:
    """Corpus sentences and seeded random strings, prepared as TextFrontend.normalize hands them on."""
    from serve_app.engine.text.chars import sanitize
    from serve_app.engine.text.segment import split_sentences
    from serve_app.engine.text.tags import strip_stray_brackets

    corpus = REPO / "bench" / "text_corpus.txt"
    texts = [ln.split("\t", 1)[1] for ln in corpus.read_text(encoding="utf-8").splitlines() if "\t" in ln]
    rng = random.Random(7)
    pool = (
        list("0123456789.,:;!?-+*/=%$€£¥￥~_#@&|()<>{}'\"“”‘’「」『』【】《》（）！？：；，。、…－＜＞＃")
        + list("abXYZ")
        + list("你好的是這個國家爲")
        + ["\u3400", "\uf900", "😀", "\u200b", "\x00", "Ａ", "３", "\u3000", " ", "\n"]
        + [
            "[uv_break]",
            "[laugh_2]",
            "[break_6]",
            "[speed_5]",
            "[spk_emb]",
            "[foo",
            "bar]",
            "2024-03-05",
            "10:30",
            "$3.50",
            "3.5%",
            "13812345678",
            "5km",
            "March 5",
        ]
    )
    texts += ["".join(rng.choice(pool) for _ in range(rng.randint(1, 30))) for _ in range(250)]
    prepared = [s.replace("\n", " ") for t in texts for s in split_sentences(strip_stray_brackets(sanitize(t)))]
    return [s for s in prepared if s.strip()]


def test_chattts_normalizer_matches_chattts() -> None:
    """The torch-free reimplementation gives exactly what ChatTTS's own Normalizer gives."""
    from ChatTTS.norm import Normalizer

    from serve_app.engine.text.chattts_norm import (
        ChatTTSNormalizer,
        default_homophones_path,
    )

    rules = {"zh": normalize_numbers_zh, "en": normalize_numbers_en}
    quiet = logging.getLogger("test_text.chattts")
    quiet.setLevel(logging.ERROR)
    theirs = Normalizer(default_homophones_path(), quiet)
    for name, fn in rules.items():
        assert theirs.register(name, fn)
    ours = ChatTTSNormalizer(rules)
    inputs = _equivalence_inputs()
    assert len(inputs) > 500
    checked = 0
    for text in inputs:
        for lang in ("zh", "en"):
            for do_normalize in (True, False):
                for do_homophones in (True, False):
                    expected = theirs(
                        text, do_text_normalization=do_normalize, do_homophone_replacement=do_homophones, lang=lang
                    )
                    assert ours(text, lang, do_normalize, do_homophones) == expected, (text, lang, do_normalize)
                    checked += 1
    # The inputs exercise every step: homophones, widened and mapped marks, dropped characters.
    homophones = json.loads(Path(default_homophones_path()).read_text(encoding="utf-8"))
    joined = "".join(inputs)
    assert any(c in homophones for c in joined) and "😀" in joined and "（" in joined and "-" in joined
    assert checked == 8 * len(inputs)


def test_thread_safety(frontend: TextFrontend) -> None:
    texts = [
        f"第{i}段：价格是${i}.50，时间{i % 24}:30。This is sentence {i}, costing {i}%! 這個國家[uv_break]很好。" * 3
        for i in range(32)
    ]
    expected = [frontend.process(t, max_chars=50) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        for _ in range(3):
            assert list(pool.map(lambda t: frontend.process(t, max_chars=50), texts)) == expected


@pytest.mark.parametrize(
    "text, spoken",
    [
        ("The offer is valid until 2023-12-31.", "December thirty first, twenty twenty three."),
        ("We met on July 1, 2022.", "July first, twenty twenty two."),
        ("It closes on Oct 31.", "October thirty first."),
        ("Version 2.4.1 is out.", "two point four point one"),  # not a date
    ],
)
def test_dates_before_a_sentence_final_stop(text, spoken):
    frontend = TextFrontend()
    assert spoken in " ".join(s.text for s in frontend.process(text))


def test_segments_know_where_they_came_from_in_the_input():
    from serve_app.engine.text import TextFrontend

    text = "你好，欢迎使用语音合成服务。\u200b It is 10:30 now.\n\nSecond   paragraph here! 第三句？"
    segments = TextFrontend().process(text, max_chars=20)
    spans = [s.span for s in segments]
    assert all(span is not None for span in spans)
    assert [text[a:b] for a, b in spans[:2]] == ["你好，欢迎使用语音合成服务。", "It is 10:30 now."]
    assert text[spans[-1][0] : spans[-1][1]].endswith("第三句？")
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]) if a != b)  # in order, never overlapping
