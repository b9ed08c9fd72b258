"""Where each segment lies in the audio, on every path of the session's Serve app: SSE events
(``timestamps``), the JSON answer with its captions (``/v1/audio/speech/with-timestamps``, fresh
and from the cache, and through the handle API), and the WebSocket session's ``segment.done``. Random weights decode an
exact length, so the segments' ends must meet the audio's length to the sample (compressed
formats: within a codec frame)."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import srt
import webvtt
from support.audio import decode_av

pytestmark = pytest.mark.serve

TEXT = "第一句话在这里。Then an English sentence, with a clause. 最后一句，很短。"
SR = 24000


def _events(raw: bytes) -> list[dict]:
    return [json.loads(block[len("data: ") :]) for block in raw.decode().split("\n\n") if block]


def _sse(url: str, **body) -> list[dict]:
    with httpx.Client(timeout=120) as client:
        with client.stream(
            "POST",
            url + "/v1/audio/speech",
            json={"input": TEXT, "seed": 11, "stream_format": "sse", "timestamps": True, **body},
            headers={"Cache-Control": "no-store"},
        ) as r:
            assert r.status_code == 200, r.read()[:300]
            return _events(r.read())


def _timed(url: str, headers: dict | None = None, **body) -> httpx.Response:
    r = httpx.post(
        url + "/v1/audio/speech/with-timestamps",
        json={"input": TEXT, "seed": 11, **body},
        headers=headers or {},
        timeout=120,
    )
    assert r.status_code == 200, r.text[:300]
    return r


def _check_segments(segments: list[dict], audio_s: float, padding_s: float = 0.0, rate: int = SR) -> None:
    """``padding_s``: what a lossy encoder may add around the audio (priming, a last frame);
    ``rate``: the format's, whose one sample the resampled length may be short by."""
    assert [s["index"] for s in segments] == list(range(len(segments))) and len(segments) >= 3
    assert segments[0]["start"] == 0.0
    for a, b in zip(segments, segments[1:]):
        assert a["end"] == b["start"] and a["end"] > a["start"]  # back to back: no pause was asked for
    assert -1 / rate - 1 / SR <= audio_s - segments[-1]["end"] <= padding_s + 1 / SR, (segments[-1]["end"], audio_s)
    for s in segments:  # each segment names the input's own text it speaks
        assert TEXT[s["input_start"] : s["input_end"]] == s["text"]


def test_sse_segment_events_come_between_the_deltas_and_meet_the_audio_length(app_url):
    events = _sse(app_url, response_format="pcm")
    kinds = [e["type"] for e in events]
    assert kinds[-1] == "speech.audio.done"
    segments = [e for e in events if e["type"] == "speech.segment"]
    audio = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    _check_segments(segments, len(audio) / 2 / SR)
    # Each event comes once its segment's audio has been sent: after the bytes up to its end.
    sent = 0
    for e in events:
        if e["type"] == "speech.audio.delta":
            sent += len(base64.b64decode(e["audio"]))
        elif e["type"] == "speech.segment":
            assert sent >= (round(e["end"] * SR) - 1) * 2
    assert kinds.index("speech.segment") < len(kinds) - 2  # not all at the end


def test_json_answer_with_captions_agrees_with_sse_fresh_and_from_the_cache(app_url, chattts_handle):
    events = _sse(app_url, response_format="wav", captions="srt")
    sse_segments = [e for e in events if e["type"] == "speech.segment"]
    fresh = _timed(app_url, headers={"Cache-Control": "no-cache"}, response_format="wav", captions="srt").json()
    cached = _timed(app_url, response_format="wav", captions="vtt")
    assert cached.headers["content-type"].startswith("application/json")
    cached = cached.json()
    wav = base64.b64decode(fresh["audio"])
    assert wav[:4] == b"RIFF" and base64.b64decode(cached["audio"]) == wav
    audio_s = (len(wav) - 44) / 2 / SR
    assert fresh["duration"] == pytest.approx(audio_s, abs=1e-4) and cached["duration"] == fresh["duration"]
    _check_segments(fresh["segments"], audio_s)
    sse_segments = [{k: v for k, v in e.items() if k != "type"} for e in sse_segments]
    assert fresh["segments"] == cached["segments"] == sse_segments  # same seed, every path
    # The stream's last event carries the same caption file as the JSON answer (the web page's).
    assert (events[-1]["captions"], events[-1]["captions_format"]) == (fresh["captions"], "srt")
    # The handle API answers the same (a DeploymentHandle caller: TimedSpeech itself).
    handled = chattts_handle.synthesize_with_timestamps.remote(
        {"input": TEXT, "seed": 11, "response_format": "wav", "captions": "srt"}
    ).result(timeout_s=120)
    assert [seg.model_dump() for seg in handled.segments] == fresh["segments"]
    assert handled.captions == fresh["captions"] and base64.b64decode(handled.audio) == wav
    # Captions: parsed by maintained libraries, one cue at least per segment, times inside the audio.
    cues = list(srt.parse(fresh["captions"]))
    assert fresh["captions_format"] == "srt" and len(cues) >= len(fresh["segments"])
    assert cues[0].start.total_seconds() == 0 and cues[-1].end.total_seconds() == pytest.approx(audio_s, abs=1e-3)
    vtt = webvtt.from_string(cached["captions"])
    assert [c.text for c in vtt] == [c.content for c in cues]
    assert "".join(c.content for c in cues).replace("\n", "").replace(" ", "") == TEXT.replace(" ", "")


# What each encoder adds around the audio when decoded (tests/support/audio.py): mp3 48-72 ms of
# priming and padding, aac 43-85 ms; opus is trimmed exactly (at 48 kHz), the rest are exact
# (ulaw/alaw at 8 kHz: within a sample there).
PADDING_S = {"mp3": 0.1, "aac": 0.1, "ulaw": 1 / 8000, "alaw": 1 / 8000}


@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "ulaw", "alaw"])
def test_every_format_ends_where_its_last_segment_does(app_url, fmt):
    answer = _timed(app_url, headers={"Cache-Control": "no-store"}, response_format=fmt).json()
    pcm, rate = decode_av(base64.b64decode(answer["audio"]), fmt)
    _check_segments(answer["segments"], pcm.shape[1] / rate, padding_s=PADDING_S.get(fmt, 0.0), rate=rate)


def test_timestamps_without_sse_is_a_clear_400(app_url):
    r = httpx.post(app_url + "/v1/audio/speech", json={"input": TEXT, "timestamps": True}, timeout=30)
    assert r.status_code == 400 and "stream_format" in r.json()["error"]["message"]
    body = {"input": TEXT, "stream_format": "sse", "captions": "vtt"}  # captions come with the timestamps
    r = httpx.post(app_url + "/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == 400 and "timestamps" in r.json()["error"]["message"]


async def test_websocket_segments_sit_on_the_session_timeline(app_url):
    from serve_app.client import AsyncSpeechClient

    events: list[dict] = []
    async with AsyncSpeechClient(app_url) as client:
        audio = b"".join(
            [b async for b in client.stream_text(iter_text(), seed=3, response_format="pcm", on_event=events.append)]
        )
    done = [e for e in events if e.get("type") == "segment.done"]
    assert len(done) >= 2
    assert done[0]["start"] == 0.0 and all(a["end"] == b["start"] for a, b in zip(done, done[1:]))
    assert done[-1]["end"] == pytest.approx(len(np.frombuffer(audio, "<i2")) / SR, abs=1e-4)


async def iter_text():
    for piece in ("第一句话在这里。", "第二句话也在这里。", "Third one."):
        yield piece


def _loudness(pcm: np.ndarray) -> float:
    import pyloudnorm

    return pyloudnorm.Meter(SR).integrated_loudness(pcm.astype(np.float64) / 32768.0)


def test_telephony_volume_and_loudness_on_the_answer(app_url):
    from support.audio import assert_duration

    body = {"input": TEXT, "seed": 11, "response_format": "pcm"}
    plain = httpx.post(app_url + "/v1/audio/speech", json=body, headers={"Cache-Control": "no-store"}, timeout=120)
    quieter = httpx.post(
        app_url + "/v1/audio/speech", json={**body, "volume": -6.0}, headers={"Cache-Control": "no-store"}, timeout=120
    )
    a, b = (np.frombuffer(r.content, "<i2").astype(np.float64) for r in (plain, quieter))
    assert len(a) == len(b) and np.sqrt(np.mean(b**2)) / np.sqrt(np.mean(a**2)) == pytest.approx(
        10 ** (-6 / 20), rel=0.01
    )
    # A loudness target for the whole answer (EBU R128, measured by pyloudnorm), same length.
    for target in (-16.0, -26.0):
        r = httpx.post(app_url + "/v1/audio/speech", json={**body, "loudness": target}, timeout=120)
        pcm = np.frombuffer(r.content, "<i2")
        assert len(pcm) == len(a) and _loudness(pcm) == pytest.approx(target, abs=1.0)
    # G.711 at 8 kHz, as telephony stacks take it: a third of the samples, same seconds.
    for fmt, ctype in (("ulaw", "audio/basic"), ("alaw", "audio/x-alaw-basic")):
        r = httpx.post(app_url + "/v1/audio/speech", json={**body, "response_format": fmt}, timeout=120)
        assert r.status_code == 200 and r.headers["content-type"] == ctype
        assert_duration(r.content, fmt, len(a))
