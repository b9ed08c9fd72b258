"""OpenAI ``instructions`` -> ChatTTS controls (``engine/styles.py``, ``text/data/styles.json``)."""

from __future__ import annotations

import time
from urllib.parse import unquote

import pytest

from serve_app.engine.pacing import speed_tag_level
from serve_app.engine.styles import (
    MAX_INSTRUCTIONS_CHARS,
    MAX_REPORTED,
    PRESETS,
    StyleControls,
    StyleResult,
    header_value,
    resolve_instructions,
)
from serve_app.engine.text import data
from serve_app.engine.types import SynthesisOptions


def controls(text: str):
    r = resolve_instructions(text)
    return r.oral, r.laugh, r.break_level, r.speed


# --------------------------------------------------------------------------- #
# Words and presets, English and Chinese
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    "text, applied, speed",
    [
        ("Speak slowly", ("slow",), 0.8),
        ("slow down a little", ("slow",), 0.8),
        ("慢一点", ("slow",), 0.8),
        ("说话慢慢的", ("slow",), 0.8),
        ("Talk quickly", ("fast",), 1.25),
        ("快点说", ("fast",), 1.25),
        ("normal speed please", ("normal_speed",), 1.0),
        ("不快不慢", ("normal_speed",), 1.0),  # one phrase, not "not fast, not slow"
    ],
)
def test_speed_words(text, applied, speed):
    r = resolve_instructions(text)
    assert r.applied == applied and r.speed == pytest.approx(speed)
    assert r.prompt == "" and r.ignored == ()


@pytest.mark.parametrize(
    "text, key, oral, laugh, brk",
    [
        ("Speak in a cheerful tone", "cheerful", 3, 1, None),
        ("开心一点", "cheerful", 3, 1, None),
        ("快乐地说", "cheerful", 3, 1, None),  # 快乐 is happy, not 快 (fast)
        ("laughing", "laugh", None, 2, None),
        ("笑着说", "laugh", None, 2, None),
        ("casual and conversational", None, 6, 1, 3),
        ("口语化一点", "casual", 6, None, None),
        ("formal", "formal", 0, 0, None),
        ("正式", "formal", 0, 0, None),
        ("with dramatic pauses", "pause", None, None, 7),
        ("多停顿", "pause", None, None, 7),
    ],
)
def test_style_words(text, key, oral, laugh, brk):
    r = resolve_instructions(text)
    assert (r.oral, r.laugh, r.break_level) == (oral, laugh, brk)
    if key:
        assert r.applied == (key,)


@pytest.mark.parametrize("name", ["narrator", "conversational", "news", "storyteller", "calm", "energetic"])
def test_each_preset_by_its_name_sets_all_its_controls(name):
    r = resolve_instructions(name)
    preset = PRESETS[name]
    assert r.applied == (name,)
    assert (r.oral, r.laugh, r.break_level, r.speed) == (preset.oral, preset.laugh, preset.break_level, preset.speed)
    assert r.prompt == f"[oral_{preset.oral}][laugh_{preset.laugh}][break_{preset.break_level}]"


@pytest.mark.parametrize(
    "text, name",
    [
        ("旁白", "narrator"),
        ("对话", "conversational"),
        ("新闻", "news"),
        ("讲故事", "storyteller"),
        ("像新闻主播一样播报", "news"),
        ("Read it like a news anchor", "news"),
        ("像讲故事一样", "storyteller"),
        ("平静", "calm"),
        ("充满活力", "energetic"),
        ("an excited voice", "energetic"),
    ],
)
def test_preset_phrases(text, name):
    assert resolve_instructions(text).applied == (name,)


def test_the_briefs_examples():
    r = resolve_instructions("Speak in a cheerful and positive tone")
    assert r.prompt == "[oral_3][laugh_1]" and r.speed is None and r.ignored == ()
    r = resolve_instructions("慢一点，像讲故事一样")
    story = PRESETS["storyteller"]
    assert r.applied == ("storyteller", "slow")
    assert r.prompt == f"[oral_{story.oral}][laugh_{story.laugh}][break_{story.break_level}]"
    assert r.speed == 0.8  # the word "slow" wins over the preset's speed


# --------------------------------------------------------------------------- #
# Conflicts, intensity, negation
# --------------------------------------------------------------------------- #


def test_presets_first_then_words_whatever_the_order():
    assert controls("faster, like a calm narrator")[3] == 1.25
    assert controls("like a calm narrator, faster")[3] == 1.25
    assert resolve_instructions("faster, like a calm narrator").applied == ("calm", "narrator", "fast")


def test_the_last_mention_of_a_control_wins():
    assert controls("slowly... no, actually quickly")[3] == 1.25
    assert controls("quickly, then slowly")[3] == 0.8
    assert controls("narrator, news")[:3] == controls("news")[:3]
    assert controls("news, narrator")[:3] == controls("narrator")[:3]
    # Each word sets only its own controls: laugh from one, oral from the other.
    assert controls("formal, but laughing") == (0, 2, None, None)
    assert controls("laughing, but formal") == (0, 0, None, None)


def test_intensity_scales_away_from_neutral():
    neutral = data.load("styles.json")["neutral"]
    assert controls("very slow")[3] == pytest.approx(0.8**1.5)
    assert controls("a bit slower")[3] == pytest.approx(0.8**0.5)
    assert controls("稍微快一点")[3] == pytest.approx(1.25**0.5)
    assert controls("非常慢")[3] == pytest.approx(0.8**1.5)
    # casual is oral 6 against a neutral oral: "very" goes 1.5x as far, "slightly" half as far.
    assert controls("very casual")[0] == min(9, int(neutral["oral"] + (6 - neutral["oral"]) * 1.5 + 0.5))
    assert controls("slightly casual")[0] == int(neutral["oral"] + (6 - neutral["oral"]) * 0.5 + 0.5)
    assert controls("extremely laughing")[1] == 2  # within [laugh_0-2]
    assert resolve_instructions("very slow").applied == ("very slow",)
    assert resolve_instructions("a bit slower").applied == ("slightly slow",)


def test_a_modifier_reaches_only_the_next_style_of_its_clause():
    assert controls("very slow and cheerful") == (3, 1, None, pytest.approx(0.8**1.5))
    assert controls("very, slow")[3] == 0.8  # the comma ends the clause "very"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("don't laugh", (None, 0, None, None)),
        ("do not laugh", (None, 0, None, None)),
        ("别笑", (None, 0, None, None)),
        ("no pauses", (None, None, 0, None)),
        ("没有停顿", (None, None, 0, None)),
        ("不要太快", (None, None, None, 0.9)),  # "not too fast": a little slower, at plain intensity
        ("not too slow", (None, None, None, 1.1)),
        ("Don't be too formal", (5, None, None, None)),
        ("少一点停顿", (None, None, 0, None)),
    ],
)
def test_negations(text, expected):
    assert controls(text) == expected
    assert resolve_instructions(text).applied[0].startswith("not ")


def test_a_negation_without_a_meaning_is_ignored_and_one_of_nothing_is_silent():
    r = resolve_instructions("not like a narrator")
    assert r.applied == () and r.ignored == ("not narrator",) and r.prompt == ""
    r = resolve_instructions("don't whisper, speak slowly")
    assert r.applied == ("slow",) and r.ignored == ()


def test_a_negation_stops_at_its_clause():
    assert controls("no, laugh")[1] == 2


def test_speed_factors_as_numbers():
    assert controls("1.5x speed")[3] == 1.5
    assert controls("0.8 x")[3] == 0.8
    assert controls("2倍速")[3] == 2.0
    r = resolve_instructions("10x speed")
    assert r.speed is None and r.ignored == ("speed 10x",)
    assert controls("slowly, 1.2x")[3] == 1.2  # the last mention


# --------------------------------------------------------------------------- #
# What is not understood
# --------------------------------------------------------------------------- #


def test_what_chattts_cannot_do_is_ignored_under_its_key():
    r = resolve_instructions("Whisper. Use a British accent. Sound sad. Speak loudly with a deep voice.")
    assert r.applied == () and r.prompt == "" and r.speed is None
    assert r.ignored == ("whisper", "accent", "emotion", "volume", "pitch")


def test_clauses_with_nothing_known_are_reported_as_written():
    r = resolve_instructions("Slowly. Pretend you are a pirate captain on the high seas!")
    assert r.applied == ("slow",)
    assert r.ignored == ("pretend you are a pirate captain on the…",)
    assert len(r.ignored[0]) == 40
    r = resolve_instructions("用四川话说，快一点")
    assert r.applied == ("fast",) and r.ignored == ("用四川话说",)


def test_carrier_words_alone_are_not_reported():
    r = resolve_instructions("Voice: warm. Tone: calm. Pacing: slow. Please.")
    assert r.applied == ("calm", "cheerful", "slow") and r.ignored == ()


def test_ignored_is_bounded():
    r = resolve_instructions(". ".join(f"unknown thing number{i}" for i in range(30)))
    assert len(r.ignored) == MAX_REPORTED and r.applied == ()


def test_empty_and_none():
    assert resolve_instructions(None) == StyleResult() == resolve_instructions("")
    assert resolve_instructions("   ") == StyleResult()


def test_full_width_and_case_are_normalised():
    assert resolve_instructions("ＳＬＯＷＬＹ").applied == ("slow",)
    assert resolve_instructions("CHEERFUL").applied == ("cheerful",)


# --------------------------------------------------------------------------- #
# Bounds
# --------------------------------------------------------------------------- #


def test_length_is_bounded_and_the_work_linear():
    with pytest.raises(ValueError, match=f"at most {MAX_INSTRUCTIONS_CHARS}"):
        resolve_instructions("a" * (MAX_INSTRUCTIONS_CHARS + 1))
    worst = ["very " * 819, "不要非常" * 1024, "slow down " * 409, "a" * 4096, "慢" * 4096]
    for text in worst:
        text = text[:MAX_INSTRUCTIONS_CHARS]
        start = time.perf_counter()
        resolve_instructions(text)
        assert time.perf_counter() - start < 0.25, text[:20]


# --------------------------------------------------------------------------- #
# What the service does with a result
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize("text", ["narrator", "very casual, laughing, no pauses", "旁白，开心", "formal"])
def test_prompts_pass_the_services_prompt_validator(text):
    r = resolve_instructions(text)
    assert r.prompt
    assert SynthesisOptions(prompt=r.prompt).prompt == r.prompt
    assert SynthesisOptions(prompt=r.merged_prompt("[oral_2]")).prompt.startswith("[oral_2]")


def test_merged_prompt_keeps_the_callers_own_tags():
    r = resolve_instructions("conversational")
    assert r.merged_prompt("") == r.prompt
    merged = r.merged_prompt("[oral_0][uv_break]")
    assert merged == f"[oral_0][uv_break][laugh_{r.laugh}][break_{r.break_level}]"


def test_apply_speed_multiplies_within_the_range():
    r = resolve_instructions("very slow")
    assert r.apply_speed(1.0) == pytest.approx(0.8**1.5)
    assert r.apply_speed(0.25) == 0.25
    assert resolve_instructions("2x").apply_speed(3.0) == 4.0
    assert resolve_instructions("cheerful").apply_speed(1.3) == 1.3
    # A speed word moves the ChatTTS speed tag (two levels per doubling).
    assert speed_tag_level(resolve_instructions("very slow").apply_speed(1.0)) < speed_tag_level(1.0)
    assert speed_tag_level(resolve_instructions("fast").apply_speed(1.0)) > speed_tag_level(1.0)


def test_header_value_is_ascii_and_reads_back():
    items = ["whisper", "用四川话说", "50%, please", "naïve"]
    value = header_value(items)
    assert value.isascii() and value.isprintable()
    assert [unquote(v) for v in value.split(", ")] == items
    assert header_value(["a" * 10, "b" * 10, "c" * 10], max_chars=24) == "a" * 10 + ", " + "b" * 10
    assert header_value([]) == ""


# --------------------------------------------------------------------------- #
# The table itself
# --------------------------------------------------------------------------- #


def test_the_table_is_valid():
    table = data.load("styles.json")
    assert set(PRESETS) >= {"narrator", "conversational", "news", "storyteller", "calm", "energetic"}
    for name, preset in PRESETS.items():
        assert isinstance(preset, StyleControls)
        assert None not in (preset.oral, preset.laugh, preset.break_level, preset.speed), name
    seen: set = set()
    for section in ("presets", "words"):
        for key, row in table[section].items():
            assert key.isascii()
            for phrase in row["phrases"]:
                assert phrase.casefold() not in seen, phrase
                seen.add(phrase.casefold())
                # Every phrase, alone, resolves to its own key (nothing longer shadows it).
                assert resolve_instructions(phrase).applied == (key,), phrase
    for key, phrases in table["unsupported"].items():
        for phrase in phrases:
            assert resolve_instructions(phrase).ignored == (key,), phrase
    for phrase in table["carriers"]:
        assert resolve_instructions(phrase) == StyleResult(), phrase


def test_presets_are_read_only_and_instructions_must_be_text():
    with pytest.raises(TypeError):
        PRESETS["narrator"] = StyleControls()  # type: ignore[index]
    with pytest.raises(TypeError):
        resolve_instructions(["slow"])  # type: ignore[arg-type]
