"""Batch invariance: a row decodes the same hidden states (bit for bit), hence the same tokens,
alone and beside any other rows, in the precisions the CPU serves (int8, the default, and
float32), on the deep test model (``random-deep``: ChatTTS's 20 GPT layers and head layout).

The schedules are searched, not sampled by hand (hypothesis, seeded and bounded): rows of
different prompt lengths arriving at different steps, of different lengths (past the KV
buffers' re-growth), cancelled mid-flight, with priorities and sampling parameters of their own.
Parked rows (a reader that stops and resumes; the deadline rule setting a row aside for a more
urgent one) have their own tests. Why it holds (and what broke
it before): serve_app/engine/decode/batch.py, linear.py, sampling.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.engine import GREEDY, TokenLog, chattts_tokens, drain, fixed_chunks, seg

from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.decode.batch import KV_HEADROOM

TEXTS = [
    "你好。",
    "今天天气很好，我们出去走走吧。",
    "hello world",
    "一二三四五六七八九十，百千万亿。",
    "Batching changes speed.",
]


@pytest.fixture(scope="session")
def deep_models(chattts_cache_dir):
    """The deep test model loaded in each CPU precision (one torch thread, like the tiny model)."""
    from serve_app.engine.config import ModelConfig, WeightsConfig
    from serve_app.engine.weights.loading import load_model

    weights = WeightsConfig(source="random-deep", cache_dir=str(chattts_cache_dir))
    return {
        q: load_model(ModelConfig(weights=weights, device="cpu", torch_threads=1, quantize=q)) for q in ("int8", "none")
    }


@pytest.fixture(scope="session")
def deep_speaker(deep_models) -> str:
    from serve_app.engine.voices import OPENAI_VOICES, speaker_from_seed

    return speaker_from_seed(deep_models["int8"].chat.speaker, OPENAI_VOICES["alloy"])


def engine_for(model, **cfg) -> AcousticEngine:
    return AcousticEngine(model, fixed_chunks(max_rows=8, **cfg))


def alone(model, req) -> torch.Tensor:
    eng = engine_for(model)
    stream = eng.submit(req)
    eng.run_until_idle()
    return drain(stream)[1]


# One row of a schedule: (text, tokens, arrival step, seed, priority, top_k, temperature, cancel after steps or None)
ROW = st.tuples(
    st.sampled_from(range(len(TEXTS))),
    st.integers(4, 24),
    st.integers(0, 12),
    st.integers(0, 2**31 - 1),
    st.integers(-1, 1),
    st.sampled_from([1, 3, 20, 625]),
    st.sampled_from([1e-5, 0.3, 0.7]),
    st.one_of(st.none(), st.integers(1, 10)),
)


def run_schedule(model, spk, rows) -> list[tuple[object, torch.Tensor]]:
    """Submit each row at its arrival step, cancel those due, run to the end; each row's request
    and the hidden states it streamed."""
    eng = engine_for(model)
    reqs = [
        seg(spk, n, seed=seed, text=TEXTS[t], priority=prio, top_k=top_k, temperature=temp)
        for t, n, _, seed, prio, top_k, temp, _ in rows
    ]
    streams: dict[int, object] = {}
    step = 0
    while len(streams) < len(rows) or eng.running_rows or eng.waiting_rows:
        for i, row in enumerate(rows):
            if row[2] == step and i not in streams:
                streams[i] = eng.submit(reqs[i])
            cancel = row[7]
            if cancel is not None and i in streams and step == row[2] + cancel:
                streams[i].cancel()
        eng.step()
        step += 1
        assert step < 2000
    return [(reqs[i], drain(streams[i])[1]) for i in range(len(rows))]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("precision", ["int8", "none"])
@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(rows=st.lists(ROW, min_size=2, max_size=5))
def test_every_row_decodes_as_it_does_alone(deep_models, deep_speaker, precision, rows):
    model = deep_models[precision]
    for req, hidden in run_schedule(model, deep_speaker, rows):
        solo = alone(model, req)
        # A cancelled row streamed a prefix of its solo decode; the others all of it.
        assert hidden.shape[0] <= solo.shape[0]
        assert torch.equal(hidden, solo[: hidden.shape[0]]), (precision, req.text, req.max_new_tokens)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("precision", ["int8", "none"])
def test_a_long_row_joined_by_longer_prompts_past_the_buffers_regrowth(deep_models, deep_speaker, precision):
    """The case that broke under int8: a row decoding when rows with longer prompts join (its
    keys used to shift right), running past the KV headroom (buffers re-allocated) while rows
    leave (the batch compacted)."""
    model = deep_models[precision]
    first = seg(deep_speaker, KV_HEADROOM + 30, seed=11, text="你好。")
    later = [
        seg(deep_speaker, 12, seed=12, text="一二三四五六七八九十，百千万亿。今天天气很好，我们出去走走吧。"),
        seg(deep_speaker, 40, seed=13, text="Batching changes speed, never the speech."),
    ]
    eng = engine_for(model)
    streams = [eng.submit(first)]
    for _ in range(5):
        eng.step()
    streams += [eng.submit(r) for r in later]
    eng.run_until_idle()
    assert eng.stats.max_rows == 3
    for req, stream in zip([first, *later], streams):
        assert torch.equal(drain(stream)[1], alone(model, req)), (precision, req.text)


@pytest.mark.timeout(300)
def test_parked_rows_resume_exactly_where_they_left(deep_models, deep_speaker):
    """A reader that stops (its row parks with its KV) and resumes: the row's hidden states are
    still its solo decode, and so are the rows that ran while it was out."""
    model = deep_models["int8"]
    reqs = [seg(deep_speaker, 48, seed=21, text=TEXTS[i]) for i in (1, 2, 3)]
    expected = [alone(model, r) for r in reqs]
    eng = engine_for(model, max_stream_chunks=2, first_chunk_tokens=4, chunk_tokens=4)
    eng.start()
    try:
        streams = [eng.submit(r) for r in reqs]
        got = [drain(s)[1] for s in streams[1:]]  # read at once
        import time

        deadline = time.monotonic() + 60
        while eng.stats.rows_parked == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # the unread row parks once two chunks wait
        got.insert(0, drain(streams[0])[1])  # then read: it resumes
    finally:
        eng.stop()
    assert eng.stats.rows_parked >= 1 and eng.stats.rows_resumed >= 1
    for g, e in zip(got, expected):
        assert torch.equal(g, e)


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.timeout(300)
def test_rows_the_deadline_rule_parks_and_resumes_decode_as_alone(deep_models, deep_speaker):
    """The deadline rule (decode/deadline.py) on the shipped CPU precision: two real-time streams
    share one slot beside a job (a row without a listener, owed its slot at once), on an injected
    clock that runs slower than a running row's audio and faster than it for the one waiting: each
    is parked (its KV set aside) whenever the other needs the slot and it is far enough ahead, and
    resumed where it left off, several times. Every row streams its solo decode, bit for bit."""
    model = deep_models["int8"]
    reqs = [
        seg(deep_speaker, 48, seed=41, text=TEXTS[1], realtime=True),
        seg(deep_speaker, 48, seed=42, text=TEXTS[2], realtime=True, client="B"),
        seg(deep_speaker, 100, seed=43, text=TEXTS[3], client="jobs"),  # beside them all along
    ]
    expected = [alone(model, r) for r in reqs]
    clock = _Clock()
    cfg = dict(max_rows=2, reserved_rows=0, first_chunk_tokens=4, chunk_tokens=4, prebuffer_s=0.0)
    eng = AcousticEngine(
        model, fixed_chunks(**cfg, park_ahead_s=0.15, resume_ahead_s=0.05, background_wait_s=0.0), clock=clock
    )
    streams = [eng.submit(r) for r in reqs]
    while eng.step():
        clock.t += 0.01  # a running row gains 11 ms of slack a step, a waiting one loses 10 ms
    assert eng.stats.deadline_parked >= 4 and eng.stats.deadline_resumed == eng.stats.deadline_parked
    assert eng.stats.max_rows == 2, eng.stats
    for req, stream, want in zip(reqs, streams, expected):
        assert torch.equal(drain(stream)[1], want), req.text


@pytest.mark.timeout(300)
@pytest.mark.parametrize("precision", ["int8", "none"])
def test_rows_decode_chattts_own_tokens_alone_and_batched(deep_models, deep_speaker, precision):
    """Near-greedy, each row's tokens and hidden states are the ones ChatTTS's own
    ``Chat._infer_code`` decodes for it on the same loaded model (same int8 layers), bit for bit,
    alone and joined mid-flight by other rows."""
    model = deep_models[precision]
    rows = [
        seg(deep_speaker, 30, seed=31, text="今天天气很好，我们出去走走吧。", temperature=GREEDY),
        seg(deep_speaker, 24, seed=32, text="hello world", temperature=GREEDY),
    ]
    reference = [chattts_tokens(model.chat, r) for r in rows]
    expected = [tokens for tokens, _ in reference]
    eng = engine_for(model)
    log = TokenLog(eng)
    for r, want in zip(rows, expected):
        stream = eng.submit(r)
        eng.run_until_idle()
        hidden = drain(stream)[1]
        assert torch.equal(log.tokens(stream), want), (precision, "alone", r.text)
        # On CPU the very arithmetic: each row attends over exactly its own keys, as ChatTTS does.
        assert torch.equal(hidden, reference[rows.index(r)][1]), (precision, "alone", r.text)
    others = [seg(deep_speaker, 40, seed=33, temperature=0.7, text=TEXTS[3]), seg(deep_speaker, 20, seed=34)]
    streams = [eng.submit(others[0])]
    for _ in range(3):
        eng.step()
    streams += [eng.submit(rows[0]), eng.submit(others[1])]
    for _ in range(4):
        eng.step()
    streams.append(eng.submit(rows[1]))
    eng.run_until_idle()
    assert eng.stats.max_rows == 4
    for stream, (want, hidden), r in zip((streams[1], streams[3]), reference, rows):
        assert torch.equal(drain(stream)[1], hidden), (precision, "batched", r.text)
        assert torch.equal(log.tokens(stream), want), (precision, "batched", r.text)
