"""Captions (``engine/captions.py``): SRT and WebVTT read back with maintained parsers (``srt``,
``webvtt-py``), checked for text, order, times and layout."""

from __future__ import annotations

import html
import re
import time
import unicodedata

import pytest
import srt
import webvtt

from serve_app.engine.captions import (
    CaptionLayout,
    Cue,
    TimedText,
    build_cues,
    caption_file,
    caption_text,
    format_timestamp,
    to_srt,
    to_webvtt,
)
from serve_app.engine.pacing import expected_seconds

EN_LONG = (
    "This one is a much longer segment that goes on and on, with several clauses, some commas; and it "
    "certainly does not fit into a single cue of two lines at forty-two characters each. It has a second "
    "sentence too, which is also rather long and needs a cue of its own."
)
ZH_LONG = (
    "今天天气很好，我们一起去公园散步吧。公园里有很多花，红的、黄的、紫的，非常漂亮！"
    "小朋友们在草地上跑来跑去，老人们坐在长椅上聊天，一切都是那么美好。"
)
MIXED = (
    "我们用Python写代码，用ChatTTS合成语音，it's great. 然后把字幕放进视频里，"
    "再用ffmpeg把视频和音频合在一起。最后上传到网站上给大家看。"
)


def read_srt(text: str) -> list[tuple[int, int, str]]:
    return [
        (int(s.start.total_seconds() * 1000 + 0.5), int(s.end.total_seconds() * 1000 + 0.5), s.content)
        for s in srt.parse(text)
    ]


def read_vtt(text: str) -> list[tuple[int, int, str, str | None]]:
    return [
        (
            c.start_time.in_milliseconds(),
            c.end_time.in_milliseconds(),
            html.unescape(c.text),
            html.unescape(c.voice) if c.voice else None,
        )
        for c in webvtt.from_string(text).captions
    ]


def columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def check_well_formed(cues: list[Cue]) -> None:
    for a, b in zip(cues, cues[1:]):
        assert a.end_ms <= b.start_ms, (a, b)
    assert all(c.end_ms > c.start_ms for c in cues)


# --------------------------------------------------------------------------- #
# Both formats, read back
# --------------------------------------------------------------------------- #


def test_one_short_segment_per_format():
    items = [TimedText(1.25, 3.5, "Hello there.")]
    assert to_srt(items) == "1\n00:00:01,250 --> 00:00:03,500\nHello there.\n"
    assert to_webvtt(items) == "WEBVTT\n\n00:00:01.250 --> 00:00:03.500\nHello there.\n"
    assert read_srt(to_srt(items)) == [(1250, 3500, "Hello there.")]
    assert read_vtt(to_webvtt(items)) == [(1250, 3500, "Hello there.", None)]


@pytest.mark.parametrize("text, lang", [(EN_LONG, "en"), (ZH_LONG, "zh"), (MIXED, "zh")])
def test_a_long_segment_becomes_several_cues_that_read_back(text, lang):
    items = [TimedText(0.5, 0.5 + expected_seconds(text), text, None)]
    cues = build_cues(items)
    assert len(cues) >= 3
    check_well_formed(cues)
    assert cues[0].start_ms == 500 and cues[-1].end_ms == round((0.5 + expected_seconds(text)) * 1000)
    for cue_list in (read_srt(to_srt(items)), read_vtt(to_webvtt(items))):
        assert [(s, e) for s, e, *_ in cue_list] == [(c.start_ms, c.end_ms) for c in cues]
        assert squash("".join(t for _, _, t, *_ in cue_list)) == squash(text)  # nothing lost, in order
        assert [t.split("\n") for _, _, t, *_ in cue_list] == [list(c.lines) for c in cues]
    width = 32 if lang == "zh" else 42  # 16 full-width characters, or 42 Latin ones
    for cue in cues:
        assert 1 <= len(cue.lines) <= 2
        assert all(columns(line) <= width for line in cue.lines), cue.lines


def test_cue_times_divide_a_segment_by_expected_speaking_time():
    text = "一二三四五六七八九十，一二三四五六七八九十。" * 3 + "Short words at the end, after many Chinese ones."
    cues = build_cues([(10.0, 30.0, text, None)])
    assert len(cues) >= 3
    weights = [expected_seconds("".join(c.lines)) for c in cues]
    total = sum(weights)
    elapsed = 0.0
    for cue, w in zip(cues, weights):
        assert abs(cue.start_ms - (10_000 + 20_000 * elapsed / total)) <= 1
        elapsed += w
    # Not by characters: a cue of Latin letters gets less time per character than one of CJK.
    zh_cue = next(c for c in cues if "一" in c.lines[0])
    en_cue = cues[-1]
    per_char = lambda c: (c.end_ms - c.start_ms) / len("".join(c.lines).replace(" ", ""))  # noqa: E731
    assert per_char(zh_cue) > 2 * per_char(en_cue)


def test_segment_boundaries_stay_exact_and_cues_follow_audio_order():
    items = [
        TimedText(0.0, 1.2, "First."),
        TimedText(1.2, 9.7, EN_LONG),
        TimedText(9.7, 15.0, ZH_LONG),
        TimedText(15.5, 16.25, "Last one."),
    ]
    cues = build_cues(items)
    check_well_formed(cues)
    starts = {c.start_ms for c in cues}
    ends = {c.end_ms for c in cues}
    assert {0, 1200, 9700, 15500} <= starts and {1200, 9700, 15000, 16250} <= ends
    assert cues[0].lines == ("First.",) and cues[-1].lines == ("Last one.",)
    assert read_srt(to_srt(items))[0] == (0, 1200, "First.")
    assert [int(s.index) for s in srt.parse(to_srt(items))] == list(range(1, len(cues) + 1))


# --------------------------------------------------------------------------- #
# Where lines and cues are cut
# --------------------------------------------------------------------------- #


def test_sentences_are_cue_boundaries_when_they_fit():
    text = (
        "The first sentence is about forty or fifty characters long. "
        "The second one is about as long as the first one was."
    )
    cues = build_cues([(0, 8, text, None)])
    assert ["".join(" ".join(c.lines)) for c in cues] == [
        "The first sentence is about forty or fifty characters long.",
        "The second one is about as long as the first one was.",
    ]


def test_a_line_breaks_after_punctuation_when_both_lines_fit():
    (cue,) = build_cues([(0, 4, "We went to the market, and then we walked back home slowly.", None)])
    assert cue.lines == ("We went to the market,", "and then we walked back home slowly.")
    (cue,) = build_cues([(0, 4, "Nothing here breaks it up so the two lines come out even.", None)])
    assert abs(len(cue.lines[0]) - len(cue.lines[1])) <= 8


def test_words_are_never_cut():
    cues = build_cues([(0, 20, EN_LONG, None)])
    words = set(EN_LONG.split())
    for cue in cues:
        for line in cue.lines:
            assert all(w in words for w in line.split()), line


def test_a_word_longer_than_a_line_gets_its_own_line():
    url = "https://example.com/a/very/long/path/that/does/not/fit/on/one/line"
    cues = build_cues([(0, 10, f"See {url} for more.", None)])
    lines = [line for c in cues for line in c.lines]
    assert url in lines and all(len(line) <= 42 for line in lines if line != url)


def test_cjk_lines_never_start_with_closing_punctuation():
    text = "红的、黄的、紫的，非常漂亮！" * 6
    cues = build_cues([(0, 30, text, None)])
    for cue in cues:
        for line in cue.lines:
            assert line[0] not in "，。、；：！？）」』", line
            assert columns(line) <= 32


def test_latin_words_inside_chinese_stay_whole():
    cues = build_cues([(0, 10, "我们今天用ChatTTSServe来合成很长很长很长的一段中文语音，感觉非常好。" * 2, None)])
    lines = [line for c in cues for line in c.lines]
    assert sum(line.count("ChatTTSServe") for line in lines) == 2


def test_settings_change_the_widths():
    cues = build_cues([(0, 20, EN_LONG, None)], CaptionLayout(max_line_chars=20, max_lines=1))
    assert all(len(c.lines) == 1 and len(c.lines[0]) <= 20 for c in cues)
    zh = build_cues([(0, 20, ZH_LONG, None)], CaptionLayout(max_cjk_line_chars=10))
    assert all(columns(line) <= 20 for c in zh for line in c.lines)
    with pytest.raises(ValueError):
        CaptionLayout(max_lines=0)


def test_control_tags_are_not_shown():
    (cue,) = build_cues([(0, 2, "你好[uv_break]，世界[laugh]。", None)])
    assert cue.lines == ("你好，世界。",)


# --------------------------------------------------------------------------- #
# Speakers
# --------------------------------------------------------------------------- #


def test_speakers_as_voice_spans_and_prefixes():
    items = [TimedText(0, 2, "Hello there.", "Alloy"), TimedText(2, 4, "你好。", "小明"), TimedText(4, 5, "Bye.")]
    assert [v for *_, v in read_vtt(to_webvtt(items))] == ["Alloy", "小明", None]
    assert [t for _, _, t, _ in read_vtt(to_webvtt(items))] == ["Hello there.", "你好。", "Bye."]
    assert [t for _, _, t in read_srt(to_srt(items))] == ["Alloy: Hello there.", "小明: 你好。", "Bye."]
    assert "<v Alloy>Hello there.</v>" in to_webvtt(items)


def test_every_cue_of_a_long_segment_names_its_speaker_within_the_width():
    items = [TimedText(0, 20, EN_LONG, "Narrator")]
    subs = list(srt.parse(to_srt(items)))
    assert len(subs) >= 3 and all(s.content.startswith("Narrator: ") for s in subs)
    assert all(len(line) <= 42 for s in subs for line in s.content.split("\n"))
    assert {v for *_, v in read_vtt(to_webvtt(items))} == {"Narrator"}


def test_markup_in_text_and_names_is_escaped_in_webvtt():
    items = [TimedText(0, 2, "a < b & c --> d", "R&D <team>")]
    vtt = to_webvtt(items)
    assert "-->" not in vtt.split("\n", 3)[3]  # only the timing line has an arrow
    assert read_vtt(vtt) == [(0, 2000, "a < b & c --> d", "R&D <team>")]


# --------------------------------------------------------------------------- #
# Timestamps, order, degenerate input
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "ms, srt_ts, vtt_ts",
    [
        (0, "00:00:00,000", "00:00:00.000"),
        (1250, "00:00:01,250", "00:00:01.250"),
        (3_723_456, "01:02:03,456", "01:02:03.456"),
        (100 * 3_600_000 + 1, "100:00:00,001", "100:00:00.001"),
    ],
)
def test_timestamps(ms, srt_ts, vtt_ts):
    assert format_timestamp(ms) == srt_ts and format_timestamp(ms, ".") == vtt_ts


def test_times_round_to_the_millisecond_without_overlap():
    cues = build_cues([(0.0, 1.2504, "One.", None), (1.2496, 2.0006, "Two.", None)])
    assert [(c.start_ms, c.end_ms) for c in cues] == [(0, 1250), (1250, 2001)]


@pytest.mark.parametrize(
    "items, says",
    [
        ([(2.0, 3.0, "b", None), (0.0, 1.0, "a", None)], "audio order"),
        ([(0.0, 2.0, "a", None), (1.5, 3.0, "b", None)], "without overlap"),
        ([(2.0, 1.0, "a", None)], "ends before it starts"),
        ([(float("nan"), 1.0, "a", None)], "finite"),
        ([(-1.0, 1.0, "a", None)], "not negative"),
    ],
)
def test_bad_items_are_refused(items, says):
    with pytest.raises(ValueError, match=says):
        build_cues(items)


def test_items_with_nothing_to_show_get_no_cue():
    items = [(0, 1, "  ", None), (1, 2, "[uv_break]", None), (2, 2, "zero length", None), (2, 3, "Shown.", "A")]
    assert build_cues(items) == [Cue(2000, 3000, ("Shown.",), "A")]
    assert to_srt([]) == "" and to_webvtt([]) == "WEBVTT\n"
    assert read_vtt(to_webvtt([])) == []


def test_a_segment_too_short_for_its_cues_gets_one():
    cues = build_cues([(1.0, 1.002, EN_LONG, None)])
    assert len(cues) == 1 and (cues[0].start_ms, cues[0].end_ms) == (1000, 1002)


def test_a_full_request_is_quick():
    items = [(i * 4.0, (i + 1) * 4.0, ZH_LONG if i % 2 else EN_LONG, "S") for i in range(512)]
    start = time.perf_counter()
    out = to_webvtt(items)
    assert time.perf_counter() - start < 5.0
    assert len(webvtt.from_string(out).captions) == len(build_cues(items))


def test_items_may_be_three_or_four_tuples():
    assert build_cues([(0, 1, "One."), (1, 2, "Two.", "B")]) == [
        Cue(0, 1000, ("One.",), None),
        Cue(1000, 2000, ("Two.",), "B"),
    ]


def test_a_segments_caption_is_what_the_caption_files_show():
    """The segments of an answer carry their caption (tags dropped, spaces folded) by the same rule
    the files use: the web page shows it and needs no tag pattern of its own."""
    from serve_app.protocol import SpeechSegment

    seg = SpeechSegment(index=0, text="Hello [uv_break] there [laugh] , friend.", start=0.0, end=1.0)
    assert seg.caption == caption_text(seg.text) == "Hello there, friend."
    assert seg.model_dump()["caption"] == seg.caption
    assert to_srt([TimedText(0.0, 1.0, seg.text)]).splitlines()[2] == seg.caption
    assert caption_file([TimedText(0.0, 1.0, seg.text)], "vtt") == to_webvtt([TimedText(0.0, 1.0, seg.text)])
    with pytest.raises(ValueError):
        caption_file([], "ass")
