"""Engine unit tests: voices, pacing, the acoustic decode loop, the vocoder and the pipeline.

Real ChatTTS modules with random-tiny weights (session fixtures in conftest.py); no Ray, no mocks.
The acoustic engine is mostly driven synchronously (``submit`` + ``step``/``run_until_idle`` on
the test's thread) so that the tests control exactly when rows join, leave and are cancelled.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import subprocess
import sys
import time

import numpy as np
import pytest
import soundfile as sf
import torch
from support.audio import SR, decode_av, snr_db
from support.engine import (
    HIDDEN,
    decode_alone,
    drain,
    expected_samples,
    fixed_chunks,
    seg,
    stream_decode,
    streamed_vs_one_shot,
    synthesize,
    synthesize_sync,
)
from support.speakers import encode_speaker

from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import EngineConfig, ModelConfig, SegmentConfig, VocoderConfig
from serve_app.engine.decode.streams import HiddenChunk
from serve_app.engine.errors import EmptyInputError, EngineError, EngineOverloaded
from serve_app.engine.pacing import (
    TOKENS_PER_SECOND,
    expected_seconds,
    expected_tokens,
    max_new_tokens,
    speed_tag_level,
)
from serve_app.engine.types import SegmentRequest, SynthesisOptions
from serve_app.engine.vocoder import VocoderEngine
from serve_app.engine.voices import (
    OPENAI_VOICES,
    SpeakerSampler,
    VoiceError,
    VoiceResolver,
    decode_speaker,
    speaker_from_seed,
)
from serve_app.engine.wav import with_true_length
from serve_app.pipeline.local import LocalPipeline

TEXT = "你好，欢迎使用语音合成服务。Hello world, it is 10:30."


# ============================================================================== helpers/fixtures


@pytest.fixture(scope="module")
def speaker(tiny_model):
    return tiny_model.chat.speaker


@pytest.fixture
def engine(make_engine) -> AcousticEngine:
    return make_engine()


# ============================================================================== voices


def test_openai_voices_map_to_fixed_speakers(speaker):
    a, b = SpeakerSampler(speaker), SpeakerSampler(speaker)  # separate caches
    resolver = VoiceResolver()
    seen = {}
    for name, seed in OPENAI_VOICES.items():
        voice = resolver.resolve(name)
        assert voice == resolver.resolve(name.upper()) and voice.seed == seed and voice.name == name
        assert voice.spk_emb is None  # sampled where torch lives, not by the resolver
        emb = a.embedding(voice)
        assert emb == b.embedding(voice) == speaker_from_seed(speaker, seed)
        assert speaker._decode(emb).shape == (768,)
        seen[emb] = name
    assert len(seen) == len(OPENAI_VOICES)  # different names, different speakers
    assert resolver.resolve(None) == resolver.resolve("alloy")  # the default voice


def test_seed_voice_is_deterministic_and_leaves_global_rng_alone(speaker):
    saved = torch.get_rng_state()
    try:
        torch.manual_seed(123)
        state = torch.get_rng_state()
        first = SpeakerSampler(speaker).from_seed(42)
        assert torch.equal(state, torch.get_rng_state())  # torch's global RNG untouched
        torch.manual_seed(1)
        again = SpeakerSampler(speaker).from_seed(42)
        torch.manual_seed(999)
        third = speaker_from_seed(speaker, 42)
        assert first == again == third
        voice = VoiceResolver().resolve("seed:42")
        assert voice.seed == 42 and voice.name == "seed:42"
        assert SpeakerSampler(speaker).from_seed(43) != first
    finally:
        torch.set_rng_state(saved)


def test_speaker_string_round_trips(speaker):
    s = SpeakerSampler(speaker).from_seed(42)
    v = VoiceResolver().resolve(s)
    assert v.spk_emb == s and v.seed is None
    assert v.name.startswith("speaker:")
    vec = speaker._decode(s)
    assert vec.shape == (768,) and np.isfinite(vec).all()
    assert speaker._encode(torch.from_numpy(vec)) == s
    # The torch-free codec is ChatTTS's own format.
    assert np.array_equal(decode_speaker(s), vec) and encode_speaker(vec) == s


def test_engine_samples_a_seeded_speaker_like_an_explicit_one(make_engine, speaker):
    """A segment naming its speaker by seed decodes exactly as one carrying the sampled string."""
    by_seed = SegmentRequest(text="你好。", spk_emb=None, spk_seed=2222, seed=5, max_new_tokens=16, target_tokens=16)
    explicit = dataclasses.replace(by_seed, spk_emb=speaker_from_seed(speaker, 2222), spk_seed=None)
    engine = make_engine()
    a, b = engine.submit(by_seed), engine.submit(explicit)
    engine.run_until_idle()
    assert torch.equal(drain(a)[1], drain(b)[1])


@pytest.mark.parametrize(
    "voice, message",
    [
        ("nope", "unknown voice 'nope'"),
        ("seed:-1", "unknown voice"),
        ("seed:abc", "unknown voice"),
        ("seed:99999999999", "unknown voice"),
        ("seed:4294967295", "seed must be between 0 and 2147483647"),
        ("garbage!" * 20, "speaker string"),
        ("x" * 400, "speaker string"),
    ],
)
def test_bad_voices_raise_voice_error(voice, message):
    with pytest.raises(VoiceError, match=message) as err:
        VoiceResolver().resolve(voice)
    assert isinstance(err.value, ValueError)
    assert len(str(err.value)) < 300  # a long input is not echoed in full


# ============================================================================== pacing


def test_expected_tokens_deterministic_and_grows_with_text():
    assert TOKENS_PER_SECOND == 46.875
    texts = ["你好", "你好，世界。", "你好，世界。今天天气很好，我们出去走走吧。"]
    tokens = [expected_tokens(t) for t in texts]
    assert tokens == [expected_tokens(t) for t in texts]
    assert tokens[0] < tokens[1] < tokens[2]
    assert expected_tokens("hello") < expected_tokens("hello world, how are you today?")
    for t in texts + ["Hello world, it is ten thirty."]:
        # ~47 tokens per second of (estimated) audio
        assert abs(expected_tokens(t) - expected_seconds(t) * 46.875) <= 0.5
    # 10 CJK characters ~ 2.1 s -> ~98 tokens; one pause mark adds ~0.2 s.
    assert expected_tokens("一二三四五六七八九十") == round(10 * 0.21 * 46.875)
    assert expected_tokens("一二三四五六七八九十。") == round((10 * 0.21 + 0.2) * 46.875)
    # Faster speech, fewer tokens (two levels = twice as fast).
    assert expected_tokens(texts[2], speed_level=7) == pytest.approx(tokens[2] / 2, abs=1)


def test_max_new_tokens_bounds():
    limits = SegmentConfig()
    for text in ["你", "你好，世界。", "Hello world, it is ten thirty.", "很长的句子" * 200]:
        exp = expected_tokens(text)
        cap = max_new_tokens(text, limits)
        assert cap <= limits.max_new_token
        if exp <= limits.max_new_token:
            assert cap >= exp
    assert max_new_tokens("很长的句子" * 200, limits) == limits.max_new_token
    small = SegmentConfig(max_new_token=100, cap_slack=10)
    assert max_new_tokens("很长的句子" * 200, small) == 100


def test_speed_tag_mapping():
    assert speed_tag_level(0.25) == 1
    assert speed_tag_level(0.5) == 3
    assert speed_tag_level(1.0) == 5
    assert speed_tag_level(2.0) == 7
    assert speed_tag_level(4.0) == 9


# ============================================================================== acoustic engine


def test_rows_finish_at_own_length_with_chunk_schedule(engine, spk):
    lengths = [12, 30, 36, 61]
    streams = [engine.submit(seg(spk, n, seed=i)) for i, n in enumerate(lengths)]
    # target above the cap: the cap wins; per-request chunk sizes override the config.
    capped = engine.submit(seg(spk, 80, seed=9, max_new_tokens=25))
    custom = engine.submit(seg(spk, 20, seed=10, first_chunk_tokens=5, chunk_tokens=7))
    engine.run_until_idle()
    for n, stream in zip(lengths + [25], streams + [capped]):
        chunks, hidden = drain(stream)
        assert hidden.shape == (n, HIDDEN) and hidden.dtype == torch.float32
        sizes = [c.hidden.shape[0] for c in chunks]
        expect = [min(12, n)] + [24] * ((n - 12) // 24)
        if sum(expect) < n:
            expect.append(n - sum(expect))
        assert sizes == expect, (n, sizes)
        assert [c.index for c in chunks] == list(range(len(chunks)))
        assert [c.start_token for c in chunks] == [sum(sizes[:i]) for i in range(len(sizes))]
        assert [c.final for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert [c.finish_reason for c in chunks] == [None] * (len(chunks) - 1) + ["length"]
        assert torch.isfinite(hidden).all()
    sizes = [c.hidden.shape[0] for c in drain(custom)[0]]
    assert sizes == [5, 7, 7, 1]
    assert engine.stats.rows_finished == 6 and engine.stats.rows_failed == 0
    assert engine.running_rows == 0 and engine.waiting_rows == 0


@pytest.mark.timeout(120)
def test_buffered_kv_cache_matches_transformers_dynamic_cache(make_engine, spk):
    """The in-place KV buffers (regrown every KV_HEADROOM steps, re-packed on merge and filter),
    read by transformers' own forward through the batch's cache layers, give what the written-out
    decode step gives, and what each row gets decoded alone."""
    from serve_app.engine.decode.batch import KV_HEADROOM

    # Rows longer than the headroom, of different lengths (the batch is filtered mid-flight); the
    # middle row ends first, so the last row moves into its slot.
    reqs = [
        seg(spk, 2 * KV_HEADROOM + 20, seed=1),
        seg(spk, 30, seed=3),
        seg(spk, 90, seed=2, text="hello world"),
    ]

    def run(transformers: bool = False) -> list[torch.Tensor]:
        eng = make_engine()
        if transformers:  # transformers' forward over the batch's cache layers
            eng.decode_forward = None
        streams = [eng.submit(reqs[0])]
        for _ in range(10):
            eng.step()
        streams += [eng.submit(r) for r in reqs[1:]]  # merged into a running batch
        eng.run_until_idle()
        return [drain(s)[1] for s in streams]

    lean = run()
    stock = run(transformers=True)
    for b, s, req in zip(lean, stock, reqs):
        assert b.shape == s.shape
        assert torch.allclose(b, s, atol=1e-5, rtol=0)
        assert torch.equal(b, decode_alone(make_engine(), req))


def test_poll_drives_a_row_on_the_callers_thread(make_engine, spk):
    """``step()`` + ``poll()`` on one thread (how the benchmark times a first chunk) gives the
    chunks a blocking consumer gets, first chunk first, and nothing after the end."""
    expected = decode_alone(make_engine(), seg(spk, 40, seed=5))
    eng = make_engine(first_chunk_tokens=6, chunk_tokens=10)
    stream = eng.submit(seg(spk, 40, seed=5))
    chunks = []
    while not stream.ended:
        eng.step()
        chunks += stream.poll()
    assert [c.hidden.shape[0] for c in chunks][:1] == [6]
    assert torch.allclose(torch.cat([c.hidden for c in chunks]), expected, atol=1e-5, rtol=0)
    assert chunks[-1].final and stream.poll() == []


@pytest.mark.timeout(120)
def test_engine_thread_matches_synchronous_drive(make_engine, spk):
    reqs = [seg(spk, 40, seed=1), seg(spk, 25, seed=2, text="hello world"), seg(spk, 55, seed=3)]
    sync = make_engine()
    ss = [sync.submit(r) for r in reqs]
    sync.run_until_idle()
    expected = [drain(s)[1] for s in ss]

    threaded = make_engine()
    threaded.start()
    streams = [threaded.submit(r) for r in reqs]
    got = [drain(s)[1] for s in streams]
    for e, g in zip(expected, got):
        assert e.shape == g.shape
        assert torch.allclose(e, g, atol=1e-4, rtol=0)
    threaded.stop()
    assert threaded._thread is None
    assert threaded.running_rows == 0 and threaded.stats.rows_finished == 3


def test_lean_decode_forward_matches_transformers_forward(make_engine, speaker):
    """The written-out decode step (decode/forward.py) computes what transformers' LlamaModel
    forward computes: same tokens and hidden states for a staggered, padded batch (rows of
    different prompt lengths joining mid-flight, the KV buffers growing past their headroom)."""
    voices = SpeakerSampler(speaker)
    reqs = [
        seg(voices.from_seed(7 + i), 30 + 25 * i, seed=50 + i, text=t)
        for i, t in enumerate(["你好，欢迎使用。", "hello world, a longer prompt than the first one", "abc"])
    ]

    def run(lean: bool) -> list[torch.Tensor]:
        engine = make_engine()
        assert engine.decode_forward is not None
        if not lean:
            engine.decode_forward = None
        streams = [engine.submit(reqs[0])]
        for _ in range(4):
            engine.step()
        streams += [engine.submit(r) for r in reqs[1:]]
        engine.run_until_idle()
        return [drain(s)[1] for s in streams]

    for a, b in zip(run(True), run(False)):
        assert a.shape == b.shape
        assert torch.allclose(a, b, atol=1e-5, rtol=0), float((a - b).abs().max())


def test_seeded_rows_same_alone_and_in_a_staggered_batch(engine, tiny_model, speaker):
    voices = SpeakerSampler(speaker)
    texts = [
        "你好，欢迎使用语音合成服务。",
        "hello world",
        "今天天气很好，我们出去走走吧，顺便买点东西回来。",
        "the quick brown fox jumps over the lazy dog",
        "一二三",
        "abc",
        "测试一下批处理的正确性，看看每一行是否都和单独解码时一样。",
        "one more row here, with a longer text than most of the others in this batch",
    ]
    params = [(0.3, 0.7, 20), (0.7, 0.9, 50), (1.0, 0.5, 5), (0.1, 0.95, 100)]
    reqs = []
    for i, text in enumerate(texts):
        temperature, top_p, top_k = params[i % len(params)]
        reqs.append(
            SegmentRequest(
                text=text,
                spk_emb=voices.from_seed(100 + i) if i != 5 else None,
                seed=1000 + 17 * i,
                max_new_tokens=20 + 9 * i,
                target_tokens=20 + 9 * i,
                temperature=temperature,
                top_p=top_p,
                top_k=top_k,
                prompt=f"[speed_{3 + i % 4}]",
            )
        )
    alone = [decode_alone(engine, r) for r in reqs]
    steps_alone = engine.stats.steps

    # Rows join while others are mid-flight: 3 now, 3 after 5 steps, 2 after 7 more.
    streams = [engine.submit(r) for r in reqs[:3]]
    for _ in range(5):
        engine.step()
    streams += [engine.submit(r) for r in reqs[3:6]]
    for _ in range(7):
        engine.step()
    assert engine.running_rows == 6
    streams += [engine.submit(r) for r in reqs[6:]]
    engine.run_until_idle()
    batched = [drain(s)[1] for s in streams]
    assert engine.stats.max_rows == 8

    exact = close = 0
    max_diff = 0.0
    for i, (a, b) in enumerate(zip(alone, batched)):
        assert a.shape == b.shape == (reqs[i].target_tokens, HIDDEN)
        max_diff = max(max_diff, float((a - b).abs().max()))
        exact += bool(torch.equal(a, b))
        close += bool(torch.allclose(a, b, atol=1e-4, rtol=0))
    print(
        f"\nalone vs batched: {exact}/{len(reqs)} rows bit-identical, {close}/{len(reqs)} within atol 1e-4, "
        f"max |diff| {max_diff:.2e}; steps alone {steps_alone}, batched {engine.stats.steps - steps_alone}"
    )
    assert close == len(reqs), f"only {close}/{len(reqs)} rows match (max diff {max_diff})"
    # Decoding the same request alone again is bit-identical.
    assert torch.equal(decode_alone(engine, reqs[2]), alone[2])


def test_different_seeds_give_different_outputs(engine, spk):
    a = decode_alone(engine, seg(spk, 30, seed=1))
    b = decode_alone(engine, seg(spk, 30, seed=2))
    assert a.shape == b.shape
    # The first frame comes from the prompt (same text, same speaker); the rest from the tokens.
    assert torch.allclose(a[0], b[0], atol=1e-5)
    assert not torch.allclose(a[1:], b[1:], atol=1e-2)


def test_per_row_sampling_params(engine, spk):
    # Same text, speaker and seed: only the sampling parameters differ between the two rows.
    cold = seg(spk, 40, seed=5, temperature=0.1, top_p=0.5, top_k=3)
    hot = seg(spk, 40, seed=5, temperature=1.5, top_p=0.99, top_k=200)
    cold_alone, hot_alone = decode_alone(engine, cold), decode_alone(engine, hot)
    assert not torch.allclose(cold_alone[1:], hot_alone[1:], atol=1e-2)  # the params matter
    s_cold, s_hot = engine.submit(cold), engine.submit(hot)
    engine.run_until_idle()
    # ...and each row of one batch keeps its own.
    assert torch.allclose(drain(s_cold)[1], cold_alone, atol=1e-4, rtol=0)
    assert torch.allclose(drain(s_hot)[1], hot_alone, atol=1e-4, rtol=0)
    assert engine.stats.max_rows == 2


def test_cancel_mid_flight_stops_the_row_within_one_step(engine, spk):
    long = engine.submit(seg(spk, 2000, seed=1))
    short = [engine.submit(seg(spk, n, seed=i)) for i, n in ((2, 30), (3, 45))]
    for _ in range(5):
        engine.step()
    assert engine.running_rows == 3
    long.cancel()
    engine.step()
    assert engine.stats.rows_cancelled == 1
    assert engine.running_rows == 2
    steps_at_cancel = engine.stats.steps
    engine.run_until_idle()
    for n, s in zip((30, 45), short):
        chunks, hidden = drain(s)
        assert hidden.shape[0] == n and chunks[-1].finish_reason == "length"
    chunks, hidden = drain(long)  # the cancelled stream ends (no hang)
    assert hidden.shape[0] <= 7 and not any(c.final for c in chunks)
    assert engine.stats.steps <= 45 < 2000
    assert engine.stats.steps - steps_at_cancel <= 45
    assert engine.stats.rows_finished == 2 and engine.stats.rows_cancelled == 1
    # Cancelled while still waiting: never admitted, never decoded.
    waiting = engine.submit(seg(spk, 50, seed=4))
    waiting.cancel()
    admitted = engine.stats.rows_admitted
    engine.run_until_idle()
    assert list(waiting) == []
    assert engine.stats.rows_admitted == admitted and engine.stats.rows_cancelled == 2


def test_batch_is_released_after_a_burst(engine, spk):
    # The row with the longest prompt (and the most KV columns) leaves first: the columns past
    # the others must go with it; late rows join with shorter KV than the running ones.
    lengths = [10, 60, 33, 8, 47, 25]
    texts = ["今天天气很好，我们出去走走吧，顺便买点东西回来。", "你好。", "hello world", "一", "abc def", "好"]
    streams = [engine.submit(seg(spk, n, seed=i, text=t)) for i, (n, t) in enumerate(zip(lengths[:3], texts[:3]))]
    steps = 0
    while engine.step():
        steps += 1
        if steps == 4:
            streams += [
                engine.submit(seg(spk, n, seed=10 + i, text=t)) for i, (n, t) in enumerate(zip(lengths[3:], texts[3:]))
            ]
        if engine.running_rows:
            # KV bookkeeping: one KV row per running row, as wide as the mask, no column past the longest row.
            batch = engine.batch
            b, width = batch.mask.shape
            assert b == engine.running_rows == len(batch.pos)
            assert all(k.shape[0] == b and k.shape[2] == width for k in batch.keys + batch.values)
            assert bool(batch.mask[:, -1].any())
            # Every row's next position is its number of real tokens.
            assert torch.equal(batch.pos, batch.mask.sum(1))
    for n, s in zip(lengths, streams):
        assert drain(s)[1].shape[0] == n
    assert engine.running_rows == 0 and engine.waiting_rows == 0
    assert engine.batch.rows == [] and engine.batch.keys == [] and engine.batch.values == []
    assert engine.batch.mask is None and engine.batch.pos is None
    # Batching happened: fewer forward passes than the rows' tokens together.
    assert engine.stats.steps < sum(lengths) - len(lengths)
    assert engine.stats.max_rows >= 4
    assert engine.stats.rows_finished == len(lengths)
    assert engine.stats.mean_rows > 1.5


@pytest.mark.timeout(120)
async def test_async_iteration_with_engine_thread(make_engine, spk):
    engine = make_engine()
    reqs = [seg(spk, 30, seed=1), seg(spk, 50, seed=2), seg(spk, 41, seed=3)]
    expected = [decode_alone(engine, r) for r in reqs]
    engine.start()
    loop = asyncio.get_running_loop()
    streams = [engine.submit(r, loop=loop) for r in reqs]

    async def consume(stream):
        chunks = [c async for c in stream]
        return chunks, torch.cat([c.hidden for c in chunks])

    results = await asyncio.wait_for(asyncio.gather(*(consume(s) for s in streams)), timeout=90)
    for (chunks, hidden), exp in zip(results, expected):
        assert chunks[-1].final and chunks[-1].finish_reason == "length"
        assert torch.allclose(hidden, exp, atol=1e-4, rtol=0)
    with pytest.raises(TypeError):
        list(streams[0])  # opened for async iteration

    # A consumer that stops early (client went away) frees its row.
    stream = engine.submit(seg(spk, 3000, seed=4), loop=loop)
    agen = stream.__aiter__()
    first = await asyncio.wait_for(agen.__anext__(), timeout=30)
    assert first.index == 0
    await agen.aclose()
    deadline = loop.time() + 20
    while not (engine.stats.rows_cancelled == 1 and engine.running_rows == 0) and loop.time() < deadline:
        await asyncio.sleep(0.01)
    assert engine.stats.rows_cancelled == 1 and engine.running_rows == 0
    assert engine.stats.steps < 2000


def test_prefill_failure_fails_only_that_row(engine, spk):
    good = [engine.submit(seg(spk, 30, seed=1)), engine.submit(seg(spk, 40, seed=2))]
    for _ in range(3):
        engine.step()
    bad = engine.submit(seg("garbage" * 20, 30, seed=3))
    more = engine.submit(seg(spk, 20, seed=4))
    engine.run_until_idle()
    with pytest.raises(EngineError, match="prefill failed"):
        drain(bad)
    for n, s in zip((30, 40, 20), good + [more]):
        assert drain(s)[1].shape[0] == n
    assert engine.stats.rows_failed == 1 and engine.stats.rows_finished == 3


def test_degenerate_sampling_fails_only_that_row_and_the_loop_survives(engine, spk):
    """A temperature so small that logits overflow (found by fuzzing the HTTP API) must fail its
    own row, not the decode thread."""
    engine.start()
    good = engine.submit(seg(spk, 30, seed=1))
    bad = engine.submit(seg(spk, 30, seed=2, temperature=1e-300))
    with pytest.raises(EngineError, match="invalid probabilities"):
        drain(bad)
    assert drain(good)[1].shape[0] == 30
    after = engine.submit(seg(spk, 12, seed=3))
    assert drain(after)[1].shape[0] == 12
    assert engine._thread is not None and engine._thread.is_alive()
    assert engine.stats.rows_failed == 1


def test_admission_respects_max_rows(make_engine, spk):
    engine = make_engine(max_rows=2)
    lengths = [20, 35, 15, 28, 22]
    streams = [engine.submit(seg(spk, n, seed=i)) for i, n in enumerate(lengths)]
    while engine.step():
        assert engine.running_rows <= 2
    assert engine.stats.max_rows == 2
    for n, s in zip(lengths, streams):
        assert drain(s)[1].shape[0] == n
    assert engine.stats.rows_finished == 5


def test_priority_is_admitted_first(make_engine, spk):
    engine = make_engine(max_rows=1)
    low = engine.submit(seg(spk, 10, seed=1, priority=0))
    high = engine.submit(seg(spk, 10, seed=2, priority=5))
    engine.step()
    assert [r.stream for r in engine.batch.rows] == [high] and engine.waiting_rows == 1
    engine.run_until_idle()
    assert high.first_chunk_at < low.first_chunk_at


def test_later_segments_join_after_the_first_sends_audio(make_engine, spk):
    """submit_all: segment 0 decodes alone until its first chunk, then the rest join (in
    parallel); the tokens are those of each segment decoded alone. Window batching admits all."""
    engine = make_engine(first_chunk_tokens=6)
    reqs = [seg(spk, 30, seed=1), seg(spk, 20, seed=2, text="hello world"), seg(spk, 25, seed=3)]
    streams = engine.submit_all(reqs)
    engine.step()
    assert [r.stream for r in engine.batch.rows] == [streams[0]] and engine.waiting_rows == 2
    while streams[0].first_chunk_at is None:
        engine.step()
        assert engine.running_rows == 1
    engine.step()
    assert engine.running_rows == 3  # both joined at the next step, together
    engine.run_until_idle()
    got = [drain(s)[1] for s in streams]
    for req, hidden in zip(reqs, got):
        alone = decode_alone(make_engine(), req)
        assert hidden.shape == alone.shape and torch.allclose(hidden, alone, atol=1e-4, rtol=0)

    window = make_engine(first_chunk_tokens=6, continuous=False)
    ws = window.submit_all(reqs)
    window.step()
    assert window.running_rows == 3 and all(s.admitted_at is not None for s in ws)
    window.run_until_idle()


def test_submit_all_is_all_or_nothing_when_the_queue_is_full(make_engine, spk):
    engine = make_engine(max_queued_rows=3)
    first = engine.submit(seg(spk, 10, seed=9))
    with pytest.raises(EngineOverloaded):
        engine.submit_all([seg(spk, 10, seed=i) for i in range(3)])
    engine.run_until_idle()
    assert drain(first)[1].shape[0] == 10
    assert engine.stats.rows_admitted == 1 and engine.stats.rows_cancelled == 0  # none of them was queued


def test_queue_full_raises_engine_overloaded(make_engine, spk):
    engine = make_engine(max_queued_rows=2)
    streams = [engine.submit(seg(spk, 10, seed=i)) for i in range(2)]
    with pytest.raises(EngineOverloaded, match="queue full") as err:
        engine.submit(seg(spk, 10, seed=3))
    assert isinstance(err.value, EngineError)
    engine.run_until_idle()
    assert all(drain(s)[1].shape[0] == 10 for s in streams)
    # Room again once the queue drained.
    s = engine.submit(seg(spk, 10, seed=4))
    engine.run_until_idle()
    assert drain(s)[1].shape[0] == 10


def test_window_batching_admits_only_between_batches(make_engine, spk):
    engine = make_engine(continuous=False)
    first = [engine.submit(seg(spk, 30, seed=1)), engine.submit(seg(spk, 20, seed=2))]
    for _ in range(3):
        engine.step()
    late = engine.submit(seg(spk, 10, seed=3))
    for _ in range(3):
        engine.step()
    assert engine.running_rows == 2 and engine.waiting_rows == 1
    engine.run_until_idle()
    assert [drain(s)[1].shape[0] for s in first + [late]] == [30, 20, 10]
    assert engine.stats.admissions == 2


@pytest.mark.timeout(120)
def test_stop_ends_every_open_stream(make_engine, spk):
    engine = make_engine(max_rows=1)
    running = engine.submit(seg(spk, 3000, seed=1))
    waiting = engine.submit(seg(spk, 3000, seed=2))
    engine.start()
    next(iter(running))  # the first row is decoding; the second waits for its slot
    engine.stop()
    with pytest.raises(EngineError, match="stopped"):
        drain(running)
    with pytest.raises(EngineError, match="stopped"):
        drain(waiting)


# ============================================================================== vocoder


@pytest.fixture(scope="module")
def long_utterance(tiny_model, spk) -> list[HiddenChunk]:
    """600 tokens (12.8 s) decoded by the engine, as the chunks it streamed."""
    engine = AcousticEngine(tiny_model, fixed_chunks())
    stream = engine.submit(seg(spk, 600, seed=11, text="你好，欢迎使用语音合成服务。" * 4))
    engine.run_until_idle()
    chunks = list(stream)
    assert sum(c.hidden.shape[0] for c in chunks) == 600
    return chunks


def test_streamed_vocoder_matches_one_shot_decode(tiny_model, long_utterance):
    # Around every chunk edge too (no click where windows meet).
    r = streamed_vs_one_shot(VocoderEngine(tiny_model), long_utterance)  # default VocoderConfig
    assert r["samples"] == 512 * 600 - 256
    print(
        f"\nvocoder streamed vs one-shot: SNR {r['snr_db']:.1f} dB over {r['samples'] / SR:.1f} s "
        f"(peak {r['peak']:.3f}, worst error near a chunk edge {r['worst_edge']:.2e})"
    )
    assert r["snr_db"] >= 30.0
    assert r["worst_edge"] <= 0.03 * r["peak"]


def test_vocoder_windows_are_bounded(tiny_model, long_utterance):
    cfg = VocoderConfig()
    bound = cfg.left_context_tokens + 24 + cfg.hold_back_tokens + cfg.min_window_tokens
    sizes = {}
    for n_chunks in (6, len(long_utterance)):  # 132 tokens and 600 tokens
        vocoder = VocoderEngine(tiny_model)
        windows: list[int] = []
        vocoder.on_decode = windows.append
        chunks = long_utterance[:n_chunks]
        total = sum(c.hidden.shape[0] for c in chunks)
        y = stream_decode(vocoder, chunks)
        assert len(y) == 512 * total - 256
        sizes[total] = windows
        assert max(windows) <= bound
        # Linear work: every token is decoded a bounded number of times.
        assert sum(windows) <= 2.5 * total
    short, long = sizes.values()
    assert max(short) == max(long)  # window size does not grow with the utterance


# ============================================================================== pipeline


@pytest.fixture(scope="module")
def synth(tiny_model, tiny_weights_config):
    # Fixed chunk sizes: two syntheses of one request are then byte-identical (docs/architecture.md).
    s = LocalPipeline.from_config(
        EngineConfig(model=ModelConfig(weights=tiny_weights_config, device="cpu"), acoustic=fixed_chunks()),
        model=tiny_model,
    )
    yield s
    s.close()


@pytest.mark.timeout(180)
def test_local_pipeline_wav_length_and_determinism(synth):
    opts = SynthesisOptions(voice="alloy", seed=7)
    plan = synth.planner.plan(TEXT, opts)
    frames = expected_samples(plan)
    wav = synthesize_sync(synth, TEXT, "wav", opts)
    pcm, sr = sf.read(io.BytesIO(wav), dtype="int16")
    info = sf.info(io.BytesIO(wav))
    assert sr == SR and info.channels == 1 and info.subtype == "PCM_16"
    assert pcm.ndim == 1 and len(pcm) == frames
    assert len(wav) == 44 + 2 * frames
    assert np.abs(pcm).max() > 0
    assert synthesize_sync(synth, TEXT, "wav", opts) == wav  # same text + voice + seed: same bytes
    other = synthesize_sync(synth, TEXT, "wav", SynthesisOptions(voice="alloy", seed=8))
    assert len(other) == len(wav) and other != wav
    other_voice = synthesize_sync(synth, TEXT, "wav", SynthesisOptions(voice="echo", seed=7))
    assert other_voice != wav


@pytest.mark.timeout(240)
def test_the_same_tokens_are_the_same_bytes_whatever_the_chunks(tiny_model, tiny_weights_config):
    """The vocoder's windows fall where the tokens put them: the shipped 12-then-24 chunks, chunks
    of 5 tokens and a whole segment in one chunk (bulk's) give the same file, bit for bit."""
    opts = SynthesisOptions(voice="alloy", seed=7)
    files = []
    for first, size in ((12, 24), (5, 5), (1 << 16, 1 << 16)):
        acoustic = fixed_chunks(first_chunk_tokens=first, chunk_tokens=size)
        local = LocalPipeline.from_config(
            EngineConfig(model=ModelConfig(weights=tiny_weights_config, device="cpu"), acoustic=acoustic),
            model=tiny_model,
        )
        try:
            files.append(synthesize_sync(local, TEXT, "wav", opts))
        finally:
            local.close()
    assert files[0] == files[1] == files[2]


@pytest.mark.timeout(180)
def test_multi_segment_audio_is_each_segment_in_order(tiny_model, tiny_weights_config):
    cfg = EngineConfig(
        model=ModelConfig(weights=tiny_weights_config, device="cpu"), segments=SegmentConfig(max_chars=24)
    )
    synth = LocalPipeline.from_config(cfg, model=tiny_model)
    text = "今天天气很好。我们出去走走吧。Hello world, it is 10:30."
    opts = SynthesisOptions(voice="echo", seed=3)
    plan = synth.planner.plan(text, opts)
    assert len(plan.segments) >= 3
    assert len({r.seed for r in plan.segments}) == len(plan.segments)  # each segment its own seed
    try:
        wav = synthesize_sync(synth, text, "wav", opts)  # the segments decode as parallel rows
    finally:
        synth.close()
    assert synth.engine.stats.max_rows >= 2
    pcm, sr = sf.read(io.BytesIO(wav), dtype="float32")
    assert sr == SR and len(pcm) == expected_samples(plan)
    # Segment k of the response is the one-shot decode of segment k's hidden states, in order.
    engine, vocoder = AcousticEngine(tiny_model, fixed_chunks()), VocoderEngine(tiny_model)
    ref = np.concatenate([vocoder.decode(decode_alone(engine, r)) for r in plan.segments])
    assert len(ref) == len(pcm)
    assert snr_db(ref, pcm) >= 30.0


@pytest.mark.timeout(120)
async def test_local_pipeline_stream_matches_whole_file(synth):
    opts = SynthesisOptions(voice="nova", seed=3)
    text = "你好，世界。"
    whole = await synthesize(synth, text, "wav", opts)
    plan = await synth.plan(text, opts)
    async with synth.audio(plan, "wav") as items:
        parts = [b async for b in items if isinstance(b, bytes)]
    assert with_true_length(b"".join(parts)) == whole  # the whole file says its length; a stream cannot


@pytest.mark.parametrize(
    "text", ["", "   ", "。。！？", "……，，", "[uv_break]，。"], ids=["empty", "spaces", "punct", "ellipsis", "tag"]
)
def test_empty_input_raises(synth, text):
    with pytest.raises(EmptyInputError):
        synthesize_sync(synth, text, "wav", SynthesisOptions())
    assert synth.engine.waiting_rows == 0 and synth.engine.running_rows == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fmt", ["mp3", "opus", "aac", "flac", "wav", "pcm"])
def test_every_response_format_decodes(synth, fmt):
    text = "你好，世界。"
    opts = SynthesisOptions(voice="alloy", seed=1)
    seconds = expected_samples(synth.planner.plan(text, opts)) / SR
    data = synthesize_sync(synth, text, fmt, opts)
    assert data
    samples, rate = decode_av(data, fmt)  # mono, or it fails
    n = samples.shape[1]
    if fmt in ("wav", "flac", "pcm"):
        assert rate == SR and n == round(seconds * SR)
    else:  # codec priming/padding adds at most ~0.1 s
        assert seconds - 0.01 <= n / rate <= seconds + 0.1, (fmt, n, rate, seconds)


def test_engine_modules_do_not_import_ray():
    code = (
        "import sys\n"
        "import serve_app.engine.assembly, serve_app.engine.weights.loading, serve_app.engine.acoustic\n"
        "import serve_app.engine.vocoder, serve_app.engine.voices, serve_app.engine.pacing\n"
        "import chattts_serve.cli\n"
        "bad = sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_row_whose_consumer_falls_behind_is_parked_and_resumes_where_it_left_off(make_engine, spk):
    """Back-pressure: a row whose consumer leaves ``max_stream_chunks`` chunks unread leaves the
    batch with its KV (the others decode on), and comes back once half of them are read; its
    hidden states are those of an undisturbed decode, and its backlog never passed the limit."""
    long_req, other_req = seg(spk, 200, seed=5), seg(spk, 150, seed=6)
    expected = decode_alone(make_engine(), long_req)
    expected_other = decode_alone(make_engine(), other_req)

    eng = make_engine(max_stream_chunks=3, first_chunk_tokens=8, chunk_tokens=8)
    eng.start()
    slow = eng.submit(long_req)
    other = eng.submit(other_req)
    deadline = time.monotonic() + 60
    while eng.stats.rows_parked == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert eng.stats.rows_parked >= 1 and slow.backlog == 3  # parked at the limit, nothing more sent
    # The other row decodes on, read by its own consumer, while the slow one waits.
    assert torch.allclose(drain(other)[1], expected_other, atol=1e-5, rtol=0)
    assert slow.backlog == 3
    got, most = [], 0
    for chunk in slow:  # now read slowly: the row parks and resumes as its reader goes
        got.append(chunk.hidden)
        time.sleep(0.01)  # the engine runs ahead meanwhile, as far as the limit lets it
        most = max(most, slow.backlog)
    assert most <= 3 and eng.stats.rows_resumed >= 1 and eng.parked_rows == 0
    assert torch.allclose(torch.cat(got), expected, atol=1e-5, rtol=0)


def test_a_parked_row_whose_consumer_leaves_ends_and_frees_everything(make_engine, spk):
    eng = make_engine(max_stream_chunks=2, first_chunk_tokens=8, chunk_tokens=8)
    eng.start()
    stream = eng.submit(seg(spk, 120, seed=7))
    deadline = time.monotonic() + 60
    while eng.parked_rows == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert eng.parked_rows == 1 and eng.running_rows == 0
    stream.cancel()
    while eng.parked_rows and time.monotonic() < deadline:
        time.sleep(0.01)
    assert eng.parked_rows == 0 and eng.stats.rows_cancelled == 1 and stream.ended


def test_a_requests_later_segments_wait_while_its_reader_is_behind(make_engine, spk):
    """Back-pressure over a whole request: its segments are read in order, so a reader that stops
    shows on the segment it reads, and the later segments then stop joining or park; each row
    alone (a few chunks) would never reach the limit. Nothing is lost once the reader goes on."""
    reqs = [seg(spk, 80, seed=20 + i) for i in range(12)]  # 10 chunks of 8 each, 120 in all
    expected = [decode_alone(make_engine(), r) for r in reqs]
    eng = make_engine(max_stream_chunks=6, first_chunk_tokens=8, chunk_tokens=8)
    eng.start()
    streams = eng.submit_all(reqs)
    group = streams[0].group
    assert group is not None and all(s.group is group for s in streams)
    first = next(iter(streams[0]))  # the reader takes one chunk, then stops
    deadline = time.monotonic() + 60
    while (eng.running_rows or not group.backlog) and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    held = group.backlog
    # The limit, and at most a chunk or two of each row running when the reader fell behind.
    assert 6 <= held <= 6 + 2 * len(reqs), held
    assert sum(s.sent_chunks for s in streams) < 60  # far from the request's 120 chunks
    got = [[first.hidden]] + [[] for _ in reqs[1:]]
    for i, s in enumerate(streams):
        for chunk in s:
            got[i].append(chunk.hidden)
    for g, want in zip(got, expected):
        assert torch.allclose(torch.cat(g), want, atol=1e-5, rtol=0)
    assert eng.parked_rows == 0 and eng.waiting_rows == 0
