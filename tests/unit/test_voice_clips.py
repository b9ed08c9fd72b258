"""Voices users own, in the engine (no Ray): a row carrying a reference clip (``spk_smp`` +
``txt_smp``) decodes the same tokens as ChatTTS's own ``Chat._infer_code`` given the same clip,
alone and among other rows; the Vocoder stage's clip encoder gives what
``Chat.sample_audio_speaker`` gives. Under near-greedy sampling (temperature 1e-5): ChatTTS's
top-k keeps at least 3 candidates, so ``top_k=1`` would not be greedy.

The voices API end to end: tests/serve/test_voices.py.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from support.clips import TRANSCRIPT, encode, speechlike
from support.engine import GREEDY, TokenLog, chattts_tokens, drain, fixed_chunks, seg


@pytest.fixture(scope="module")
def chat(tiny_model):
    return tiny_model.chat


@pytest.fixture(scope="module")
def clips(chat) -> dict[str, str]:
    """Two reference clips of different lengths as ChatTTS encodes them."""
    return {
        name: chat.sample_audio_speaker(speechlike(s, f0=f0, seed=i))
        for i, (name, s, f0) in enumerate([("short", 2.5, 120.0), ("long", 4.0, 210.0)])
    }


@pytest.fixture(scope="module")
def speaker(chat) -> str:
    from serve_app.engine.voices import SpeakerSampler

    return SpeakerSampler(chat.speaker).from_seed(4444)


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
    reqs = [
        clip_row(clips["short"], None, 20),
        clip_row(clips["long"], None, 20),
        dataclasses.replace(clip_row(clips["short"], None, 20), spk_smp=None, txt_smp=None),
    ]
    streams = [engine.submit(r) for r in reqs]
    engine.run_until_idle()
    short, long_, none = (log.tokens(s) for s in streams)
    assert not torch.equal(short, long_) and not torch.equal(short, none)


def test_prompt_length_estimate_counts_the_clip(clips):
    from ChatTTS.model import Speaker

    from serve_app.engine.decode.scheduler import prompt_len_estimate
    from serve_app.engine.voices import sample_frames

    frames = int(Speaker.decode_prompt(clips["long"]).shape[1])
    assert sample_frames(clips["long"]) == frames > 150  # 4 s at 46.9 frames a second
    plain = seg(None, 10)
    assert prompt_len_estimate(clip_row(clips["long"], None, 10)) == prompt_len_estimate(plain) + frames + len(
        TRANSCRIPT
    )


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


def test_clip_encoder_loads_the_dvae_at_the_first_clip(tiny_weights_config, chat):
    """``load_voice_encoder`` builds the DVAE at the first clip (lazy, the default) or at once:
    the same codes either way, and a seed's speaker needs no DVAE."""
    from serve_app.engine.clips import load_voice_encoder
    from serve_app.engine.config import ModelConfig

    cfg = ModelConfig(weights=tiny_weights_config, device="cpu", torch_threads=1)
    lazy, eager = load_voice_encoder(cfg), load_voice_encoder(cfg, lazy=False)
    assert not lazy.dvae_loaded and eager.dvae_loaded
    assert lazy.speaker_for_seed(7) == eager.speaker_for_seed(7) and not lazy.dvae_loaded
    pcm = speechlike(2.5)
    assert lazy.encode(pcm) == eager.encode(pcm) and lazy.encode(pcm).spk_smp == chat.sample_audio_speaker(pcm)
    assert lazy.dvae_loaded and lazy.dvae is lazy.dvae


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
