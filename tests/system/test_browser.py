"""The web page in a real browser: Debian's Chromium driven by Playwright against the session's
Serve app (tiny random weights) with API keys turned on (live, through the Ingress's
``user_config``, and off again after this module).

Playwright's own browser download cannot work here, so the system's ``/usr/bin/chromium`` is
launched (``apt-get install chromium``); the tests skip without it. Marked ``browser``: deselect
with ``-m 'not browser'``. Ordering claims (audio plays before the response has ended) are
proved with the page's own ``performance.now()`` timestamps (``window.ttsTimeline``).
"""

from __future__ import annotations

import io
import random
import shutil
import uuid
from pathlib import Path
from typing import Iterator

import av
import httpx
import pytest
import srt
import webvtt
from support.app import app_args, ingress_settings
from support.clips import encode, speechlike
from support.report import report
from support.waiting import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
API_KEY = "sk-page-test"
KEY_HEADER = {"Authorization": f"Bearer {API_KEY}"}
# About a minute of speech: the response streams for seconds, so playback can start long before it ends.
LONG_TEXT = (
    "".join(f"这是第{n}句话，用来测试网页在音频还在生成的时候就开始播放。" for n in "一二三四五六七八九十")
    + "Hello from the browser test, this sentence is here to make the stream last a little longer."
)

sync_api = pytest.importorskip("playwright.sync_api")
if not Path(CHROMIUM).exists():
    pytest.skip("no Chromium at /usr/bin/chromium (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def server(app_url, tmp_path_factory) -> Iterator[str]:
    """The session's app with an API key required (a keys file), for this module only."""
    keys = tmp_path_factory.mktemp("browser-keys") / "keys.txt"
    keys.write_text(API_KEY + "\n")
    security = {**app_args().ingress.security.model_dump(), "api_keys_env": None, "api_keys_file": str(keys)}
    with ingress_settings(security=security):
        yield app_url


@pytest.fixture(scope="module")
def browser() -> Iterator["sync_api.Browser"]:
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--autoplay-policy=no-user-gesture-required",
                "--use-fake-ui-for-media-stream",
                "--use-fake-device-for-media-stream",
            ],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    """A fresh page with the API key entered (as a user would: typed once, kept in localStorage);
    fails the test on any uncaught script error or Content-Security-Policy violation."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.on("console", lambda msg: errors.append(msg.text) if "Content Security Policy" in msg.text else None)
    pg.goto(server + "/")
    pg.fill("#api-key", API_KEY)
    pg.dispatch_event("#api-key", "change")
    wait_js(pg, "document.querySelectorAll('#voice option').length >= 11")
    yield pg
    context.close()
    assert not errors, errors


def wait_js(pg, expression: str, timeout_s: float = 60) -> object:
    """Poll a JavaScript expression until it is truthy. Not Playwright's wait_for_function: that
    evaluates strings inside the page, which the page's Content-Security-Policy forbids."""
    return wait_until(lambda: pg.evaluate(expression), timeout_s, 0.05, what=expression)


def speak(pg, text: str | None, fmt: str = "mp3", timeout_s: float = 240) -> dict:
    """Speak ``text`` (None: what the page holds) and wait for the response's end."""
    if text is not None:
        pg.fill("#text", text)
    pg.select_option("#format", fmt)
    pg.click("#speak")
    return wait_response(pg, timeout_s)


def wait_response(pg, timeout_s: float = 240) -> dict:
    wait_js(
        pg, "window.ttsTimeline && (window.ttsTimeline.responseEnd !== null || window.ttsTimeline.error)", timeout_s
    )
    return pg.evaluate("window.ttsTimeline")


HIGHLIGHTED = "(document.querySelector('#captions li.current') || {dataset: {}}).dataset.index"


def test_the_page_loads_and_asks_for_a_key(browser, server):
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(server + "/")
    assert pg.url.endswith("/ui/") and pg.title().startswith("ChatTTS")
    # No key yet: the built-in voices are listed (keyless discovery), speaking answers 401.
    wait_js(pg, "document.querySelectorAll('#voice option').length >= 13")
    t = speak(pg, "你好。", "mp3", timeout_s=60)
    assert t["error"] is not None
    pg.wait_for_selector("#error:not([hidden])")
    text = pg.inner_text("#error")
    assert "401" in text and "API key" in text, text
    pg.fill("#api-key", API_KEY)
    pg.dispatch_event("#api-key", "change")
    wait_js(pg, "document.querySelectorAll('#voice option').length >= 11")
    assert pg.evaluate("localStorage.getItem('chattts-api-key')") == API_KEY
    context.close()


def test_audio_plays_before_the_response_has_finished(page):
    t = speak(page, LONG_TEXT, "mp3")
    assert t["error"] is None, t["error"]
    assert t["firstByte"] is not None and t["firstAudio"] is not None
    # The media element's clock ran while bytes were still arriving.
    playing = [(when, ct) for when, ct in t["plays"] if ct > 0]
    assert playing, "the audio element never advanced"
    assert playing[0][0] < t["responseEnd"], (playing[0], t["responseEnd"])
    assert t["firstByte"] <= t["firstAudio"] < t["responseEnd"] - 500, t
    wait_js(page, "document.querySelector('#download').hidden === false")
    with page.expect_download() as download:
        page.click("#download")
    assert download.value.suggested_filename == "speech.mp3"
    saved = Path(download.value.path()).read_bytes()
    assert len(saved) == t["bytes"] > 10_000
    with av.open(io.BytesIO(saved), format="mp3") as f:  # the whole file, as the server sent it
        seconds = sum(frame.samples for frame in f.decode(audio=0)) / 24000
    assert abs(seconds - page.evaluate("window.ttsTimeline.audioSeconds")) < 0.2
    wait_js(page, "document.querySelector('#stat-rtf').textContent !== '–'")
    print(
        f"\ntimeline: first byte {t['firstByte'] - t['start']:.0f} ms, first audio {t['firstAudio'] - t['start']:.0f} ms, "
        f"first clock tick {playing[0][0] - t['start']:.0f} ms at {playing[0][1]:.2f} s, response end "
        f"{t['responseEnd'] - t['start']:.0f} ms, {t['chunks']} chunks"
    )
    ttfa, total = t["firstAudio"] - t["start"], t["responseEnd"] - t["start"]
    report(
        "browser: first audio (mp3 via MSE), tiny weights",
        f"{ttfa:.0f} ms after the click; response ended at "
        f"{total:.0f} ms; first byte {t['firstByte'] - t['start']:.0f} ms; RTF {page.inner_text('#stat-rtf')}",
    )


def test_pcm_streams_through_web_audio(page):
    t = speak(page, LONG_TEXT[:120], "pcm")
    assert t["error"] is None and t["chunks"] >= 2, t
    assert t["firstByte"] <= t["firstAudio"] < t["responseEnd"], t  # the first buffer was scheduled mid-stream
    # The audio graph's clock had played samples while later chunks were still arriving.
    assert [when for when, played in t["plays"] if played > 0 and when < t["responseEnd"]], t["plays"]
    assert abs(t["audioSeconds"] * 24000 * 2 - t["bytes"]) <= 2
    report(
        "browser: first audio (pcm via Web Audio), tiny weights",
        f"{t['firstAudio'] - t['start']:.0f} ms after the click (first byte {t['firstByte'] - t['start']:.0f} ms)",
    )


def test_a_voice_made_from_an_uploaded_clip_is_used(page, server, tmp_path):
    clip = tmp_path / "my-voice.wav"
    clip.write_bytes(encode(speechlike(3.0, f0=150.0), "wav"))
    name = f"page-{uuid.uuid4().hex[:6]}"
    page.fill("#voice-name", name)
    page.set_input_files("#voice-file", str(clip))
    page.fill("#voice-transcript", "这是我的声音。")
    page.check("#voice-consent")  # the page asks for the speaker's consent, kept with the voice
    page.fill("#voice-consent-by", "Page Tester")
    page.click("#create-voice")
    wait_js(page, "document.querySelector('#voice-status').textContent.includes('Created')", 120)
    item = page.locator("#voice-list li", has_text=name)
    assert item.count() == 1 and "clip, 3" in item.inner_text()
    voice_id = item.get_attribute("data-id")
    assert page.eval_on_selector("#voice", "s => s.value") == voice_id  # the new voice is selected
    consent = httpx.get(f"{server}/v1/audio/voices/{voice_id}", headers=KEY_HEADER, timeout=30).json()["consent"]
    assert consent["by"] == "Page Tester" and consent["statement"].startswith("The person speaking in this clip")
    report("browser: clip -> voice (3 s wav, as the page shows it)", page.inner_text("#voice-status"))

    sent: list[dict] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/audio/speech") else None)
    t = speak(page, "你好，欢迎使用语音合成服务。[uv_break] 用我的声音说这句话。", "mp3")
    assert t["error"] is None and t["bytes"] > 1000, t
    assert sent and sent[-1]["voice"] == {"id": voice_id}  # OpenAI's custom voice shape
    wait_js(page, "document.querySelector('#stat-rtf').textContent !== '–'")

    page.on("dialog", lambda d: d.accept())
    item.locator("button.delete").click()
    wait_js(page, f"!document.querySelector('#voice-list').textContent.includes({name!r})")
    assert page.locator(f"#voice option[value='{voice_id}']").count() == 0


def test_a_voice_recorded_with_the_microphone(page):
    """Chromium's fake microphone (a beep): MediaRecorder's webm/Opus goes up as the clip."""
    page.click("#record")
    wait_js(page, "document.querySelector('#record').classList.contains('recording')")
    page.wait_for_timeout(3500)
    page.click("#record")
    wait_js(page, "document.querySelector('#record-status').textContent.startsWith('recorded')")
    name = f"mic-{uuid.uuid4().hex[:6]}"
    page.fill("#voice-name", name)
    page.fill("#voice-transcript", "滴，滴，滴。")
    page.check("#voice-consent")
    page.fill("#voice-consent-by", "Mic Tester")
    page.click("#create-voice")
    wait_js(
        page,
        "document.querySelector('#voice-status').textContent.includes('Created') || "
        "!document.querySelector('#error').hidden",
        120,
    )
    assert page.is_hidden("#error"), page.inner_text("#error")
    assert "clip, 3" in page.locator("#voice-list li", has_text=name).inner_text()


def test_errors_are_shown_readably(page):
    t = speak(page, "", "mp3")
    assert t["error"], t
    text = page.inner_text("#error")
    assert "HTTP 400" in text and "input" in text, text
    page.fill("#voice-name", "alloy")  # a built-in name cannot be taken
    page.fill("#voice-transcript", "x")
    page.check("#voice-consent")
    page.fill("#voice-consent-by", "x")
    page.click("#create-voice")
    wait_js(page, "document.querySelector('#error').textContent.includes('invalid voice name')")


def caption_lines(pg) -> list[dict]:
    return pg.evaluate(
        "[...document.querySelectorAll('#captions li')].map(li => ({index: Number(li.dataset.index), "
        "when: li.querySelector('.when').textContent, who: (li.querySelector('.who') || {}).textContent, "
        "say: li.querySelector('.say').textContent}))"
    )


def vtt_seconds(stamp: str) -> float:
    h, m, sec = stamp.split(":")
    return int(h) * 3600 + int(m) * 60 + float(sec)


def test_captions_stream_in_and_follow_the_audio(page, tmp_path):
    """Web Audio (wav): each segment's line appears while the response streams, the highlighted
    line moves on as the scheduled audio plays, a click plays from a line, and the captions
    download as WebVTT and SubRip matching the segments."""
    page.fill("#seed", str(random.randrange(1, 2**31)))  # a fresh synthesis, not a cached answer
    page.fill("#text", "第一句话在这里。Then an English sentence, with a clause. 最后一句，很短。")
    page.select_option("#format", "wav")
    page.click("#speak")
    wait_js(page, f"{HIGHLIGHTED} === '0'", 120)  # the first line, as its audio is heard
    wait_js(page, f"Number({HIGHLIGHTED}) >= 1", 120)  # then a later one
    t = wait_response(page)
    assert t["error"] is None, t["error"]
    segments = t["segments"]
    assert [s["index"] for s in segments] == list(range(len(segments))) and len(segments) >= 3
    # Lines came with the stream: the first before the response had ended.
    assert t["segmentArrivals"][0] < t["responseEnd"], (t["segmentArrivals"], t["responseEnd"])
    # A line is highlighted no earlier than its audio could be heard (the context's clock, not the arrival).
    when, index, pos = next(h for h in t["highlights"] if h[1] is not None and h[1] >= 1)
    assert segments[index]["start"] <= pos < segments[index]["end"]
    assert when - t["firstAudio"] >= segments[index]["start"] * 1000 - 100, (when, t["firstAudio"], segments[index])
    lines = caption_lines(page)
    assert [line["index"] for line in lines] == [s["index"] for s in segments]
    assert [line["say"] for line in lines] == [s["caption"] for s in segments]
    assert lines[0]["when"].startswith("0:00.00–")

    shot = tmp_path / "page.png"
    bottom = page.evaluate("document.querySelector('footer').getBoundingClientRect().bottom")
    page.screenshot(path=str(shot), full_page=True, clip={"x": 0, "y": 0, "width": 1280, "height": bottom + 12})
    print(f"\nscreenshot: {shot}")

    last = len(segments) - 1  # a click on the last line plays from its start
    page.click(f"#captions li[data-index='{last}']")
    wait_js(page, f"{HIGHLIGHTED} === '{last}'", 60)

    # The caption file is the server's (the stream's last event), WebVTT by default: every
    # segment's caption in order, a cue starting where each segment does, the last ending with it.
    with page.expect_download() as download:
        page.click("#captions-file")
    assert download.value.suggested_filename == "speech.vtt"
    cues = list(webvtt.from_string(Path(download.value.path()).read_text()))
    assert "".join(c.text for c in cues).replace("\n", "").replace(" ", "") == "".join(
        s["caption"] for s in segments
    ).replace(" ", "")
    starts = {round(vtt_seconds(c.start), 3) for c in cues}
    assert all(round(s["start"], 3) in starts for s in segments), (starts, segments)
    assert vtt_seconds(cues[-1].end) == pytest.approx(segments[-1]["end"], abs=1e-3)
    report(
        "browser: captions (wav, Web Audio)",
        f"first line {t['segmentArrivals'][0] - t['start']:.0f} ms after the "
        f"click, response end {t['responseEnd'] - t['start']:.0f} ms, {len(segments)} lines",
    )


def test_the_ssml_example_plays_with_its_segments(page):
    """mp3 through the media element: the example's break, rate change, voice change and say-as."""
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/audio/speech") else None)
    page.fill("#text", "plain")
    assert not page.is_checked("#ssml")
    page.click("#ssml-example")
    assert page.is_checked("#ssml") and page.input_value("#text").startswith("<speak>")
    page.fill("#seed", str(random.randrange(1, 2**31)))
    t = speak(page, None, "mp3")
    assert t["error"] is None, t["error"]
    assert sent[-1]["input_format"] == "ssml" and sent[-1]["input"].startswith("<speak>")
    segments = t["segments"]
    assert len(segments) >= 4
    assert segments[1]["start"] - segments[0]["end"] == pytest.approx(0.7, abs=0.01)  # the break
    lines = caption_lines(page)
    assert len(lines) == len(segments) and "echo" in {line["who"] for line in lines}
    said = " ".join(line["say"] for line in lines)
    assert "<" not in said and "12345" not in said  # spoken text, say-as read out
    wait_js(page, f"{HIGHLIGHTED} !== undefined", 60)  # the element's clock highlights a line
    # Typing SSML turns the switch on by itself; plain text turns it off.
    page.fill("#text", "")
    page.type("#text", "<speak>")
    assert page.is_checked("#ssml")
    page.fill("#text", "")
    page.type("#text", "hi")
    assert not page.is_checked("#ssml")


def test_a_dialogue_of_two_voices_plays_with_speakers_on_its_captions(page):
    sent: list[dict] = []
    page.on("request", lambda r: sent.append(r.post_data_json) if r.url.endswith("/v1/audio/dialogue") else None)
    page.check("input[name='mode'][value='dialogue']")
    assert page.is_hidden("#text") and page.is_hidden("#voice")
    assert page.locator("#turns li").count() == 2
    page.click("#add-turn")
    assert page.locator("#turns li").count() == 3
    page.locator("#turns li").nth(2).locator("button.delete").click()
    turns = page.locator("#turns li")
    assert turns.count() == 2
    turns.nth(0).locator("select").select_option("alloy")
    turns.nth(0).locator("textarea").fill("Hello, welcome to the show.")
    turns.nth(1).locator("select").select_option("echo")
    turns.nth(1).locator("textarea").fill("谢谢，很高兴来到这里。")
    page.fill("#pause", "0.5")
    page.fill("#seed", str(random.randrange(1, 2**31)))
    page.evaluate("document.getElementById('advanced').open = true")  # where the format is chosen
    page.select_option("#captions-format", "srt")
    t = speak(page, None, "pcm")
    assert t["error"] is None, t["error"]
    assert [(x["voice"], x["input"]) for x in sent[-1]["turns"]] == [
        ("alloy", "Hello, welcome to the show."),
        ("echo", "谢谢，很高兴来到这里。"),
    ]
    segments = t["segments"]
    assert {s["turn"]: s["speaker"] for s in segments} == {0: "alloy", 1: "echo"}
    first_of_1 = next(i for i, s in enumerate(segments) if s["turn"] == 1)
    assert segments[first_of_1]["start"] - segments[first_of_1 - 1]["end"] == pytest.approx(0.5, abs=0.01)
    assert [line["who"] for line in caption_lines(page)] == [s["speaker"] for s in segments]
    with page.expect_download() as download:
        page.click("#captions-file")
    assert download.value.suggested_filename == "dialogue.srt"
    subs = list(srt.parse(Path(download.value.path()).read_text()))
    assert subs[0].content.startswith("alloy: ") and subs[-1].content.startswith("echo: ")
    wait_js(page, f"{HIGHLIGHTED} === '{first_of_1}'", 60)  # the second voice's line, as it is heard
