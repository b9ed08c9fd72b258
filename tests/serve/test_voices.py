"""The voices API end to end: the session's app on Ray Serve (tiny random weights), real HTTP.
Voices in the engine: tests/unit/test_voice_clips.py."""

from __future__ import annotations

import time
import uuid

import httpx
import numpy as np
import pytest
from support.app import ingress_settings
from support.audio import read_wav
from support.clips import TRANSCRIPT, encode, speechlike
from support.http import assert_openai_error as error_of
from support.report import report

from serve_app.engine.wav import with_true_length

VOICES = "/v1/audio/voices"


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def speech(app_url: str, voice, text: str = "你好，这是我的声音。", **extra) -> httpx.Response:
    body = {"model": "chattts", "input": text, "voice": voice, "response_format": "wav", **extra}
    return httpx.post(app_url + "/v1/audio/speech", json=body, timeout=180)


def pcm_of(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text[:300]
    pcm = read_wav(resp.content)
    assert len(pcm) > 0
    return pcm


def create_clip_voice(
    app_url: str, name: str, data: bytes, transcript: str | None = TRANSCRIPT, filename: str = "clip.wav", **fields
) -> httpx.Response:
    form = {"name": name, **fields} if transcript is None else {"name": name, "transcript": transcript, **fields}
    return httpx.post(
        app_url + VOICES, data=form, files={"audio": (filename, data, "application/octet-stream")}, timeout=180
    )


def custom_ids(app_url: str) -> set[str]:
    r = httpx.get(app_url + VOICES, timeout=30)
    assert r.status_code == 200
    return {v["id"] for v in r.json()["data"] if v["kind"] != "builtin"}


def test_a_seed_voice_keeps_the_builtin_speaker_and_can_be_kept_as_a_string(app_url):
    """A voice made from seed 2222 is alloy's speaker (sampled by the Vocoder stage, decoded by the
    Acoustic stage); its speaker string, stored as a voice of its own, is the same voice again."""
    name = unique("seeded")
    r = httpx.post(app_url + VOICES, json={"name": name, "seed": 2222}, timeout=60)
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["id"].startswith("voice_") and made["kind"] == "seed" and made["name"] == name
    detail = httpx.get(app_url + f"{VOICES}/{made['id']}", timeout=60).json()
    alloy = httpx.get(app_url + f"{VOICES}/alloy", timeout=60).json()
    assert detail["speaker"] == alloy["speaker"] and len(detail["speaker"]) > 100
    kept = httpx.post(app_url + VOICES, json={"name": unique("kept"), "speaker": detail["speaker"]}, timeout=60).json()
    assert kept["kind"] == "speaker"

    reference = pcm_of(speech(app_url, "alloy", seed=77))
    for voice in (name, name.upper(), {"id": made["id"]}, made["id"], {"id": kept["id"]}, detail["speaker"]):
        assert np.array_equal(pcm_of(speech(app_url, voice, seed=77)), reference), voice
    listed = httpx.get(app_url + VOICES, timeout=30).json()["data"]
    assert {"alloy", made["id"], kept["id"]} <= {v["id"] for v in listed}


def test_a_clip_becomes_a_voice_and_speaks(app_url):
    pcm = speechlike(4.0, f0=130.0, seed=3)
    t0 = time.perf_counter()
    consent = {"consent": "I agree that my voice is made from this clip.", "consent_by": "Test Speaker"}
    r = create_clip_voice(
        app_url, unique("clip"), encode(pcm, "mp3", rate=44100, channels=2), filename="me.mp3", **consent
    )
    took = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    voice = r.json()
    assert voice["kind"] == "clip" and 3.9 <= voice["clip_seconds"] <= 4.2
    report("voice from a 4 s mp3 clip (POST /v1/audio/voices)", f"{took * 1000:.0f} ms")
    detail = httpx.get(app_url + f"{VOICES}/{voice['id']}", timeout=30).json()
    assert detail["transcript"] == TRANSCRIPT and detail["sample"] and detail["speaker"] is None
    # The consent given with the clip, kept with the voice (statement, who, when).
    assert {k: detail["consent"][k] for k in ("statement", "by")} == {
        "statement": consent["consent"],
        "by": "Test Speaker",
    }
    assert 0 <= voice["created_at"] - detail["consent"]["at"] < 120  # recorded with the request, before the encoding
    other = create_clip_voice(app_url, unique("clip"), encode(speechlike(4.0, f0=220.0, seed=4), "wav")).json()

    mine = pcm_of(speech(app_url, {"id": voice["id"]}, seed=5))
    theirs = pcm_of(speech(app_url, {"id": other["id"]}, seed=5))
    # Random weights: the length is the text's (pacing), the content the clip's conditioning.
    assert len(mine) == len(theirs) and not np.array_equal(mine, theirs)
    assert np.array_equal(pcm_of(speech(app_url, voice["name"], seed=5)), mine)


@pytest.mark.parametrize(
    "case", ["undecodable", "too_short", "too_long", "silent", "no_transcript", "no_audio", "too_big"]
)
def test_bad_clips_are_refused_with_the_reason_and_nothing_is_stored(app_url, case):
    before = custom_ids(app_url)
    name = unique("bad")
    wav = encode(speechlike(3.0), "wav")
    if case == "no_audio":
        r = httpx.post(app_url + VOICES, data={"name": name, "transcript": TRANSCRIPT}, timeout=60)
    elif case == "too_big":  # over the upload limit (8 MiB in config/serve.yaml's default)
        r = create_clip_voice(app_url, name, b"\0" * (9 * 1024 * 1024))
    else:
        data = {
            "undecodable": b"definitely not audio" * 50,
            "too_short": encode(speechlike(1.0), "wav"),
            "too_long": encode(speechlike(31.0), "ogg"),
            "silent": encode(np.zeros(72000, np.float32), "wav"),
            "no_transcript": wav,
        }[case]
        r = create_clip_voice(app_url, name, data, transcript=None if case == "no_transcript" else TRANSCRIPT)
    status, code, words = {
        "undecodable": (400, "invalid_audio", "could not decode"),
        "too_short": (400, "invalid_audio", "1.0 s"),
        "too_long": (400, "invalid_audio", "longer than 30 s"),
        "silent": (400, "invalid_audio", "silent"),
        "no_transcript": (400, "missing_transcript", "transcript"),
        "no_audio": (400, "missing_audio", "audio"),
        "too_big": (413, "body_too_large", "exceeds"),
    }[case]
    err = error_of(r, status)
    assert err["code"] == code and words in err["message"], err
    assert custom_ids(app_url) == before
    assert error_of(speech(app_url, name), 400)["code"] == "voice_not_found"


def test_names_ids_and_deletion(app_url):
    name = unique("dup")
    first = httpx.post(app_url + VOICES, json={"name": name, "seed": 1}, timeout=60).json()
    assert (
        error_of(httpx.post(app_url + VOICES, json={"name": name.upper(), "seed": 2}, timeout=60), 409)["code"]
        == "voice_exists"
    )
    assert error_of(httpx.post(app_url + VOICES, json={"name": "alloy", "seed": 2}, timeout=60), 400)["param"] == "name"
    assert error_of(
        httpx.post(app_url + VOICES, json={"name": unique("x"), "seed": 1, "speaker": "y" * 40}, timeout=60), 400
    )
    assert (
        error_of(
            httpx.post(app_url + VOICES, json={"name": unique("x"), "speaker": "not a speaker" * 5}, timeout=60), 400
        )["param"]
        == "speaker"
    )
    assert (
        error_of(
            httpx.post(app_url + VOICES, content=b"{", headers={"content-type": "application/json"}, timeout=60), 400
        )["code"]
        == "invalid_json"
    )
    assert error_of(httpx.delete(app_url + f"{VOICES}/alloy", timeout=30), 400)["code"] == "builtin_voice"
    r = httpx.delete(app_url + f"{VOICES}/{first['id']}", timeout=30)
    assert r.status_code == 200 and r.json() == {"id": first["id"], "object": "voice.deleted", "deleted": True}
    for path in (f"{VOICES}/{first['id']}", f"{VOICES}/voice_nope", f"{VOICES}/..%2E"):
        assert error_of(httpx.get(app_url + path, timeout=30), 404)["code"] == "voice_not_found"
    error_of(httpx.get(app_url + f"{VOICES}/..%2F..%2Fetc%2Fpasswd", timeout=30), 404)  # no such route
    assert error_of(httpx.delete(app_url + f"{VOICES}/{first['id']}", timeout=30), 404)["code"] == "voice_not_found"
    # The resource routes answer 404 for a voice that is not there; a speech request naming it is a
    # bad request field: 400 (param voice), as OpenAI answers an unknown voice.
    assert error_of(speech(app_url, {"id": first["id"]}), 400)["code"] == "voice_not_found"
    assert error_of(speech(app_url, name), 400)["param"] == "voice"


def test_replacing_a_voice_never_replays_its_old_audio(app_url):
    """The cache key takes the voice's content: same name, new content -> a miss and new audio."""
    name = unique("cached")
    text = "缓存里的声音。"
    made = httpx.post(app_url + VOICES, json={"name": name, "seed": 11}, timeout=60).json()
    first, again = speech(app_url, name, text), speech(app_url, name, text)
    assert (first.headers["x-cache"], again.headers["x-cache"]) == ("miss", "hit")
    assert again.content == with_true_length(first.content)
    httpx.delete(app_url + f"{VOICES}/{made['id']}", timeout=30)
    httpx.post(app_url + VOICES, json={"name": name, "seed": 12}, timeout=60)
    replaced = speech(app_url, name, text)
    assert replaced.headers["x-cache"] == "miss" and replaced.content != first.content


def test_voices_need_the_api_key_when_keys_are_on(app_url, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-voice\n")
    security = {"api_keys_env": None, "api_keys_file": str(keys), "max_streams_per_key": 0, "cors_origins": []}
    good = {"Authorization": "Bearer sk-voice"}
    with ingress_settings(security=security):
        calls = [
            httpx.get(app_url + f"{VOICES}/alloy", timeout=30),
            httpx.post(app_url + VOICES, json={"name": unique("k"), "seed": 3}, timeout=30),
            httpx.delete(app_url + f"{VOICES}/voice_" + "0" * 24, timeout=30),
            httpx.get(app_url + VOICES, headers={"Authorization": "Bearer sk-not-a-key"}, timeout=30),
        ]
        keyless = httpx.get(app_url + VOICES, timeout=30)  # Open WebUI lists voices without a key
        listed = httpx.get(app_url + VOICES, headers=good, timeout=30)
        page = httpx.get(app_url + "/ui/", timeout=30)
    for r in calls:
        assert error_of(r, 401)["code"] == "invalid_api_key"
    assert keyless.status_code == 200 and {v["kind"] for v in keyless.json()["data"]} == {"builtin"}
    assert listed.status_code == 200
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]  # the page itself is public


def test_the_page_and_its_files_are_served(app_url):
    root = httpx.get(app_url + "/", timeout=30)
    assert root.status_code in (302, 307) and root.headers["location"] == "ui/"
    page = httpx.get(app_url + "/", timeout=30, follow_redirects=True)
    assert page.status_code == 200 and 'src="app.js"' in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    for name, ctype in (("app.js", "text/javascript"), ("style.css", "text/css")):
        r = httpx.get(app_url + f"/ui/{name}", timeout=30)
        assert r.status_code == 200 and r.headers["content-type"].startswith(ctype) and len(r.content) > 1000
    for missing in ("../app.py", "nope.js", "%2e%2e/serve_app/app.py"):
        assert httpx.get(app_url + f"/ui/{missing}", timeout=30).status_code == 404
