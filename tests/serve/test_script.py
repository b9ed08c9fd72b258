"""Scripts in the session's Serve app: OpenAI's ``instructions``, the SSML subset (breaks as
exact silence, rate, voice changes, say-as, unsupported elements named), malformed SSML, and
dialogues of several voices with pauses between turns (audio, timing, captions)."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import webvtt
from support.app import acoustic_stats, wait_idle
from support.http import assert_openai_error

pytestmark = pytest.mark.serve

SR = 24000
NO_STORE = {"Cache-Control": "no-store"}


def _post(url: str, path: str, **body) -> httpx.Response:
    r = httpx.post(url + path, json={"seed": 5, "response_format": "pcm", **body}, headers=NO_STORE, timeout=180)
    assert r.status_code == 200, r.text[:400]
    return r


def _pcm(r: httpx.Response) -> np.ndarray:
    answer = r.json()
    return np.frombuffer(base64.b64decode(answer["audio"]), "<i2"), answer


def test_instructions_set_the_style_and_say_what_they_did(app_url):
    text = "The weather is fine today, and we will walk in the park."
    plain = _post(app_url, "/v1/audio/speech", input=text)
    slow = _post(
        app_url,
        "/v1/audio/speech",
        input=text,
        model="gpt-4o-mini-tts",
        instructions="Speak slowly, like a storyteller, and whisper.",
    )
    assert "storyteller" in slow.headers["x-style-applied"] and "slow" in slow.headers["x-style-applied"]
    assert "whisper" in slow.headers["x-style-ignored"]  # nothing ChatTTS can do: said, not pretended
    assert len(slow.content) > 1.15 * len(plain.content)  # slower speech: more audio for the same text
    assert "x-style-applied" not in plain.headers


def test_ssml_breaks_are_exact_silence_and_voices_change_where_asked(app_url):
    ssml = (
        '<speak><p>你好，<break time="700ms"/>欢迎。</p>'
        '<s><prosody rate="slow">This part is slow.</prosody></s>'
        '<voice name="echo">我是另一个声音。</voice>'
        '<s>Call <say-as interpret-as="telephone">12345</say-as>, <emphasis>now</emphasis>.</s></speak>'
    )
    r = _post(app_url, "/v1/audio/speech/with-timestamps", input=ssml)
    pcm, answer = _pcm(r)
    assert r.headers["x-ssml-unsupported"] == "emphasis"
    segments = answer["segments"]
    assert len(pcm) / SR == pytest.approx(answer["duration"], abs=1 / SR)
    first, second = segments[0], segments[1]
    gap = second["start"] - first["end"]
    assert gap == pytest.approx(0.7, abs=1 / SR)  # the break: exactly its time ...
    silence = pcm[round(first["end"] * SR) + 1 : round(second["start"] * SR) - 1]
    assert len(silence) > 0.69 * SR and not silence.any()  # ... and silent
    speakers = [s["speaker"] for s in segments]
    assert "echo" in speakers and speakers[0] is None
    for s in segments:  # each segment names the part of the SSML it speaks
        assert s["input_start"] is not None and ssml[s["input_start"] : s["input_end"]]
    spoken = " ".join(s["text"] for s in segments)
    assert "12345" not in spoken  # say-as telephone read the number out


def test_malformed_ssml_is_a_400_naming_the_element_and_where(app_url):
    r = httpx.post(
        app_url + "/v1/audio/speech", json={"input": '<speak>hi <break time="5 parsecs"/></speak>'}, timeout=30
    )
    err = assert_openai_error(r, 400, "invalid_ssml")
    assert "<break>" in err["message"] and "line 1" in err["message"]
    r = httpx.post(app_url + "/v1/audio/speech", json={"input": "<speak>unclosed <s>text</speak>"}, timeout=30)
    assert_openai_error(r, 400, "invalid_ssml")
    doctype = '<?xml version="1.0"?><!DOCTYPE speak [<!ENTITY x "boom">]><speak>&x;</speak>'
    r = httpx.post(app_url + "/v1/audio/speech", json={"input": doctype, "input_format": "ssml"}, timeout=30)
    assert_openai_error(r, 400, "invalid_ssml")


TURNS = [
    {"voice": "alloy", "input": "Hello, welcome to the show."},
    {"voice": "echo", "input": "谢谢，很高兴来到这里。", "instructions": "cheerful"},
    {"voice": "alloy", "input": "Let us begin."},
]


def test_a_dialogue_speaks_each_turn_in_its_voice_with_pauses_between(app_url):
    before = wait_idle()
    r = _post(app_url, "/v1/audio/dialogue/with-timestamps", turns=TURNS, pause_s=0.5, captions="vtt")
    after = acoustic_stats()
    pcm, answer = _pcm(r)
    segments = answer["segments"]
    # Every turn's segments decoded together, as rows of the same steps (turn by turn: ~1 a step).
    steps, row_steps = after["steps"] - before["steps"], after["row_steps"] - before["row_steps"]
    assert after["rows_admitted"] - before["rows_admitted"] == len(segments) and row_steps / steps > 1.5, (
        len(segments),
        steps,
        row_steps,
    )
    assert [s["turn"] for s in segments] == sorted(s["turn"] for s in segments) and {s["turn"] for s in segments} == {
        0,
        1,
        2,
    }
    assert {s["turn"]: s["speaker"] for s in segments} == {0: "alloy", 1: "echo", 2: "alloy"}
    for a, b in zip(segments, segments[1:]):
        gap = b["start"] - a["end"]
        assert gap == pytest.approx(0.5 if b["turn"] != a["turn"] else 0.0, abs=1 / SR)
        if gap:
            assert not pcm[round(a["end"] * SR) + 1 : round(b["start"] * SR) - 1].any()
        turn_text = TURNS[b["turn"]]["input"]
        assert turn_text[b["input_start"] : b["input_end"]] == b["text"]
    assert segments[-1]["end"] == pytest.approx(len(pcm) / SR, abs=1 / SR)
    cues = list(webvtt.from_string(answer["captions"]))
    assert {c.voice for c in cues} == {"alloy", "echo"}
    assert "cheerful" in r.headers["x-style-applied"]
    # The streamed answer is the same audio (one synthesis, the turns decoded together).
    streamed = _post(app_url, "/v1/audio/dialogue", turns=TURNS, pause_s=0.5)
    assert np.array_equal(np.frombuffer(streamed.content, "<i2"), pcm)


def test_a_dialogue_with_sse_names_speakers_and_a_bad_turn_is_a_400(app_url):
    with httpx.Client(timeout=180) as client:
        r = client.post(
            app_url + "/v1/audio/dialogue",
            json={"turns": TURNS, "seed": 5, "response_format": "pcm", "stream_format": "sse", "timestamps": True},
            headers=NO_STORE,
        )
    events = [json.loads(b[len("data: ") :]) for b in r.text.split("\n\n") if b]
    segments = [e for e in events if e["type"] == "speech.segment"]
    assert [s["speaker"] for s in segments][:1] == ["alloy"] and "echo" in {s["speaker"] for s in segments}
    r = httpx.post(app_url + "/v1/audio/dialogue", json={"turns": [{"voice": "nobody", "input": "hi"}]}, timeout=30)
    assert_openai_error(r, 400, "voice_not_found")
    r = httpx.post(app_url + "/v1/audio/dialogue", json={"turns": []}, timeout=30)
    assert_openai_error(r, 400)
