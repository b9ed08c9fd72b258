"""The engine's cost caps and bounded refine_text through the real graph (the shared ``chattts``
app, tiny random weights, real HTTP): the TextNormalizer's caps reach the client as 413s, and
refine_text runs through ``Acoustic.refine`` (the refine thread, its limits) and the replan with
the caller's id."""

from __future__ import annotations

import httpx
import pytest
from support.app import acoustic_stats


def speech(app_url: str, **body) -> httpx.Response:
    payload = {"model": "tts-1", "voice": "alloy", "response_format": "wav", **body}
    return httpx.post(app_url + "/v1/audio/speech", json=payload, headers={"Cache-Control": "no-store"}, timeout=120)


def test_refine_text_runs_and_its_input_is_bounded(app_url):
    before = acoustic_stats()
    r = speech(app_url, input="限制测试：你好。", refine_text=True)
    assert r.status_code == 200, r.text
    assert len(r.content) > 44
    assert acoustic_stats()["rows_finished"] > before["rows_finished"]
    # More segments than refine_max_texts (32): refused before any generation.
    r = speech(app_url, input="这是一个很长的句子。" * 230, refine_text=True)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["param"] == "input"
    assert "230 segments; the limit is 32 (refine_max_texts)" in err["message"]


def test_slow_speech_past_max_request_seconds_is_413(app_url):
    r = speech(app_url, input=("我们的系统会把长文本切成几个片段，分别生成语音。" * 180)[:4096], speed=0.25)
    assert r.status_code == 413, r.text
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["param"] == "input"
    assert "1800 s" in err["message"] and "speed 0.25" in err["message"]


@pytest.mark.parametrize("speed", [1.0])
def test_long_input_at_normal_speed_is_accepted(app_url, speed):
    """The caps leave a full max_input_chars of prose alone (only its first bytes are read)."""
    text = ("我们的系统会把长文本切成几个片段，分别生成语音。" * 180)[:4096]
    payload = {"model": "tts-1", "voice": "alloy", "response_format": "pcm", "input": text, "speed": speed}
    with httpx.stream(
        "POST", app_url + "/v1/audio/speech", json=payload, headers={"Cache-Control": "no-store"}, timeout=120
    ) as r:
        assert r.status_code == 200
        first = next(r.iter_bytes())
        assert first
