"""Voices users own: a reference clip in the engine, and the voices API end to end.

Engine part (no Ray): a row carrying a reference clip (``spk_smp`` + ``txt_smp``) decodes the
same tokens as ChatTTS's own ``Chat._infer_code`` given the same clip, alone and among other
rows; the Vocoder stage's clip encoder gives what ``Chat.sample_audio_speaker`` gives. Under
near-greedy sampling (temperature 1e-5): ChatTTS's top-k keeps at least 3 candidates, so
``top_k=1`` would not be greedy.

API part: the real app on Ray Serve (tiny random weights), real HTTP.
"""

from __future__ import annotations

import dataclasses
import io

import httpx
import numpy as np
import pytest
import soundfile as sf
import torch

from clips import encode, speechlike
from engine_helpers import drain, fixed_chunks, seg
from serve_app.engine.wav import with_true_length

GREEDY = 1e-5
TRANSCRIPT = "这是一段参考音频，用来克隆声音。"


# ============================================================================== engine


@pytest.fixture(scope="module")
def chat(tiny_model):
    return tiny_model.chat


@pytest.fixture(scope="module")
def clips(chat) -> dict[str, str]:
    """Two reference clips of different lengths as ChatTTS encodes them."""
    return {name: chat.sample_audio_speaker(speechlike(s, f0=f0, seed=i))
            for i, (name, s, f0) in enumerate([("short", 2.5, 120.0), ("long", 4.0, 210.0)])}


@pytest.fixture(scope="module")
def speaker(chat) -> str:
    from serve_app.engine.voices import SpeakerSampler

    return SpeakerSampler(chat.speaker).from_seed(4444)


def chattts_tokens(chat, req) -> tuple[torch.Tensor, torch.Tensor]:
    """Tokens (n, 4) and hidden states (n, 768) of ChatTTS's own ``_infer_code`` for one segment."""
    from ChatTTS import Chat

    params = Chat.InferCodeParams(
        prompt=req.prompt, spk_emb=req.spk_emb, spk_smp=req.spk_smp, txt_smp=req.txt_smp,
        temperature=req.temperature, top_P=req.top_p, top_K=req.top_k, repetition_penalty=req.repetition_penalty,
        max_new_token=req.max_new_tokens, min_new_token=req.max_new_tokens, show_tqdm=False, manual_seed=req.seed,
    )
    out = list(chat._infer_code([req.text], False, chat.device, True, params))[-1]
    return out.ids[0], out.hiddens[0]


class TokenLog:
    """Observes the engine's sampler: every token each row draws, by row (the engine only
    streams hidden states)."""

    def __init__(self, engine):
        self.by_row: dict[int, list[torch.Tensor]] = {}
        draw = engine.sampler.draw

        def record(row, probs):
            token = draw(row, probs)
            if token is not None:
                self.by_row.setdefault(row.stream.row_id, []).append(token)
            return token

        engine.sampler.draw = record

    def tokens(self, stream) -> torch.Tensor:
        return torch.stack(self.by_row[stream.row_id])


@pytest.fixture
def engine(tiny_model):
    from serve_app.engine.acoustic import AcousticEngine

    eng = AcousticEngine(tiny_model, fixed_chunks())
    yield eng
    eng.stop()


def clip_row(clip: str, spk_emb, n: int, text: str = "你好，欢迎使用语音合成服务。", seed: int = 3):
    return seg(spk_emb, n, seed=seed, text=text, temperature=GREEDY, spk_smp=clip, txt_smp=TRANSCRIPT)


@pytest.mark.parametrize("with_speaker", [False, True], ids=["clip", "clip+speaker"])
def test_clip_row_decodes_like_chattts_alone_and_in_a_batch(chat, engine, clips, speaker, with_speaker):
    spk = speaker if with_speaker else None
    rows = [clip_row(clips["short"], spk, 30), clip_row(clips["long"], spk, 22, text="今天天气很好。", seed=9)]
    expected = [chattts_tokens(chat, r) for r in rows]
    log = TokenLog(engine)

    alone = []
    for r in rows:
        stream = engine.submit(r)
        engine.run_until_idle()
        alone.append((log.tokens(stream), drain(stream)[1]))

    # Together with rows without a clip, joining while others run (prefills of different lengths).
    others = [seg(speaker, 40, seed=5, temperature=0.7), seg(None, 35, seed=6, text="hello world", temperature=0.3)]
    streams = [engine.submit(others[0])]
    for _ in range(3):
        engine.step()
    streams += [engine.submit(rows[0]), engine.submit(others[1])]
    for _ in range(4):
        engine.step()
    streams.append(engine.submit(rows[1]))
    engine.run_until_idle()
    assert engine.stats.max_rows == 4
    batched = [(log.tokens(s), drain(s)[1]) for s in (streams[1], streams[3])]

    for r, (ids, hidden), (a_ids, a_hidden), (b_ids, b_hidden) in zip(rows, expected, alone, batched):
        assert ids.shape == (r.max_new_tokens, 4)
        assert torch.equal(a_ids, ids), "alone: tokens differ from ChatTTS's _infer_code"
        assert torch.equal(b_ids, ids), "in a batch: tokens differ from ChatTTS's _infer_code"
        assert torch.allclose(a_hidden, hidden, atol=1e-4, rtol=0)
        assert torch.allclose(b_hidden, hidden, atol=1e-4, rtol=0)


def test_the_clip_is_what_changes_the_tokens(engine, clips):
    """Without its clip, or with the other clip, the same row decodes other tokens (the test
    above would pass for a row that ignored the clip only if ChatTTS ignored it too)."""
    log = TokenLog(engine)
    reqs = [clip_row(clips["short"], None, 20), clip_row(clips["long"], None, 20),
            dataclasses.replace(clip_row(clips["short"], None, 20), spk_smp=None, txt_smp=None)]
    streams = [engine.submit(r) for r in reqs]
    engine.run_until_idle()
    short, long_, none = (log.tokens(s) for s in streams)
    assert not torch.equal(short, long_) and not torch.equal(short, none)


def test_prompt_length_estimate_counts_the_clip(clips):
    from serve_app.engine.decode.scheduler import prompt_len_estimate
    from serve_app.engine.voices import sample_frames

    from ChatTTS.model import Speaker

    frames = int(Speaker.decode_prompt(clips["long"]).shape[1])
    assert sample_frames(clips["long"]) == frames > 150  # 4 s at 46.9 frames a second
    plain = seg(None, 10)
    assert prompt_len_estimate(clip_row(clips["long"], None, 10)) == prompt_len_estimate(plain) + frames + len(TRANSCRIPT)


@pytest.fixture(scope="module")
def voice_encoder(tiny_weights_config):
    from serve_app.engine.clips import load_voice_encoder
    from serve_app.engine.config import ModelConfig

    return load_voice_encoder(ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1))


def test_clip_encoder_matches_chattts_sample_audio_speaker(voice_encoder, chat):
    """The Vocoder stage's encoder (DVAE loaded on its own) gives ChatTTS's ``spk_smp``, from a
    file in any format and rate (decoded, mixed down and resampled to 24 kHz first)."""
    from serve_app.engine.clips import decode_clip

    pcm = speechlike(3.0)
    encoded = voice_encoder.encode(pcm)
    assert encoded.spk_smp == chat.sample_audio_speaker(pcm)
    assert encoded.frames == int(chat.speaker.decode_prompt(encoded.spk_smp).shape[1])
    assert not hasattr(voice_encoder.dvae, "decoder")  # only the encoder half is kept
    for data in (encode(pcm, "wav"), encode(pcm, "flac", rate=44100, channels=2), encode(pcm, "mp3")):
        decoded = decode_clip(data)
        assert abs(len(decoded) - len(pcm)) <= 1200 and np.corrcoef(decoded[:60000], pcm[:60000])[0, 1] > 0.99
        assert voice_encoder.encode_file(data).spk_smp == chat.sample_audio_speaker(decoded)


def test_seed_speaker_from_the_encoder_is_the_acoustic_stages(voice_encoder, chat):
    from serve_app.engine.voices import SpeakerSampler

    assert voice_encoder.speaker_for_seed(2222) == SpeakerSampler(chat.speaker).from_seed(2222)


def test_planner_carries_a_clip_voice_and_its_cache_id_is_its_content(tiny_planner, clips):
    from serve_app.engine.types import SynthesisOptions, Voice

    voice = Voice("mine", None, spk_smp=clips["short"], txt_smp=TRANSCRIPT)
    plan = tiny_planner.plan("第一句。第二句话。", SynthesisOptions(voice="ignored-when-given"), voice)
    assert all(s.spk_smp == clips["short"] and s.txt_smp == TRANSCRIPT and s.spk_emb is None for s in plan.segments)
    assert voice.cache_id.startswith("smp:")
    assert Voice("other-name", None, spk_smp=clips["short"], txt_smp=TRANSCRIPT).cache_id == voice.cache_id
    assert Voice("mine", None, spk_smp=clips["long"], txt_smp=TRANSCRIPT).cache_id != voice.cache_id
    assert Voice("mine", None, spk_smp=clips["short"], txt_smp="别的文字。").cache_id != voice.cache_id


# ============================================================================== API (Ray Serve)

VOICES = "/v1/audio/voices"


def unique(prefix: str) -> str:
    import uuid

    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def speech(app_url: str, voice, text: str = "你好，这是我的声音。", **extra) -> httpx.Response:
    body = {"model": "chattts", "input": text, "voice": voice, "response_format": "wav", **extra}
    return httpx.post(app_url + "/v1/audio/speech", json=body, timeout=180)


def pcm_of(resp: httpx.Response) -> np.ndarray:
    assert resp.status_code == 200, resp.text[:300]
    pcm, rate = sf.read(io.BytesIO(resp.content), dtype="int16")
    assert rate == 24000 and len(pcm) > 0
    return pcm


def create_clip_voice(app_url: str, name: str, data: bytes, transcript: str | None = TRANSCRIPT,
                      filename: str = "clip.wav") -> httpx.Response:
    form = {"name": name} if transcript is None else {"name": name, "transcript": transcript}
    return httpx.post(app_url + VOICES, data=form, files={"audio": (filename, data, "application/octet-stream")},
                      timeout=180)


def error_of(resp: httpx.Response, status: int) -> dict:
    assert resp.status_code == status, f"{resp.status_code}: {resp.text[:300]}"
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


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
    import time

    pcm = speechlike(4.0, f0=130.0, seed=3)
    t0 = time.perf_counter()
    r = create_clip_voice(app_url, unique("clip"), encode(pcm, "mp3", rate=44100, channels=2), filename="me.mp3")
    took = time.perf_counter() - t0
    assert r.status_code == 200, r.text
    voice = r.json()
    assert voice["kind"] == "clip" and 3.9 <= voice["clip_seconds"] <= 4.2
    from serve_fixtures import report

    report("voice from a 4 s mp3 clip (POST /v1/audio/voices)", f"{took * 1000:.0f} ms")
    detail = httpx.get(app_url + f"{VOICES}/{voice['id']}", timeout=30).json()
    assert detail["transcript"] == TRANSCRIPT and detail["sample"] and detail["speaker"] is None
    other = create_clip_voice(app_url, unique("clip"), encode(speechlike(4.0, f0=220.0, seed=4), "wav")).json()

    mine = pcm_of(speech(app_url, {"id": voice["id"]}, seed=5))
    theirs = pcm_of(speech(app_url, {"id": other["id"]}, seed=5))
    # Random weights: the length is the text's (pacing), the content the clip's conditioning.
    assert len(mine) == len(theirs) and not np.array_equal(mine, theirs)
    assert np.array_equal(pcm_of(speech(app_url, voice["name"], seed=5)), mine)


@pytest.mark.parametrize("case", ["undecodable", "too_short", "too_long", "silent", "no_transcript", "no_audio", "too_big"])
def test_bad_clips_are_refused_with_the_reason_and_nothing_is_stored(app_url, case):
    before = custom_ids(app_url)
    name = unique("bad")
    wav = encode(speechlike(3.0), "wav")
    if case == "no_audio":
        r = httpx.post(app_url + VOICES, data={"name": name, "transcript": TRANSCRIPT}, timeout=60)
    elif case == "too_big":  # over the upload limit (8 MiB in config/serve.yaml's default)
        r = create_clip_voice(app_url, name, b"\0" * (9 * 1024 * 1024))
    else:
        data = {"undecodable": b"definitely not audio" * 50, "too_short": encode(speechlike(1.0), "wav"),
                "too_long": encode(speechlike(31.0), "ogg"), "silent": encode(np.zeros(72000, np.float32), "wav"),
                "no_transcript": wav}[case]
        r = create_clip_voice(app_url, name, data, transcript=None if case == "no_transcript" else TRANSCRIPT)
    status, code, words = {
        "undecodable": (400, "invalid_audio", "could not decode"), "too_short": (400, "invalid_audio", "1.0 s"),
        "too_long": (400, "invalid_audio", "longer than 30 s"), "silent": (400, "invalid_audio", "silent"),
        "no_transcript": (400, "missing_transcript", "transcript"), "no_audio": (400, "missing_audio", "audio"),
        "too_big": (413, "body_too_large", "exceeds"),
    }[case]
    err = error_of(r, status)
    assert err["code"] == code and words in err["message"], err
    assert custom_ids(app_url) == before
    assert error_of(speech(app_url, name), 404)["code"] == "voice_not_found"


def test_names_ids_and_deletion(app_url):
    name = unique("dup")
    first = httpx.post(app_url + VOICES, json={"name": name, "seed": 1}, timeout=60).json()
    assert error_of(httpx.post(app_url + VOICES, json={"name": name.upper(), "seed": 2}, timeout=60), 409)["code"] == "voice_exists"
    assert error_of(httpx.post(app_url + VOICES, json={"name": "alloy", "seed": 2}, timeout=60), 400)["param"] == "name"
    assert error_of(httpx.post(app_url + VOICES, json={"name": unique("x"), "seed": 1, "speaker": "y" * 40}, timeout=60), 400)
    assert error_of(httpx.post(app_url + VOICES, json={"name": unique("x"), "speaker": "not a speaker" * 5}, timeout=60),
                    400)["param"] == "speaker"
    assert error_of(httpx.post(app_url + VOICES, content=b"{", headers={"content-type": "application/json"}, timeout=60),
                    400)["code"] == "invalid_json"
    assert error_of(httpx.delete(app_url + f"{VOICES}/alloy", timeout=30), 400)["code"] == "builtin_voice"
    r = httpx.delete(app_url + f"{VOICES}/{first['id']}", timeout=30)
    assert r.status_code == 200 and r.json() == {"id": first["id"], "object": "voice.deleted", "deleted": True}
    for path in (f"{VOICES}/{first['id']}", f"{VOICES}/voice_nope", f"{VOICES}/..%2E"):
        assert error_of(httpx.get(app_url + path, timeout=30), 404)["code"] == "voice_not_found"
    error_of(httpx.get(app_url + f"{VOICES}/..%2F..%2Fetc%2Fpasswd", timeout=30), 404)  # no such route
    assert error_of(httpx.delete(app_url + f"{VOICES}/{first['id']}", timeout=30), 404)["code"] == "voice_not_found"
    assert error_of(speech(app_url, {"id": first["id"]}), 404)["code"] == "voice_not_found"
    assert error_of(speech(app_url, name), 404)["code"] == "voice_not_found"


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
    from test_reliability import ingress_settings

    keys = tmp_path / "keys.txt"
    keys.write_text("sk-voice\n")
    security = {"api_keys_env": None, "api_keys_file": str(keys), "max_streams_per_key": 0, "cors_origins": []}
    good = {"Authorization": "Bearer sk-voice"}
    with ingress_settings(security=security):
        calls = [httpx.get(app_url + VOICES, timeout=30), httpx.get(app_url + f"{VOICES}/alloy", timeout=30),
                 httpx.post(app_url + VOICES, json={"name": unique("k"), "seed": 3}, timeout=30),
                 httpx.delete(app_url + f"{VOICES}/voice_" + "0" * 24, timeout=30)]
        listed = httpx.get(app_url + VOICES, headers=good, timeout=30)
        page = httpx.get(app_url + "/ui/", timeout=30)
    for r in calls:
        assert error_of(r, 401)["code"] == "invalid_api_key"
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
