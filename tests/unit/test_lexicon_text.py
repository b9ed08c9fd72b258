"""Pronunciation lexicons and the normalisation switch in the text path (no Ray): what the model
reads changes, what captions show does not."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from serve_app.engine.planner import Planner
from serve_app.engine.text.lexicon import LexiconEntry, Pronunciations, apply_lexicon
from serve_app.engine.text.pinyin import PinyinError, parse_pinyin, readings, substitute
from serve_app.engine.text.ssml import parse_ssml
from serve_app.engine.types import ScriptPart, SynthesisOptions, Voice


@pytest.fixture(scope="module")
def planner() -> Planner:
    return Planner()


def lexicon(*entries: dict) -> Pronunciations:
    return Pronunciations(entries=tuple(LexiconEntry(**e) for e in entries))


def test_substitutes_read_only_the_forced_syllable():
    assert set(readings("行")) >= {"xing2", "hang2"}  # a polyphone: the case this exists for
    for syllable in ("hang2", "xing2", "yin2", "zhong4"):
        ch = substitute("行", syllable)
        assert ch is not None and ch != "行"
        assert readings(ch)[0] == syllable
    assert readings(substitute("行", "hang2")) == ("hang2",)  # a single-reading character where there is one
    assert substitute("银", "yin2") == "银"  # its only reading: kept as written
    assert substitute("行", "qqq1") is None


def test_a_polyphone_forced_both_ways(planner):
    text = "我去银行取钱，这样行不行？"
    as_hang = planner.plan(text, SynthesisOptions(pronunciations=lexicon({"text": "银行", "pinyin": "yin2 hang2"})))
    as_xing = planner.plan(text, SynthesisOptions(pronunciations=lexicon({"text": "行", "pinyin": "xing2"})))
    plain = planner.plan(text, SynthesisOptions())
    hang, xing = substitute("行", "hang2"), substitute("行", "xing2")
    assert plain.texts == ["我去银行取钱，这样行不行。"]
    assert as_hang.texts == [f"我去银{hang}取钱，这样行不行。"]  # only within 银行
    assert as_xing.texts == [f"我去银{xing}取钱，这样{xing}不{xing}。"]  # every 行
    for plan in (as_hang, as_xing):
        assert plan.sources == [text]  # captions: the written characters
        assert plan.spans == [(0, len(text))]


def test_longest_entry_wins_and_latin_words_match_whole(planner):
    entries = lexicon(
        {"text": "行", "pinyin": "xing2"},
        {"text": "银行", "pinyin": "yin2 hang2"},
        {"text": "SQL", "alias": "sequel"},
        {"text": "Nguyen", "alias": "win"},
    )
    out = apply_lexicon("银行 sql MySQL SQLite nguyen,SQL", entries)
    assert out == f"银{substitute('行', 'hang2')} sequel MySQL SQLite win,sequel"
    plan = planner.plan("Mr Nguyen uses SQL.", SynthesisOptions(pronunciations=entries))
    assert plan.texts == ["Mr win uses sequel."] and plan.sources == ["Mr Nguyen uses SQL."]


def test_ssml_phoneme_and_sub(planner):
    doc = parse_ssml(
        '<speak>他在<phoneme alphabet="pinyin" ph="hang2">行</phoneme>里，<sub alias="sequel">SQL</sub>行不行。'
        '<phoneme alphabet="ipa" ph="x">好</phoneme></speak>'
    )
    assert doc.unsupported == ("phoneme@alphabet=ipa",)
    parts = [ScriptPart(p.text, Voice("alloy", 2222), span=p.span) for p in doc.texts]
    plan = planner.plan_script(parts, SynthesisOptions())
    hang = substitute("行", "hang2")
    assert plan.texts == [f"他在{hang}里，sequel行不行。好"]  # only the phoneme's 行 is forced
    assert plan.sources == ["他在行里，sequel行不行。好"]  # written; sub shows its alias, as before
    with pytest.raises(Exception, match="one syllable per character"):
        parse_ssml('<speak><phoneme alphabet="pinyin" ph="yin2">银行</phoneme></speak>')
    with pytest.raises(Exception, match="Chinese characters"):
        parse_ssml('<speak><phoneme alphabet="pinyin" ph="a1">A</phoneme></speak>')
    # The markers are the service's own: a caller's private-use characters are not one.
    injected = parse_ssml("<speak>\ue000行\ue001hang2\ue002</speak>")
    assert "\ue000" not in injected.texts[0].text


def test_text_normalization_switch(planner):
    text = "Room 123 costs $5."

    def texts(**kw):
        return planner.plan(text, SynthesisOptions(**kw)).texts

    assert texts(text_normalization="off") == ["Room one two three costs five."]
    assert texts() == texts(text_normalization="auto") == ["Room one hundred and twenty three costs five dollars."]
    assert texts(text_normalization="on", normalize=False) == texts()  # on: always
    assert texts(normalize=False) == ["Room costs."]  # auto follows normalize: digits dropped, as before
    zh = planner.plan("第3章，共123页。", SynthesisOptions(text_normalization="off"))
    assert zh.texts == ["第三章，共一二三页。"] and zh.sources == ["第3章，共123页。"]
    assert planner.plan("第3章，共123页。", SynthesisOptions()).texts == ["第三章，共一百二十三页。"]
    # A lexicon applies whatever the switch says.
    off = SynthesisOptions(text_normalization="off", pronunciations=lexicon({"text": "SQL", "alias": "sequel"}))
    assert planner.plan("SQL 42", off).texts == ["sequel four two"]


def test_entry_bounds_and_forms():
    assert parse_pinyin("Yin2  HANG2") == ("yin2", "hang2")
    assert parse_pinyin("de0 lü4 ma") == ("de5", "lv4", "ma5")
    assert parse_pinyin("ma") == ("ma5",)  # no number: the neutral tone
    for bad in ("hang9", "ha-ng2", "", "a1 " * 65):
        with pytest.raises(PinyinError):
            parse_pinyin(bad)
    for bad in (
        {"text": "银行", "pinyin": "yin2"},  # one syllable per character
        {"text": "SQL", "pinyin": "si1"},  # pinyin is for Chinese
        {"text": "SQL"},  # a reading is needed
        {"text": "SQL", "alias": "a", "pinyin": "a1"},  # one reading only
        {"text": " SQL", "alias": "sequel"},
        {"text": "x" * 65, "alias": "y"},
        {"text": "x", "alias": "y" * 257},
    ):
        with pytest.raises(ValidationError):
            LexiconEntry(**bad)
    with pytest.raises(ValidationError):
        Pronunciations(entries=tuple(LexiconEntry(text=f"w{i}", alias="x") for i in range(5001)))
    same = LexiconEntry(text="行", pinyin="XING2"), LexiconEntry(text="行", pinyin="xing2")
    assert Pronunciations(entries=same[:1]).content_hash == Pronunciations(entries=same[1:]).content_hash


def test_api_callers_cannot_send_entries():
    from serve_app.protocol import JobRequest, SessionStart, SpeechRequest

    for model, extra in (
        (SpeechRequest, {"input": "x"}),
        (SessionStart, {"type": "session.start"}),
        (JobRequest, {"input": "x"}),
    ):
        with pytest.raises(ValidationError, match="set by the server"):
            model(**extra, pronunciations={"entries": [{"text": "a", "alias": "b"}]})
        assert model(**extra, lexicon="none", text_normalization="off").to_options().text_normalization == "off"
        with pytest.raises(ValidationError):
            model(**extra, lexicon="../etc/passwd")


def test_say_takes_the_switch():
    from chattts_serve.cli import build_parser

    assert build_parser().parse_args(["say", "hi", "-o", "x.wav"]).text_normalization == "auto"
    assert (
        build_parser().parse_args(["say", "hi", "-o", "x.wav", "--text-normalization", "off"]).text_normalization
        == "off"
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["say", "hi", "-o", "x.wav", "--text-normalization", "maybe"])
