"""The SSML subset (``engine/text/ssml.py``): pieces, their spans in the input, breaks, rates,
voices, say-as readings, what is reported as unsupported, and the safety bounds."""

from __future__ import annotations

import pickle
import time

import pytest

from serve_app.engine.errors import InvalidSSMLError, RequestTooLarge
from serve_app.engine.text import TextFrontend
from serve_app.engine.text.ssml import (
    MAX_BREAK_SECONDS,
    SsmlBreak,
    SsmlText,
    looks_like_ssml,
    parse_ssml,
)
from serve_app.errors import to_api_error


def pieces(ssml: str, **kw):
    return parse_ssml(ssml, **kw).pieces


def texts(ssml: str, **kw) -> list[str]:
    return [p.text for p in pieces(ssml, **kw) if isinstance(p, SsmlText)]


def say(kind: str, content: str, lang: str, fmt: str = "") -> str:
    attr = f' format="{fmt}"' if fmt else ""
    (text,) = texts(f'<speak><say-as interpret-as="{kind}"{attr}>{content}</say-as></speak>', lang=lang)
    return text


# --------------------------------------------------------------------------- #
# Structure and spans
# --------------------------------------------------------------------------- #


def test_pieces_in_order_with_their_spans_in_the_input():
    ssml = (
        '<speak>Hello <break time="500ms"/> world. <s>Second <prosody rate="slow">slow part</prosody> end</s></speak>'
    )
    got = pieces(ssml)
    assert [type(p) for p in got] == [SsmlText, SsmlBreak, SsmlText, SsmlText, SsmlText, SsmlText]
    assert [ssml[slice(*p.span)] for p in got] == [
        "Hello",
        '<break time="500ms"/>',
        "world.",
        "Second",
        "slow part",
        "end",
    ]
    assert [p.text for p in got if isinstance(p, SsmlText)] == ["Hello", "world.", "Second", "slow part", "end"]
    assert got[1].seconds == 0.5


def test_boundary_before_marks_sentence_and_paragraph_starts_only():
    got = pieces('<speak>One <break/>two<p>three <prosody rate="fast">four</prosody></p><s>five</s><s>six</s></speak>')
    text_pieces = [p for p in got if isinstance(p, SsmlText)]
    assert [(p.text, p.boundary_before) for p in text_pieces] == [
        ("One", True),
        ("two", False),
        ("three", True),
        ("four", False),
        ("five", True),
        ("six", True),
    ]


def test_text_after_a_closed_sentence_starts_a_new_piece():
    got = texts("<speak><s>A sentence.</s> Then more.</speak>")
    assert got == ["A sentence.", "Then more."]
    assert pieces("<speak><s>A sentence.</s> Then more.</speak>")[1].boundary_before


def test_same_voice_and_rate_across_elements_stay_one_piece():
    ssml = '<speak><prosody rate="slow">A</prosody> <prosody rate="slow">B</prosody> <emphasis>C</emphasis></speak>'
    got = pieces(ssml)
    assert [(p.text, p.rate) for p in got] == [("A B", 0.75), ("C", 1.0)]
    assert ssml[slice(*got[0].span)].startswith("A") and ssml[slice(*got[0].span)].endswith("B")


def test_spans_count_characters_not_bytes():
    ssml = "<speak>你好😀，<break/>世界 wörld</speak>"
    got = pieces(ssml)
    assert [ssml[slice(*p.span)] for p in got] == ["你好😀，", "<break/>", "世界 wörld"]


def test_spans_are_offsets_into_the_callers_input_after_blanks_bom_and_declaration():
    ssml = '\ufeff\n  <?xml version="1.0" encoding="ISO-8859-1"?>\n<speak>\n  héllo  \n</speak>'
    (p,) = pieces(ssml)
    assert p.text == "héllo" and ssml[slice(*p.span)] == "héllo"


def test_whitespace_collapses_and_entities_cdata_comments_read_as_text():
    ssml = "<speak>  Tom  &amp;\n Jerry <!-- not spoken --> <![CDATA[1 < 2]]> </speak>"
    (p,) = pieces(ssml)
    assert p.text == "Tom & Jerry 1 < 2"
    assert ssml[slice(*p.span)] == "Tom  &amp;\n Jerry <!-- not spoken --> <![CDATA[1 < 2]]>"


def test_the_ssml_namespace_and_vendor_namespaces_are_read_by_local_name():
    ssml = (
        '<speak version="1.0" xmlns="http://www.w3.org/2001/10/synthesis" '
        'xmlns:mstts="http://www.w3.org/2001/mstts" xml:lang="en-US">'
        '<voice name="nova"><mstts:express-as style="cheerful">Hi <break time="1s"/>there</mstts:express-as>'
        "</voice></speak>"
    )
    doc = parse_ssml(ssml)
    assert [(p.text, p.voice) for p in doc.texts] == [("Hi", "nova"), ("there", "nova")]
    assert doc.break_seconds == 1.0
    assert doc.unsupported == ("express-as",)


def test_empty_and_blank_documents_have_no_pieces():
    assert parse_ssml("<speak/>").pieces == ()
    assert parse_ssml("<speak> \n <p> </p> </speak>").pieces == ()


def test_looks_like_ssml():
    assert looks_like_ssml("<speak>hi</speak>")
    assert looks_like_ssml('  \n<?xml version="1.0"?>\n<speak version="1.0">')
    assert looks_like_ssml("\ufeff<speak/>")
    assert not looks_like_ssml("<speaker>hi</speaker>")
    assert not looks_like_ssml("please <speak> to me")
    assert not looks_like_ssml("hello")


# --------------------------------------------------------------------------- #
# break, prosody rate, voice
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "attrs, seconds",
    [
        ('time="500ms"', 0.5),
        ('time="1.5s"', 1.5),
        ('time=" 250 MS "', 0.25),
        ('time=".5s"', 0.5),
        ('time="10s"', 10.0),
        ('strength="x-weak"', 0.25),
        ('strength="weak"', 0.5),
        ('strength="medium"', 0.75),
        ('strength="strong"', 1.0),
        ('strength="x-strong"', 1.25),
        ("", 0.75),
        ('time="2s" strength="weak"', 2.0),  # time wins
    ],
)
def test_break_lengths(attrs, seconds):
    (b,) = [p for p in pieces(f"<speak>a<break {attrs}/>b</speak>") if isinstance(p, SsmlBreak)]
    assert b.seconds == pytest.approx(seconds)


def test_a_break_of_no_length_is_no_piece_but_still_cuts():
    got = pieces('<speak>a<break strength="none"/>b<break time="0ms"/>c</speak>')
    assert [p.text for p in got] == ["a", "b", "c"]


@pytest.mark.parametrize(
    "attrs, says",
    [
        ('time="5 parsecs"', "time '5 parsecs' is not a duration"),
        ('time="-1s"', "is not a duration"),
        ('time="11s"', f"longer than the {MAX_BREAK_SECONDS:g} s"),
        ('strength="loud"', "strength 'loud' is not one of"),
    ],
)
def test_bad_breaks_name_the_element_and_its_position(attrs, says):
    with pytest.raises(InvalidSSMLError) as err:
        parse_ssml(f"<speak>\n  Hello <break {attrs}/></speak>")
    assert str(err.value).startswith("<break> at line 2, column 9: ")
    assert says in str(err.value)
    assert (err.value.element, err.value.line, err.value.column) == ("break", 2, 9)


def test_breaks_have_a_total_limit():
    ssml = "<speak>" + '<break time="10s"/>' * 13 + "</speak>"
    with pytest.raises(RequestTooLarge, match="120 s"):
        parse_ssml(ssml)
    assert parse_ssml(ssml, max_break_total_s=130).break_seconds == 130
    assert parse_ssml("<speak>" + '<break time="10s"/>' * 12 + "</speak>").break_seconds == 120


@pytest.mark.parametrize(
    "rate, factor",
    [
        ("x-slow", 0.5),
        ("slow", 0.75),
        ("medium", 1.0),
        ("fast", 1.5),
        ("x-fast", 2.0),
        ("FAST", 1.5),
        ("80%", 0.8),
        ("150%", 1.5),
        ("+20%", 1.2),
        ("-20%", 0.8),
        ("1.5", 1.5),
        ("0.5", 0.5),
        ("1000%", 4.0),
        ("0.1", 0.25),  # clamped to the service's speed range
    ],
)
def test_prosody_rates(rate, factor):
    (p,) = pieces(f'<speak><prosody rate="{rate}">x</prosody></speak>')
    assert p.rate == pytest.approx(factor)


def test_nested_rates_multiply_within_the_range():
    got = pieces(
        '<speak><prosody rate="slow">a <prosody rate="50%">b <prosody rate="x-slow">c</prosody></prosody>'
        " d</prosody> e</speak>"
    )
    assert [(p.text, p.rate) for p in got] == [("a", 0.75), ("b", 0.375), ("c", 0.25), ("d", 0.75), ("e", 1.0)]
    (inner,) = pieces('<speak><prosody rate="4"><prosody rate="50%">x</prosody></prosody></speak>')
    assert inner.rate == 2.0  # what the outer one speaks at (4.0), halved


@pytest.mark.parametrize("rate", ["quick", "-150%", "0", "%", "1.5x"])
def test_bad_rates_are_errors(rate):
    with pytest.raises(InvalidSSMLError, match=r"^<prosody> at line 1, column 8: rate"):
        parse_ssml(f'<speak><prosody rate="{rate}">x</prosody></speak>')


def test_voices_nest_and_the_innermost_wins():
    got = pieces('<speak>a <voice name="nova">b <voice name="seed:42">c</voice> d</voice> e</speak>')
    assert [(p.text, p.voice) for p in got] == [
        ("a", None),
        ("b", "nova"),
        ("c", "seed:42"),
        ("d", "nova"),
        ("e", None),
    ]


def test_a_voice_needs_a_name_of_bounded_length():
    with pytest.raises(InvalidSSMLError, match="<voice> at line 1, column 8: needs a name"):
        parse_ssml('<speak><voice gender="female">x</voice></speak>')
    with pytest.raises(InvalidSSMLError, match="at most 1024"):
        parse_ssml(f'<speak><voice name="{"a" * 1025}">x</voice></speak>')


# --------------------------------------------------------------------------- #
# say-as and sub
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "kind, content, lang, fmt, expected",
    [
        ("cardinal", "1234", "zh", "", "一千二百三十四"),
        ("cardinal", "1,234", "en", "", "one thousand two hundred and thirty four"),
        ("number", "-3.5", "zh", "", "负三点五"),
        ("cardinal", "-3.5", "en", "", "minus three point five"),
        ("ordinal", "21", "zh", "", "第二十一"),
        ("ordinal", "21st", "en", "", "twenty first"),
        ("digits", "2024", "zh", "", "二零二四"),
        ("digits", "20 24", "en", "", "two zero two four"),
        ("characters", "IBM", "en", "", "I B M"),
        ("characters", "ab1", "zh", "", "A B 一"),
        ("spell-out", "你好", "zh", "", "你 好"),
        ("date", "2024-05-03", "zh", "ymd", "二零二四年五月三日"),
        ("date", "05/03/2024", "zh", "mdy", "二零二四年五月三日"),  # Chinese reads year, month, day
        ("date", "2024-05-03", "en", "", "May third, twenty twenty four"),
        ("date", "5/3/2024", "en", "mdy", "May third, twenty twenty four"),
        ("date", "3.5.2024", "en", "dmy", "the third of May, twenty twenty four"),
        ("date", "12/25", "en", "md", "December twenty fifth"),
        ("date", "2024-05", "en", "ym", "May twenty twenty four"),
        ("date", "1999", "en", "y", "nineteen ninety nine"),
        ("telephone", "138-1234-5678", "zh", "", "幺三八，幺二三四，五六七八"),
        ("telephone", "+1 (555) 123-4567", "en", "", "plus one, five five five, one two three, four five six seven"),
    ],
)
def test_say_as_readings(kind, content, lang, fmt, expected):
    assert say(kind, content, lang, fmt) == expected


@pytest.mark.parametrize(
    "kind, content, fmt, says",
    [
        ("cardinal", "12a", "", "'12a' is not a number"),
        ("ordinal", "first", "", "is not an ordinal"),
        ("digits", "12ab", "", "is not a run of digits"),
        ("telephone", "call me", "", "is not a telephone number"),
        ("date", "2024-13-03", "ymd", "is not a date in format 'ymd'"),
        ("date", "2024-05", "ymd", "does not have the 3 field(s)"),
        ("date", "May 3", "md", "is not a date of numbers"),
        ("characters", "...", "", "has no characters"),
    ],
)
def test_say_as_content_that_does_not_fit_is_an_error_at_the_element(kind, content, fmt, says):
    attr = f' format="{fmt}"' if fmt else ""
    with pytest.raises(InvalidSSMLError) as err:
        parse_ssml(f'<speak>\nok <say-as interpret-as="{kind}"{attr}>{content}</say-as></speak>')
    assert str(err.value).startswith("<say-as> at line 2, column 4: ") and says in str(err.value)


@pytest.mark.parametrize(
    "content, fmt",
    [
        ("1" * 5000 + "-1-2020", ""),  # a month of 5000 digits: past int()'s 4300-digit limit
        ("2020-1-" + "0" * 5000 + "1", ""),  # leading zeros count too
        ("1" * 5000, "m"),
        ("12345-05-03", "ymd"),
        ("²", "y"),  # str.isdigit says yes, int() says no
        ("5-①-2024", "dmy"),
    ],
)
def test_date_fields_are_bounded_before_int_reads_them(content, fmt):
    """Before: ValueError from int() (a 500 with a traceback); now the element's own 400. Job
    inputs are longer than a speech request's, so a field can pass int()'s limit there."""
    attr = f' format="{fmt}"' if fmt else ""
    with pytest.raises(InvalidSSMLError, match="interpret-as 'date'") as exc:
        parse_ssml(f'<speak><say-as interpret-as="date"{attr}>{content}</say-as></speak>', max_chars=20_000)
    err = to_api_error(exc.value)
    assert (err.status, err.code, err.param) == (400, "invalid_ssml", "input")


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("kind", ["characters", "cardinal", "ordinal", "digits", "date", "telephone"])
def test_every_say_as_reading_of_digit_floods_is_words_or_a_400(kind, lang):
    """Runs past int()'s limit and digits int() does not read (superscripts, circled, other
    scripts' decimals), alone and with separators: a reading, or InvalidSSMLError; nothing else."""
    for unit in ("7", "0", "1-", "1/", "1.", "1 ", "1,", "²", "①", "٣", "１", "7²"):
        content = (unit * (5000 // len(unit) + 1))[:5000]
        for fmt in [""] + (["y", "m", "d", "ymd", "md"] if kind == "date" else []):
            attr = f' format="{fmt}"' if fmt else ""
            ssml = f'<speak xml:lang="{lang}"><say-as interpret-as="{kind}"{attr}>{content}</say-as></speak>'
            try:
                parse_ssml(ssml, max_chars=20_000)
            except InvalidSSMLError:
                pass


def test_a_bad_date_format_and_a_missing_interpretation_are_errors():
    with pytest.raises(InvalidSSMLError, match="format 'yyyy' is not a date format"):
        parse_ssml('<speak><say-as interpret-as="date" format="yyyy">2024</say-as></speak>')
    with pytest.raises(InvalidSSMLError, match="needs an interpret-as"):
        parse_ssml("<speak><say-as>12</say-as></speak>")


def test_say_as_language_comes_from_xml_lang_then_the_text_around_it():
    zh_doc = '<speak xml:lang="zh-CN">Call <say-as interpret-as="cardinal">12</say-as></speak>'
    assert texts(zh_doc) == ["Call 十二"]
    assert texts(
        '<speak xml:lang="zh-CN"><s xml:lang="en-US"><say-as interpret-as="cardinal">12</say-as></s></speak>'
    ) == ["twelve"]
    assert texts('<speak>今天有<say-as interpret-as="cardinal">12</say-as>个人</speak>') == ["今天有十二个人"]
    assert texts('<speak>There are <say-as interpret-as="cardinal">12</say-as> people</speak>') == [
        "There are twelve people"
    ]
    # Nothing but the number: the request's language, else English (the front end's default).
    assert texts('<speak><say-as interpret-as="cardinal">12</say-as></speak>', lang="zh") == ["十二"]
    assert texts('<speak><say-as interpret-as="cardinal">12</say-as></speak>') == ["twelve"]


def test_say_as_words_never_glue_onto_latin_letters():
    assert texts('<speak>Hi<say-as interpret-as="cardinal">12</say-as>there</speak>') == ["Hi twelve there"]
    assert texts('<speak>room<say-as interpret-as="characters">b</say-as>, ok</speak>') == ["room B, ok"]


def test_say_as_output_survives_the_front_end():
    """What say-as produces is read by the front end as written (no digits left to re-read)."""
    frontend = TextFrontend()
    for ssml in (
        '<speak xml:lang="zh">请拨打<say-as interpret-as="telephone">110</say-as>，'
        '日期<say-as interpret-as="date">2024-05-03</say-as>。</speak>',
        '<speak>Call <say-as interpret-as="telephone">555-1234</say-as> on '
        '<say-as interpret-as="date" format="dmy">3/5/2024</say-as>.</speak>',
    ):
        (text,) = texts(ssml)
        assert "".join(s.text for s in frontend.process(text)).replace(" ", "") == text.replace(" ", "")


def test_sub_speaks_its_alias_and_spans_the_element():
    ssml = '<speak>The <sub alias="World Wide Web Consortium">W3C</sub> says</speak>'
    (p,) = pieces(ssml)
    assert p.text == "The World Wide Web Consortium says"
    assert ssml[slice(*p.span)] == 'The <sub alias="World Wide Web Consortium">W3C</sub> says'
    (only,) = pieces('<speak><sub alias="hi"/></speak>')
    assert only.text == "hi" and only.span == (7, 24)
    with pytest.raises(InvalidSSMLError, match="<sub> at line 1, column 8: needs an alias"):
        parse_ssml("<speak><sub>x</sub></speak>")


# --------------------------------------------------------------------------- #
# What is not supported
# --------------------------------------------------------------------------- #


def test_unsupported_elements_speak_their_text_and_are_reported_once_in_order():
    doc = parse_ssml(
        '<speak><emphasis level="strong">big</emphasis> <phoneme alphabet="ipa" ph="x">tomato</phoneme>'
        ' <mark name="m"/><emphasis>again</emphasis> <lang xml:lang="fr">oui</lang>'
        ' <audio src="x.wav">a bell<desc>a bell ringing</desc></audio>'
        ' <say-as interpret-as="time">10:30</say-as> <prosody pitch="high" rate="fast">up</prosody>'
        ' <voice name="x" gender="male">v</voice></speak>'
    )
    assert [p.text for p in doc.texts] == ["big tomato again oui a bell 10:30", "up", "v"]
    assert doc.unsupported == (
        "emphasis",
        "phoneme@alphabet=ipa",  # pinyin is read (tests/unit/test_lexicon_text.py); other alphabets as written
        "mark",
        "lang",
        "audio",
        "desc",
        "say-as:time",
        "prosody@pitch",
        "voice@gender",
    )


def test_metadata_is_not_spoken():
    doc = parse_ssml("<speak><meta name='a' content='b'/><metadata><x>secret</x></metadata>Hello</speak>")
    assert [p.text for p in doc.texts] == ["Hello"] and doc.unsupported == ("meta", "metadata")


@pytest.mark.parametrize(
    "ssml, says",
    [
        ("<p>Hello</p>", "<p> at line 1, column 1: the root element must be <speak>"),
        ("<speak><speak>x</speak></speak>", "<speak> at line 1, column 8: <speak> may only be the root"),
        (
            '<speak><say-as interpret-as="digits">1<emphasis>2</emphasis></say-as></speak>',
            "<emphasis> at line 1, column 39: <say-as> may only contain text",
        ),
        ("<speak><break>text</break></speak>", "<break> at line 1, column 8: may not contain text"),
    ],
)
def test_structures_outside_the_subset_are_errors(ssml, says):
    with pytest.raises(InvalidSSMLError) as err:
        parse_ssml(ssml)
    assert str(err.value).startswith(says)


# --------------------------------------------------------------------------- #
# Malformed XML and safety
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "ssml, line, column, reason",
    [
        ("<speak>\n  <p>x</b></speak>", 2, 7, "mismatched tag"),  # at the end tag's "<"
        ("<speak>你好<b></speak>", 1, 13, "mismatched tag"),  # columns in characters, not bytes
        ("<speak>x", 1, 9, "no element found"),
        ("<speak>x</speak>trailing", 1, 17, "junk after document element"),
        ("<speak>&nbsp;</speak>", 1, 8, "undefined entity"),
        ('<speak><b a="1" a="2"/></speak>', 1, 17, "duplicate attribute"),
        ("<speak><x:y>a</x:y></speak>", 1, 8, "unbound prefix"),
    ],
)
def test_malformed_xml_names_line_and_column(ssml, line, column, reason):
    with pytest.raises(InvalidSSMLError) as err:
        parse_ssml(ssml)
    assert str(err.value) == f"line {line}, column {column}: not well-formed SSML: {reason}"
    assert (err.value.line, err.value.column) == (line, column)


@pytest.mark.parametrize(
    "ssml",
    [
        '<!DOCTYPE speak [<!ENTITY a "b">]><speak>&a;</speak>',
        '<!DOCTYPE speak SYSTEM "http://example.com/x.dtd"><speak>x</speak>',
        '<!DOCTYPE speak [<!ENTITY ext SYSTEM "file:///etc/passwd">]><speak>&ext;</speak>',
        '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>'
        "<speak>&lol2;</speak>",
    ],
)
def test_dtds_and_entities_are_refused(ssml):
    with pytest.raises(InvalidSSMLError, match="DTDs and entity declarations are not allowed") as err:
        parse_ssml(ssml)
    assert err.value.column == 1 and err.value.line in (1, 2)


def test_input_size_is_checked_before_parsing():
    with pytest.raises(RequestTooLarge, match="SSML input is 4097 characters; the limit is 4096"):
        parse_ssml("<" + "x" * 4096, max_chars=4096)  # not XML at all: refused on its length alone
    assert parse_ssml("<speak>" + "a" * 4000 + "</speak>", max_chars=4096).texts[0].text == "a" * 4000


def test_depth_is_bounded_while_parsing_without_recursion():
    ok = "<speak>" + "<p>" * 31 + "x" + "</p>" * 31 + "</speak>"
    assert [p.text for p in pieces(ok)] == ["x"]
    too_deep = "<speak>" + "<p>" * 32 + "x" + "</p>" * 32 + "</speak>"
    with pytest.raises(InvalidSSMLError, match=r"^<p> at line 1, column 101: elements nest deeper than 32"):
        parse_ssml(too_deep)
    # Far past Python's recursion limit: the same error, found at the 33rd level.
    flood = "<speak>" + "<emphasis>" * 20000 + "</emphasis>" * 20000 + "</speak>"
    with pytest.raises(InvalidSSMLError, match="deeper than 32"):
        parse_ssml(flood, max_chars=len(flood))
    assert len(pieces("<speak><p><p>x</p></p></speak>", max_depth=3)) == 1
    with pytest.raises(InvalidSSMLError):
        parse_ssml("<speak><p><p>x</p></p></speak>", max_depth=2)


def test_a_full_size_input_parses_quickly():
    ssml = "<speak>" + '<s>Hello <emphasis>big</emphasis> &amp; <break time="1ms"/>world.</s>' * 230 + "</speak>"
    assert len(ssml) < 16_384
    start = time.perf_counter()
    doc = parse_ssml(ssml)
    assert time.perf_counter() - start < 1.0
    assert len(doc.texts) == 460 and len(doc.pieces) == 690


# --------------------------------------------------------------------------- #
# The error as the API reports it
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("wrapped", [False, True], ids=["raw", "ray-wrapped"])
def test_invalid_ssml_is_a_400_on_input(wrapped):
    from ray.exceptions import RayTaskError

    try:
        parse_ssml('<speak>Hello <break time="5 parsecs"/></speak>')
    except InvalidSSMLError as exc:
        raised = RayTaskError("plan", "Traceback ...", exc) if wrapped else exc
    err = to_api_error(raised)
    assert (err.status, err.code, err.param, err.type) == (400, "invalid_ssml", "input", "invalid_request_error")
    assert err.message == "<break> at line 1, column 14: time '5 parsecs' is not a duration (e.g. 500ms, 1.5s)"


def test_the_error_pickles_with_its_fields():
    err = pickle.loads(pickle.dumps(InvalidSSMLError("<p> at line 2, column 3: x", "p", 2, 3)))
    assert (str(err), err.element, err.line, err.column) == ("<p> at line 2, column 3: x", "p", 2, 3)


def test_element_spans_end_where_the_element_ends():
    ssml = (
        '<speak><break time="1s"/></speak>|<speak><sub alias="a>b">x/></sub>y</speak>|'
        '<speak><break time="1s"></break>z</speak>'
    )
    first, second, third = ssml.split("|")
    assert [first[slice(*p.span)] for p in pieces(first)] == ['<break time="1s"/>']
    (sub,) = pieces(second)
    assert sub.text == "a>b y" and second[slice(*sub.span)] == '<sub alias="a>b">x/></sub>y'
    assert [third[slice(*p.span)] for p in pieces(third)] == ['<break time="1s"></break>', "z"]


def test_the_language_argument_is_checked():
    with pytest.raises(ValueError, match="lang must be"):
        parse_ssml("<speak>x</speak>", lang="fr")
    with pytest.raises(TypeError):
        parse_ssml(b"<speak>x</speak>")
