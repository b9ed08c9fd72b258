"""A request's cost after normalisation (serve_app/engine/planner.py): at most
``SegmentConfig.max_segments`` segments, ``max_silence_seconds`` of silence (the whole script's
breaks and pauses) and ``max_request_seconds`` of expected audio (speech and silence), else
``RequestTooLarge`` (413 request_too_large) naming the limit and the figure, counted as the plan
is made (planning stops at the first limit crossed); a lexicon's aliases add at most
``max_lexicon_growth_chars`` to the text, bounded as it grows (413 input_too_long); legitimate
inputs of ``ingress.max_input_chars`` (4096) at speed 1 pass. And who asked: the client on every
segment."""

from __future__ import annotations

import pytest
from support.configs import REPO

from serve_app.engine.config import DEFAULT_MAX_INPUT_CHARS, SegmentConfig
from serve_app.engine.errors import ClientQueueFull, InputTooLong, RefineBusy, RequestTooLarge
from serve_app.engine.pacing import TOKENS_PER_SECOND
from serve_app.engine.planner import Planner, plan_seconds, plan_silence
from serve_app.engine.text import TextFrontend
from serve_app.engine.text.lexicon import LexiconEntry, Pronunciations
from serve_app.engine.types import ScriptPart, SynthesisOptions, Voice
from serve_app.errors import as_api_error, to_api_error
from serve_app.settings import IngressConfig

N = 4096  # ingress.max_input_chars


def flood(unit: str, n: int = N) -> str:
    return (unit * (n // len(unit) + 1))[:n]


CORPUS = (REPO / "bench" / "text_corpus.txt").read_text()
PROSE = {
    "Chinese prose": flood("我们的系统会把长文本切成几个片段，分别生成语音。"),
    "Chinese characters only": flood("我"),
    "short Chinese sentences": flood("我们的系统会把长文。"),  # each sentence its own segment
    "English prose": flood("A good speech service has to answer quickly, stay up under heavy load. "),
    "the bench corpus": CORPUS[:N],
    "dates and times": flood("On 2024-03-05 at 10:30, "),
    "money": flood("It costs $3.50 or €12.99. "),
}


@pytest.fixture(scope="module")
def planner() -> Planner:
    p = Planner()
    p.warmup()
    return p


def seconds(plan) -> float:
    return sum(s.target_tokens for s in plan.segments) / TOKENS_PER_SECOND


@pytest.mark.parametrize("name", list(PROSE))
def test_legitimate_inputs_of_max_input_chars_pass_at_speed_1(planner: Planner, name: str) -> None:
    plan = planner.plan(PROSE[name], SynthesisOptions())
    limits = planner.limits
    assert len(plan.segments) <= limits.max_segments
    assert seconds(plan) <= limits.max_request_seconds


def test_speed_quarter_on_long_input_is_413_naming_the_limit_and_the_figure(planner: Planner) -> None:
    text = PROSE["Chinese prose"]
    seconds_at_1 = seconds(planner.plan(text, SynthesisOptions()))
    assert 4 * seconds_at_1 > 1800  # a quarter of the speed: 4x the speech, past the limit
    with pytest.raises(RequestTooLarge, match=r"more than \d+ s of audio at speed 0.25; the limit is 1800 s") as err:
        planner.plan(text, SynthesisOptions(speed=0.25))
    # Counted as the plan is made: the figure is where it stopped, one segment past the limit.
    figure = float(str(err.value).split("more than ")[1].split(" s")[0])
    assert 1800 < figure < 1800 + 4 * planner.limits.max_seconds + 1
    api = to_api_error(err.value)
    assert (api.status, api.code, api.param, api.type) == (413, "request_too_large", "input", "invalid_request_error")
    # Half the speed still fits.
    assert len(planner.plan(text, SynthesisOptions(speed=0.5)).segments) > 0


def test_too_many_segments_is_413_naming_the_limit_and_the_figure() -> None:
    planner = Planner(SegmentConfig(max_segments=10))
    text = "第一句话。" * 40 + "最后。"
    with pytest.raises(
        RequestTooLarge,
        match=r"input makes more than 10 segments after normalisation; the limit is 10 "
        r"\(segments.max_segments\)",
    ):
        planner.plan(text, SynthesisOptions())
    short = Planner(SegmentConfig(max_segments=10)).plan("第一句话。", SynthesisOptions())
    assert len(short.segments) == 1


def test_plan_texts_is_capped_too(planner: Planner) -> None:
    """replan (after refine_text) goes through the same caps."""
    capped = Planner(SegmentConfig(max_segments=3))
    with pytest.raises(RequestTooLarge, match="more than 3 segments"):
        capped.plan_texts(["一。", "二。", "三。", "四。"], SynthesisOptions())


@pytest.mark.parametrize(
    "unit",
    ["7", "77,777,777 ", "777%", "$7 ", "7/8 ", "a[laugh]", "我[break_6]", "我[uv_break]", "[laugh][laugh]a", "77th "],
)
@pytest.mark.parametrize("speed", [1.0, 0.25])
def test_every_plan_is_within_the_caps_or_refused(planner: Planner, unit: str, speed: float) -> None:
    """Floods of number readings and tags, at the slowest speed: a plan is within both caps, or
    the request is refused before any decoding."""
    try:
        plan = planner.plan(flood(unit), SynthesisOptions(speed=speed))
    except RequestTooLarge:
        return
    assert len(plan.segments) <= planner.limits.max_segments
    assert seconds(plan) <= planner.limits.max_request_seconds


class CountingFrontend(TextFrontend):
    """The real text front end, counting the characters it was asked to normalise."""

    def __init__(self) -> None:
        super().__init__()
        self.chars = 0

    def normalize(self, text: str, *args, **kwargs) -> str:
        self.chars += len(text)
        return super().normalize(text, *args, **kwargs)


def counting(limits: SegmentConfig = SegmentConfig()) -> tuple[Planner, CountingFrontend]:
    frontend = CountingFrontend()
    return Planner(limits, frontend), frontend


def test_planning_stops_at_the_first_limit_crossed() -> None:
    """Past ``max_segments`` or ``max_request_seconds`` the rest of the text is never normalised
    (before, every piece was, and the plan checked after: a 413 that cost the whole input)."""
    text = PROSE["Chinese prose"]
    whole, frontend = counting()
    whole.plan(text, SynthesisOptions())
    everything = frontend.chars
    for limits, speed in ((SegmentConfig(max_segments=20), 1.0), (SegmentConfig(), 0.25)):
        capped, frontend = counting(limits)
        with pytest.raises(RequestTooLarge):
            capped.plan(text, SynthesisOptions(speed=speed))
        assert frontend.chars < 0.6 * everything, (limits, speed, frontend.chars, everything)


ALIAS = " ".join(["123456789012"] * 10)[:128]  # a 12-digit number read out is ~10x its digits


def aliased(text: str = "的") -> SynthesisOptions:
    return SynthesisOptions(pronunciations=Pronunciations(entries=(LexiconEntry(text=text, alias=ALIAS),)))


def test_a_lexicon_that_multiplies_the_text_is_refused_before_it_is_normalised() -> None:
    """One character aliased to 128 characters of 12-digit numbers, then a request of that
    character: 4,096 of them were ~20 s of normalising before the plan's 413. The aliases add at
    most ``max_lexicon_growth_chars`` (ingress.max_input_chars' default), counted as the text
    grows: 413 input_too_long before the first piece is normalised."""
    planner, frontend = counting()
    with pytest.raises(RequestTooLarge) as refused:
        planner.plan("的" * 200, aliased())
    assert frontend.chars == 0, f"{frontend.chars} characters normalised before the 413"
    assert isinstance(refused.value, InputTooLong), refused.value
    assert "more than 4096 characters longer" in str(refused.value) and "max_lexicon_growth_chars" in str(refused.value)
    assert SegmentConfig().max_lexicon_growth_chars == IngressConfig().max_input_chars == DEFAULT_MAX_INPUT_CHARS
    err = to_api_error(InputTooLong("x"))
    assert (err.status, err.code, err.param) == (413, "input_too_long", "input")
    # Within the budget the lexicon applies: 30 aliases add 30 * 127 characters.
    within, frontend = counting(SegmentConfig(max_segments=10_000, max_request_seconds=100_000))
    within.plan("的。" * 30, aliased())
    assert frontend.chars >= 30 * 128


def test_the_lexicon_budget_is_the_whole_scripts() -> None:
    """SSML pieces and dialogue turns share one budget: 40 turns of 10 aliased characters each
    (1,270 added per turn) pass one by one, not together."""
    voice = Voice(name="alloy", seed=2)
    one = [ScriptPart("的" * 10, voice)]
    planner, _ = counting(SegmentConfig(max_segments=10_000, max_request_seconds=100_000))
    planner.plan_script(one, aliased())
    with pytest.raises(InputTooLong):
        planner.plan_script(one * 40, aliased())


def _breaks_script(turns: int, breaks: int, seconds: float) -> list[ScriptPart]:
    """A dialogue's parts as the Ingress makes them: every turn ``breaks`` SSML breaks of
    ``seconds``, each before a one-character piece (a turn's SSML parsed on its own)."""
    voice = Voice(name="alloy", seed=2)
    return [
        ScriptPart("嗯", voice, pause_before=seconds, speaker="alloy", turn=t)
        for t in range(turns)
        for _ in range(breaks)
    ]


def test_silence_is_counted_for_the_whole_script_not_per_turn(planner: Planner) -> None:
    """13 turns of twelve 10 s breaks (each turn within SSML's own 120 s) were 1,560 s of
    silence with a 200: the script's silence is one budget, whatever the turns."""
    parts = _breaks_script(13, 12, 10.0)
    with pytest.raises(
        RequestTooLarge, match=r"1560 s of silence .* the limit is 480 s \(segments.max_silence_seconds\)"
    ):
        planner.plan_script(parts, SynthesisOptions())
    ok = planner.plan_script(_breaks_script(4, 12, 10.0), SynthesisOptions())  # 480 s: at the limit
    assert plan_silence(ok) == pytest.approx(480.0)
    assert plan_seconds(ok) == pytest.approx(480.0 + seconds(ok))


def test_speech_and_silence_share_the_request_seconds() -> None:
    """Silence is audio: its bytes and vocoder work count against ``max_request_seconds``."""
    limits = SegmentConfig(max_request_seconds=100.0, max_silence_seconds=480.0)
    planner = Planner(limits)
    with pytest.raises(RequestTooLarge, match=r"s of audio .* the limit is 100 s"):
        planner.plan_script(_breaks_script(1, 11, 10.0), SynthesisOptions())  # 110 s of silence, under its own cap
    assert plan_seconds(planner.plan_script(_breaks_script(1, 9, 10.0), SynthesisOptions())) < 100.0


def test_the_client_is_stamped_on_every_segment(planner: Planner) -> None:
    text = "你好，欢迎使用语音合成服务。今天天气很好，我们一起去公园散步吧。"
    plan = planner.plan(text, SynthesisOptions(), client="ip:10.0.0.7")
    assert len(plan.segments) >= 2 and {s.client for s in plan.segments} == {"ip:10.0.0.7"}
    assert {s.client for s in planner.plan(text, SynthesisOptions()).segments} == {""}  # anonymous
    replanned = planner.plan_texts(plan.texts, SynthesisOptions(), client="key:abc")
    assert {s.client for s in replanned.segments} == {"key:abc"}


@pytest.mark.parametrize(
    "exc, status, code",
    [
        (RequestTooLarge("input makes 600 segments after normalisation; the limit is 512"), 413, "request_too_large"),
        (ClientQueueFull("too many rows queued for client ip:1.2.3.4"), 429, "too_many_queued_rows"),
        (RefineBusy("refine_text could not start within 30 s"), 503, "refine_busy"),
    ],
)
@pytest.mark.parametrize("wrapped", [False, True], ids=["raw", "ray-wrapped"])
def test_the_new_errors_keep_their_status_through_ray(exc, status, code, wrapped):
    from ray.exceptions import RayTaskError

    raised = RayTaskError("plan", "Traceback ...", exc) if wrapped else exc
    err = as_api_error(raised, "x failed", "x_failed")
    assert (err.status, err.code, err.message) == (status, code, str(exc))
