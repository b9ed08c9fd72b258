"""The decode loop's parts on their own (serve_app/engine/decode/): the scheduler without a model,
the batch state on small tensors, streams and rows; the sampler and the failure path on the
random-tiny model."""

from __future__ import annotations

import asyncio
import random

import pytest
import torch
from support.engine import fixed_chunks, seg
from support.report import report
from transformers import LlamaConfig

from serve_app.engine.acoustic import AcousticEngine
from serve_app.engine.config import AcousticConfig
from serve_app.engine.decode.batch import KV_HEADROOM, BatchState, Prefilled, aligned
from serve_app.engine.decode.cuda_graph import BUCKETS, GraphRunner, buckets_for
from serve_app.engine.decode.row import Row
from serve_app.engine.decode.sampling import Sampler, SamplingState, uniforms
from serve_app.engine.decode.scheduler import AGING_SECONDS, Scheduler, prompt_len_estimate
from serve_app.engine.decode.streams import HiddenChunk, RowStream
from serve_app.engine.errors import EngineError, EngineOverloaded
from serve_app.engine.types import SegmentRequest


def make_row(
    seq: int, priority: int = 0, max_new: int = 10, text: str = "abc", submitted_at: float = 0.0, after=None
) -> Row:
    req = SegmentRequest(text=text, spk_emb=None, seed=seq, max_new_tokens=max_new, priority=priority)
    stream = RowStream(seq, None)
    stream.submitted_at = submitted_at
    return Row(req=req, stream=stream, after=after)


# ============================================================================== scheduler


def queue(*rows: Row) -> Scheduler:
    s = Scheduler()
    for r in rows:
        s.push(r, r.stream.row_id, max_queued=100)
    return s


def ids(rows: list[Row]) -> list[int]:
    return [r.stream.row_id for r in rows]


def test_scheduler_orders_by_priority_then_arrival_within_max_rows():
    s = queue(make_row(0), make_row(1, priority=3), make_row(2), make_row(3, priority=3))
    assert ids(s.pop_admissible([], AcousticConfig(max_rows=3), now=0.0)) == [1, 3, 0]
    assert len(s) == 1
    running = [make_row(9)] * 3
    assert s.pop_admissible(running, AcousticConfig(max_rows=3), now=0.0) == []  # no free slot
    assert ids(s.pop_admissible(running[:2], AcousticConfig(max_rows=3), now=0.0)) == [2]
    assert len(s) == 0


def test_scheduler_aging_lets_an_old_low_priority_row_overtake():
    cfg = AcousticConfig(max_rows=1)
    new = make_row(1, priority=2, submitted_at=10.0)
    # At t=10, a row that has waited more than 2 aging periods outranks priority 2 ...
    old = make_row(0, priority=0, submitted_at=10.0 - 2.5 * AGING_SECONDS)
    assert ids(queue(old, new).pop_admissible([], cfg, now=10.0)) == [0]
    # ... one that has waited less does not.
    young = make_row(0, priority=0, submitted_at=10.0 - 1.5 * AGING_SECONDS)
    assert ids(queue(young, new).pop_admissible([], cfg, now=10.0)) == [1]


def test_scheduler_token_budget_keeps_order_and_admits_one_row_into_an_empty_batch():
    big, small = make_row(0, max_new=500), make_row(1, max_new=10)
    need_big = prompt_len_estimate(big.req) + 500
    cfg = AcousticConfig(token_budget=need_big - 1)
    running = make_row(9, max_new=1)
    running.prompt_len = 1
    # A running row exists and the big row does not fit: the small one must not overtake it.
    s = queue(big, small)
    assert s.pop_admissible([running], cfg, now=0.0) == [] and len(s) == 2
    # An empty batch always takes its first row (else a big row would wait forever) ...
    assert ids(s.pop_admissible([], cfg, now=0.0)) == [0]
    # ... and then stops at the budget.
    s = queue(make_row(2, max_new=500), make_row(3, max_new=500))
    assert ids(s.pop_admissible([], cfg, now=0.0)) == [2]


def test_scheduler_later_segments_wait_for_the_first_to_start_and_cancelled_rows_come_out():
    first = make_row(0)
    later = make_row(1, after=first.stream)
    gone = make_row(2)
    gone.stream.cancel()
    s = queue(later, gone)
    assert ids(s.pop_admissible([], AcousticConfig(), now=0.0)) == [2]  # handed back to be ended
    assert ids(s.pop_admissible([], AcousticConfig(continuous=False), now=0.0)) == [1]  # window: no wait
    s = queue(make_row(3, after=first.stream))
    assert s.pop_admissible([], AcousticConfig(), now=0.0) == []
    first.stream.send(HiddenChunk(torch.zeros(1, 4), 0, 0))
    assert ids(s.pop_admissible([], AcousticConfig(), now=0.0)) == [3]


def test_scheduler_window_mode_and_queue_limit():
    s = queue(make_row(0))
    assert s.pop_admissible([make_row(9)], AcousticConfig(continuous=False), now=0.0) == []
    with pytest.raises(EngineOverloaded, match="queue full"):
        s.push(make_row(1), 1, max_queued=1)
    assert ids(s.drain()) == [0] and len(s) == 0


# ============================================================================== batch state

H, D, LAYERS = 2, 3, 2


@pytest.fixture
def batch() -> BatchState:
    cfg = LlamaConfig(
        num_hidden_layers=LAYERS, hidden_size=H * D, num_attention_heads=H, intermediate_size=8, vocab_size=8
    )
    return BatchState(cfg, torch.device("cpu"))


class Model:
    """The reference: each row's real KV columns as a plain list, per layer (what the padded,
    compacted buffers must always hold)."""

    def __init__(self):
        self.kv: dict[int, list[list[torch.Tensor]]] = {}  # row id -> per layer (H, n, D) keys

    def prefill(self, rid: int, n: int) -> Prefilled:
        keys = [torch.randn(1, H, n, D) for _ in range(LAYERS)]
        self.kv[rid] = [k[0] for k in keys]
        row = make_row(rid)
        return Prefilled(row, keys, [k + 100 for k in keys], torch.zeros(1))

    def step(self, batch: BatchState) -> None:
        mask = batch.open_step()
        cache = batch.cache()
        new = [torch.randn(len(batch.rows), H, 1, D) for _ in range(LAYERS)]
        for layer, k in enumerate(new):
            cache.layers[layer].update(k, k + 100)
            for i, row in enumerate(batch.rows):
                rid = row.stream.row_id
                self.kv[rid][layer] = torch.cat([self.kv[rid][layer], k[i]], 1)
        assert mask.shape == (len(batch.rows), aligned(batch.width + 1))
        batch.close_step([layer.kbuf for layer in cache.layers], [layer.vbuf for layer in cache.layers])

    def check(self, batch: BatchState) -> None:
        if not batch.rows:
            assert batch.mask is None and batch.keys == [] and batch.pos is None
            return
        b, t = batch.mask.shape
        assert t == int(batch.pos.max())  # no column past the longest row
        assert torch.equal(batch.pos, batch.mask.sum(1))
        for layer in range(LAYERS):
            k, v = batch.keys[layer], batch.values[layer]
            assert k.shape == (b, H, t, D) and v.shape == (b, H, t, D)
            # What attention may read past the columns in use is finite (masked, times zero).
            assert bool(torch.isfinite(batch.kbuf[layer]).all() and torch.isfinite(batch.vbuf[layer]).all())
            for i, row in enumerate(batch.rows):
                real = self.kv[row.stream.row_id][layer]
                n = real.shape[1]
                # Left-aligned: the real tokens are the row's first n columns.
                assert torch.equal(batch.mask[i], torch.arange(t) < n)
                assert torch.equal(k[i][:, :n], real) and torch.equal(v[i][:, :n], real + 100)


def test_lean_forward_reads_and_writes_each_layers_own_kv():
    """The written-out decode step (decode/forward.py) against transformers' LlamaModel on a
    2-layer model (the test weights' GPT has one layer): rows of different prompt lengths, several
    steps, each layer's keys and values its own (a layer reading another's would show here)."""
    from types import SimpleNamespace

    from transformers import LlamaModel
    from transformers.cache_utils import DynamicCache

    from serve_app.engine.decode.forward import DecodeForward

    torch.manual_seed(0)
    cfg = LlamaConfig(
        num_hidden_layers=2,
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=2,
        intermediate_size=32,
        vocab_size=8,
        max_position_embeddings=64,
    )
    cfg._attn_implementation = "sdpa"
    gpt = LlamaModel(cfg).eval()
    lean = DecodeForward(gpt, SimpleNamespace(emb_code=[torch.nn.Embedding(5, 16) for _ in range(4)]))
    refs, prefilled = [], []
    with torch.no_grad():
        for i, n in enumerate((5, 3, 8)):
            cache = DynamicCache(config=cfg)
            gpt(inputs_embeds=torch.randn(1, n, 16), past_key_values=cache, use_cache=True)
            refs.append(cache)
            prefilled.append(
                Prefilled(
                    make_row(i),
                    [layer.keys.clone() for layer in cache.layers],
                    [layer.values.clone() for layer in cache.layers],
                    torch.zeros(1),
                )
            )
        batch = BatchState(cfg, torch.device("cpu"))
        batch.merge(prefilled)
        for _ in range(KV_HEADROOM + 2):  # past a re-growth of the buffers
            emb = lean.embed(torch.randint(0, 5, (3, 4)))
            out = lean(batch, emb)
            for i, cache in enumerate(refs):
                ref = gpt(inputs_embeds=emb[i : i + 1, None], past_key_values=cache, use_cache=True).last_hidden_state
                assert torch.allclose(out[i], ref[0, -1], atol=1e-5), i


def test_batch_merge_step_and_retire_keep_every_rows_kv(batch):
    """Random merges, steps (past buffer re-growth) and retirements: the batch always holds each
    row's own KV, left-aligned, with the mask, positions and trimmed columns consistent."""
    rng = random.Random(0)
    torch.manual_seed(0)
    model = Model()
    next_id = 0
    for _ in range(120):
        op = rng.random()
        if op < 0.15 or not batch.rows:
            k = rng.randint(1, 3)
            batch.merge([model.prefill(next_id + j, rng.randint(1, 20)) for j in range(k)])
            next_id += k
        elif op < 0.3:
            keep = sorted(rng.sample(range(len(batch.rows)), rng.randint(0, len(batch.rows))))
            batch.retire(keep)
        else:
            model.step(batch)
        model.check(batch)
    assert next_id > 10


def test_batch_retire_moves_rows_from_the_end_into_holes_and_cuts_padding(batch):
    model = Model()
    batch.merge([model.prefill(0, 30), model.prefill(1, 5), model.prefill(2, 8), model.prefill(3, 6)])
    for _ in range(KV_HEADROOM + 3):  # one re-allocation of the buffers
        model.step(batch)
    model.check(batch)
    storage = batch.kbuf[0].untyped_storage().data_ptr()
    batch.retire([1, 2, 3])  # the longest row leaves: the columns past the others go with it
    assert [r.stream.row_id for r in batch.rows] == [3, 1, 2]  # the last row took slot 0
    assert batch.width == 8 + KV_HEADROOM + 3
    assert batch.kbuf[0].untyped_storage().data_ptr() == storage  # in place, no re-allocation
    model.check(batch)
    batch.retire([0, 1, 2])  # nothing leaves: nothing changes
    model.check(batch)
    batch.retire([])
    model.check(batch)


def test_batch_merge_is_all_or_nothing(batch):
    model = Model()
    batch.merge([model.prefill(0, 4)])
    bad = model.prefill(1, 3)
    bad.keys[1] = torch.randn(1, H + 1, 3, D)  # a layer of the wrong shape
    with pytest.raises(RuntimeError):
        batch.merge([model.prefill(2, 6), bad])
    del model.kv[2]
    assert [r.stream.row_id for r in batch.rows] == [0]
    model.check(batch)


def test_batch_kv_is_never_held_twice(batch, monkeypatch):
    """A merge packs one layer's buffer at a time and drops the old one at once, and a step that
    re-grows the buffers drops each layer's old one as it writes: while a buffer is being built,
    the layers already done hold no old buffer (a whole second copy of the KV was the peak)."""
    import weakref

    from serve_app.engine.decode import batch as batch_mod

    model = Model()
    batch.merge([model.prefill(0, 5), model.prefill(1, 9)])

    def olds() -> list:
        return [weakref.ref(t) for t in (*batch.kbuf, *batch.vbuf, *batch.keys, *batch.values)]

    def alive(refs: list) -> int:
        return sum(r() is not None for r in refs)

    before = olds()
    seen: list[int] = []
    real_pack = batch_mod.pack_rows

    def pack(rows, t):
        seen.append(alive(before))
        return real_pack(rows, t)

    monkeypatch.setattr(batch_mod, "pack_rows", pack)
    batch.merge([model.prefill(2, 4)])
    model.check(batch)
    # 2 buffers (keys, values) per layer; each packed one frees its buffer and its view.
    assert seen == [4 * LAYERS - 2 * i for i in range(2 * LAYERS)]
    assert alive(before) == 0
    # Steps up to the re-allocation: each layer's old buffers go before the next layer grows, on
    # transformers' cache layers (``cache``) and on the decode forward's path (``write_column``).
    real_grow = batch_mod.with_capacity
    grown: list[int] = []

    def grow(x, t, span):
        grown.append(alive(before))
        return real_grow(x, t, span)

    def steps_left() -> int:
        """Steps until the next one needs more columns than the buffers have."""
        return sum(1 for t in range(batch.width, batch.kbuf[0].shape[2]) if aligned(t + 1) <= batch.kbuf[0].shape[2])

    monkeypatch.setattr(batch_mod, "with_capacity", grow)
    for _ in range(steps_left()):
        model.step(batch)
    assert grown == []
    before = olds()
    model.step(batch)
    model.check(batch)
    assert grown == [4 * LAYERS - 4 * (i // 2) for i in range(2 * LAYERS)] and alive(before) == 0
    grown.clear()
    for _ in range(steps_left()):
        model.step(batch)
    before = olds()
    batch.open_step()
    t = batch.width
    pos = batch.pos.clone()
    new = [batch.write_column(i, torch.ones(3, H, 1, D), torch.ones(3, H, 1, D)) for i in range(LAYERS)]
    batch.close_step([k for k, _ in new], [v for _, v in new])
    assert grown == [4 * LAYERS - 4 * (i // 2) for i in range(2 * LAYERS)] and alive(before) == 0
    assert batch.width == t + 1
    assert all(bool(k[torch.arange(3), :, pos].eq(1).all()) for k in batch.keys)


# ============================================================================== streams and rows


def test_stream_producer_api():
    s = RowStream(0, None)
    assert not s.started
    s.send(HiddenChunk(torch.ones(2, 4), 0, 0))
    assert s.started and s.first_chunk_at is not None and not s.ended
    s.send(HiddenChunk(torch.ones(1, 4), 1, 2, final=True, finish_reason="length"))
    assert s.ended and s.finished_at is not None
    s.fail(EngineError("late"))  # after the end: ignored
    s.send(HiddenChunk(torch.ones(1, 4), 2, 3))
    assert [c.index for c in s] == [0, 1]

    failed = RowStream(1, None)
    failed.send(HiddenChunk(torch.ones(1, 4), 0, 0))
    failed.fail(EngineError("boom"))
    assert failed.ended and failed.finished_at is None
    with pytest.raises(EngineError, match="boom"):
        failed.poll()

    cancelled = RowStream(2, None)
    cancelled.finish()
    assert cancelled.ended and list(cancelled) == [] and cancelled.finished_at is None


async def test_async_stream_gets_what_the_producer_sends_from_another_thread():
    loop = asyncio.get_running_loop()
    s = RowStream(0, loop)

    def produce():
        for i in range(3):
            s.send(HiddenChunk(torch.full((1, 4), float(i)), i, i, final=i == 2))

    await asyncio.to_thread(produce)
    got = [c async for c in s]
    assert [c.index for c in got] == [0, 1, 2] and got[-1].final
    assert s.cancelled.is_set()  # the consumer left: the row is freed


def test_row_accept_chunk_schedule_and_end_of_speech():
    row = make_row(0, max_new=6)
    cfg = AcousticConfig(first_chunk_tokens=2, chunk_tokens=3)
    sent = []
    for i in range(6):
        row.accept(False, torch.full((4,), float(i)))
        if row.chunk_ready(cfg):
            sent.append(row.take_chunk(False, 4))
    assert row.finish_reason == "length" and row.n_generated == 6
    sent.append(row.take_chunk(True, 4))
    assert [c.hidden.shape[0] for c in sent] == [2, 3, 1]
    assert [c.start_token for c in sent] == [0, 2, 5] and [c.index for c in sent] == [0, 1, 2]
    assert sent[-1].final and sent[-1].finish_reason == "length" and not sent[0].final
    assert torch.equal(torch.cat([c.hidden for c in sent])[:, 0], torch.arange(6.0))

    stop = make_row(1, max_new=5)
    stop.accept(False, torch.zeros(4))
    stop.accept(True, torch.ones(4))
    assert stop.finish_reason == "stop" and len(stop.pending) == 1  # EOS's hidden state is dropped
    assert stop.take_chunk(False, 4).hidden.shape[0] == 1 and stop.take_chunk(False, 4) is None


# ============================================================================== sampler (tiny model)


def reference_probs(logits: torch.Tensor, req: SegmentRequest, history: list, generated: int, eos: int) -> torch.Tensor:
    """One row's distribution (4, V) the way ChatTTS computes it (``gen_logits``'s processors and
    transformers' warpers, one row at a time): the oracle of the batched pass."""
    from ChatTTS.model import gen_logits

    warpers, processors = gen_logits(
        num_code=eos, top_P=req.top_p, top_K=req.top_k, repetition_penalty=req.repetition_penalty
    )
    lg = logits / req.temperature
    if history:
        hist = torch.stack(history[-16:], 1)  # (4, n)
        for proc in processors:
            lg = proc(hist, lg)
    for warp in warpers:
        lg = warp(None, lg)
    if generated < req.min_new_tokens:
        lg[:, eos] = -torch.inf
    return torch.softmax(lg, -1)


def sampling_state(reqs: list[SegmentRequest], histories: list[list]) -> SamplingState:
    state = SamplingState(torch.device("cpu"))
    state.append(reqs)
    for i, hist in enumerate(histories):
        for tok in hist:
            state.record(tok.unsqueeze(0), start=i)
    return state


@torch.inference_mode()
def test_batched_sampling_matches_chattts_per_row_distribution(tiny_model):
    """The batched pass gives each row the distribution ChatTTS's own per-row processors give:
    temperature, repetition penalty over a partly filled window, top-p and top-k (3 kept at
    least), end-of-speech masked before the minimum length."""
    eos = tiny_model.chat.config.gpt.num_audio_tokens - 1
    sampler = Sampler(tiny_model.chat.embed, eos)
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, tiny_model.chat.gpt.gpt.config.hidden_size, generator=gen) * 4
    logits = sampler.logits(hidden)
    assert logits.shape == (6, 4, eos + 1) and logits.dtype == torch.float32
    logits[1, :, eos] = 50.0  # end-of-speech would win: masked for this young row
    params = [
        (0.3, 0.7, 20, 1.05, 1),
        (1.0, 0.9, 50, 1.05, 3),
        (0.7, 0.3, 2, 1.3, 1),
        (2.0, 1.0, 625, 1.0, 1),
        (0.05, 0.5, 1, 1.05, 1),
        (1.0, 0.95, 100, 1.2, 40),
    ]
    reqs = [
        SegmentRequest(
            text="x",
            spk_emb=None,
            seed=i,
            max_new_tokens=100,
            min_new_tokens=m,
            temperature=t,
            top_p=p,
            top_k=k,
            repetition_penalty=pen,
        )
        for i, (t, p, k, pen, m) in enumerate(params)
    ]
    # Histories of 0, 2, 16 and 25 tokens (the window keeps the last 16), drawn from the logits'
    # likely codes so the penalty bites.
    lens = [0, 2, 16, 25, 5, 9]
    histories = [[logits[i].topk(4, -1).indices[:, j % 4] for j in range(n)] for i, n in enumerate(lens)]
    state = sampling_state(reqs, histories)
    got: list = []
    sampler.draw(
        logits.clone(),
        temperature=state.temperature,
        top_p=state.top_p,
        top_k=state.top_k,
        penalty=state.penalty,
        history=state.history,
        filled=state.generated.clamp(max=16),
        eos_masked=state.generated < state.min_new,
        u=torch.rand(6, 4),
        probs_out=got,
    )
    for i, req in enumerate(reqs):
        want = reference_probs(logits[i].clone(), req, histories[i], lens[i], eos)
        assert torch.allclose(got[0][i], want, atol=1e-6), f"row {i}"
    assert float(got[0][1][:, eos].max()) == 0.0  # young: end-of-speech masked
    assert int((got[0][4] > 0).sum(-1).min()) == 3  # top_k=1 still keeps 3 (ChatTTS's warpers)


@torch.inference_mode()
def test_draws_depend_on_the_rows_seed_and_index_only(tiny_model):
    """A row's draw is a function of its seed and token index: the same alone or beside other
    rows, whatever the global RNG did; and draws follow the distribution."""
    eos = tiny_model.chat.config.gpt.num_audio_tokens - 1
    sampler = Sampler(tiny_model.chat.embed, eos)
    hidden = torch.randn(5, tiny_model.chat.gpt.gpt.config.hidden_size, generator=torch.Generator().manual_seed(1))
    reqs = [SegmentRequest(text="x", spk_emb=None, seed=100 + i, max_new_tokens=50, temperature=1.0) for i in range(5)]
    alone = sampling_state(reqs[2:3], [[]])
    together = sampling_state(reqs, [[]] * 5)
    for _ in range(6):
        torch.manual_seed(len(reqs))  # the global RNG must not matter
        a, ok_a = sampler.sample(alone, hidden[2:3])
        torch.manual_seed(99)
        b, ok_b = sampler.sample(together, hidden)
        assert bool(ok_a.all()) and bool(ok_b.all())
        assert torch.equal(a[0], b[2])
    assert int(together.generated[0]) == 6 and torch.equal(together.last, b)
    assert not torch.equal(b[0], b[1])  # other seeds, other codes (4 codebooks agreeing by chance is ~never)

    # Inverse-CDF draws over many indices follow the distribution.
    n = 5000
    u = uniforms(torch.full((n,), 7, dtype=torch.long), torch.arange(n))
    assert 0.0 <= float(u.min()) and float(u.max()) < 1.0 and abs(float(u.mean()) - 0.5) < 0.01
    row_logits = sampler.logits(hidden[:1]).expand(n, -1, -1)
    one = lambda v: torch.full((n,), v)  # noqa: E731
    probs: list = []
    tokens, ok = sampler.draw(
        row_logits,
        temperature=one(1.0),
        top_p=one(1.0),
        top_k=one(5).long(),
        penalty=one(1.0),
        history=torch.zeros(n, 4, 16, dtype=torch.long),
        filled=one(0).long(),
        eos_masked=one(0).bool(),
        u=u,
        probs_out=probs,
    )
    freq = torch.zeros(4, eos + 1).scatter_add_(1, tokens.T, torch.ones(4, n)) / n
    assert float((freq - probs[0][0]).abs().max()) < 0.03
    assert int((freq > 0).sum(-1).max()) <= 5

    # Probabilities that are not finite fail that row only.
    bad = sampler.logits(hidden[:2])
    bad[0, 0, 0] = float("nan")
    _, ok = sampler.draw(
        bad,
        temperature=torch.ones(2),
        top_p=torch.ones(2),
        top_k=torch.full((2,), 5),
        penalty=torch.ones(2),
        history=torch.zeros(2, 4, 16, dtype=torch.long),
        filled=torch.zeros(2, dtype=torch.long),
        eos_masked=torch.zeros(2, dtype=torch.bool),
        u=torch.rand(2, 4),
    )
    assert ok.tolist() == [False, True]


# ============================================================================== the one failure path


def decoded(stream: RowStream) -> torch.Tensor:
    return torch.cat([c.hidden for c in stream])


class FailingLayer:
    """A cache layer that fails the forward it is used in (a step failure, as from the device)."""

    def __init__(self, *args):
        raise RuntimeError("device fault")


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_a_failed_step_fails_every_running_row_and_the_engine_goes_on(tiny_model, spk, forward, monkeypatch):
    engine = AcousticEngine(tiny_model, fixed_chunks())
    if forward == "transformers":
        engine.decode_forward = None
    streams = [engine.submit(seg(spk, 30, seed=i)) for i in range(3)]
    for _ in range(3):
        engine.step()
    layer_cls, engine.batch.layer_cls = engine.batch.layer_cls, FailingLayer
    with monkeypatch.context() as m:
        m.setattr(engine.batch, "write_column", FailingLayer)  # the written-out forward's KV write
        engine.step()
    assert engine.running_rows == 0 and engine.batch.mask is None
    for s in streams:
        with pytest.raises(EngineError, match="decode failed: RuntimeError"):
            decoded(s)
    assert engine.stats.rows_failed == 3
    engine.batch.layer_cls = layer_cls
    after = engine.submit(seg(spk, 12, seed=9))
    engine.run_until_idle()
    assert decoded(after).shape[0] == 12 and engine.stats.rows_finished == 1


def test_a_failed_merge_fails_only_the_new_rows(tiny_model, spk, monkeypatch):
    engine = AcousticEngine(tiny_model, fixed_chunks())
    running = engine.submit(seg(spk, 25, seed=1))
    engine.step()

    def no_memory(prefilled):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(engine.batch, "merge", no_memory)
    new = [engine.submit(seg(spk, 20, seed=i)) for i in (2, 3)]
    engine.step()
    monkeypatch.undo()
    engine.run_until_idle()
    for s in new:
        with pytest.raises(EngineError, match="prefill failed: RuntimeError"):
            decoded(s)
    assert decoded(running).shape[0] == 25
    assert engine.stats.rows_failed == 2 and engine.stats.rows_finished == 1


# ============================================================================== the static (CUDA graph) step

CUDA = torch.cuda.is_available()


def test_buckets_cover_max_rows():
    assert buckets_for(1) == (1,)
    assert buckets_for(5) == (1, 2, 4, 8)
    assert buckets_for(32) == (1, 2, 4, 8, 16, 32)
    assert buckets_for(500) == BUCKETS  # above the largest: those steps run eagerly


def static_workload(engine: AcousticEngine, spk: str) -> list[list]:
    """Rows join a running batch, leave in another order (one cancelled), one runs longer than
    the others: (chunk index, start, final, reason, hidden) per chunk per row."""
    texts = [
        "你好，欢迎使用语音合成服务。",
        "hello world",
        "今天天气很好，我们出去走走吧，顺便买点东西回来。",
        "一二三",
        "abc def",
        "好",
    ]
    lengths = [140, 40, 25, 60, 33, 12]
    reqs = [
        SegmentRequest(text=t, spk_emb=spk, seed=i, max_new_tokens=n, target_tokens=n, temperature=0.3 + 0.1 * i)
        for i, (t, n) in enumerate(zip(texts, lengths))
    ]
    streams = [engine.submit(r) for r in reqs[:3]]
    for _ in range(6):
        engine.step()
    streams += [engine.submit(r) for r in reqs[3:]]  # merged into the running batch
    for _ in range(4):
        engine.step()
    streams[3].cancel()
    engine.run_until_idle()
    return [[(c.index, c.start_token, c.final, c.finish_reason, c.hidden) for c in s] for s in streams]


def assert_same_decode(got: list[list], expected: list[list], atol: float) -> None:
    for row_got, row_exp in zip(got, expected, strict=True):
        assert [c[:4] for c in row_got] == [c[:4] for c in row_exp]
        for c, e in zip(row_got, row_exp):
            assert c[4].shape == e[4].shape and torch.allclose(c[4], e[4], atol=atol, rtol=0)


def static_engine(model, buckets: tuple[int, ...], kv_tokens: int, capture: bool) -> AcousticEngine:
    engine = AcousticEngine(model, fixed_chunks(max_rows=8))
    engine.graphs = GraphRunner(engine.gpt, engine.embed, buckets, kv_tokens, capture=capture)
    return engine


@pytest.mark.timeout(300)
def test_padded_static_step_decodes_like_the_eager_step_on_cpu(tiny_model, spk, caplog):
    """The static step (padded to a bucket, KV in fixed-size buffers, mask over the capacity)
    run without graphs gives the eager step's hidden states, hence its tokens; steps it cannot
    take (6 rows > bucket 4, KV beyond the capacity) run eagerly, said once per cause."""
    expected = static_workload(AcousticEngine(tiny_model, fixed_chunks(max_rows=8)), spk)
    engine = static_engine(tiny_model, (1, 2, 4), kv_tokens=120, capture=False)
    with caplog.at_level("WARNING", logger="serve_app.engine.decode.cuda_graph"):
        got = static_workload(engine, spk)
    assert_same_decode(got, expected, atol=1e-4)
    graphs = engine.graphs
    assert 0 < engine.stats.graph_steps < engine.stats.steps  # both paths ran
    assert graphs.copies_in >= 2  # after merges
    said = [r.getMessage() for r in caplog.records]
    assert sum("above the largest bucket (4)" in m for m in said) == 1
    assert sum("above the capacity (120 tokens" in m for m in said) == 1
    # Pad rows and masked columns never put a NaN in the storage (it would poison later steps):
    # every row of the static mask, pad rows too, attends to at least one column (a fully masked
    # row gives NaN on some attention kernels, zeros on this CPU's).
    assert all(bool(torch.isfinite(k).all()) for k in (*graphs._k, *graphs._v))
    assert bool(graphs._mask[:, 0, 0].any(-1).all())
    assert engine.running_rows == 0 and engine.stats.rows_finished == 5 and engine.stats.rows_cancelled == 1


def test_cuda_graphs_switch_is_a_no_op_without_cuda(tiny_model, spk, caplog):
    with caplog.at_level("WARNING", logger="serve_app.engine.acoustic"):
        engine = AcousticEngine(tiny_model, fixed_chunks(cuda_graphs=True))
    assert engine.graphs is None and "not a CUDA device" in caplog.text
    stream = engine.submit(seg(spk, 12, seed=1))
    engine.run_until_idle()
    assert decoded(stream).shape[0] == 12 and engine.stats.graph_steps == 0


@pytest.fixture(scope="module")
def cuda_model(tiny_weights_config):
    from serve_app.engine.config import ModelConfig
    from serve_app.engine.weights.loading import load_model

    return lambda dtype: load_model(
        ModelConfig(weights=tiny_weights_config, device="cuda", dtype=dtype, torch_threads=1)
    )


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
@pytest.mark.timeout(300)
def test_cuda_graph_replays_give_the_static_steps_results(cuda_model):
    """Graph replays against the same static step run eagerly on the same GPU (same kernels:
    the results may differ only by what a kernel's own nondeterminism gives)."""
    from serve_app.engine.voices import speaker_from_seed

    model = cuda_model("float32")
    spk_ = speaker_from_seed(model.chat.speaker, 1)
    eager = static_workload(static_engine(model, (1, 2, 4, 8), kv_tokens=512, capture=False), spk_)
    engine = static_engine(model, (1, 2, 4, 8), kv_tokens=512, capture=True)
    got = static_workload(engine, spk_)
    assert engine.graphs.disabled is None and sorted(engine.graphs.graphs) == [1, 2, 4, 8]
    assert engine.stats.graph_steps == engine.stats.steps
    assert_same_decode(got, eager, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="no CUDA device on this machine")
@pytest.mark.timeout(300)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graphs_switch_decodes_like_eager_steps(cuda_model, dtype):
    """cuda_graphs=True against the eager engine on the GPU: float32 within cuBLAS's rounding
    (padded batches may pick other kernels); bfloat16 runs, every step from a graph, and its rows
    have their lengths and finite hidden states (its tokens may part at a near-tie)."""
    from serve_app.engine.voices import speaker_from_seed

    model = cuda_model(dtype)
    spk_ = speaker_from_seed(model.chat.speaker, 1)
    expected = static_workload(AcousticEngine(model, fixed_chunks(max_rows=8)), spk_)
    engine = AcousticEngine(model, fixed_chunks(max_rows=8, cuda_graphs=True, cuda_graph_kv_tokens=512))
    got = static_workload(engine, spk_)
    assert engine.graphs is not None and engine.graphs.disabled is None
    assert engine.stats.graph_steps == engine.stats.steps > 0
    if dtype == "float32":
        assert_same_decode(got, expected, atol=1e-3)
    else:
        assert [sum(c[4].shape[0] for c in row) for row in got] == [sum(c[4].shape[0] for c in row) for row in expected]
        assert all(bool(torch.isfinite(c[4]).all()) for row in got for c in row)


# ============================================================================== chunks a listener needs

TOKEN_S = 512 / 24000


def listening_row(first_chunk_at: float, tokens_sent: int, pending: int) -> Row:
    row = make_row(0, max_new=500)
    row.stream.first_chunk_at = first_chunk_at
    row.chunks_sent, row.tokens_sent, row.pending = 1, tokens_sent, [torch.zeros(4)] * pending
    return row


def test_a_chunk_goes_early_only_when_a_listener_would_run_dry():
    """The listener started at the first chunk (t=0) and has heard tokens_sent - lag tokens' worth;
    the full chunk (24) would be ready after (24 - pending) more steps."""
    cfg = AcousticConfig(
        first_chunk_tokens=12, chunk_tokens=24, listener_margin_s=0.1, min_early_chunk_tokens=8, listener_lag_tokens=4
    )
    fast = 0.010  # steps at ~2x real time; the first chunk's 12 - 4 tokens: 171 ms to hear
    # 8 pending at t=80 ms: the full chunk comes at 80 + 16 x 10 = 240 ms, past 171 - 100: send now.
    assert listening_row(0.0, 12, 8).chunk_ready(cfg, now=0.080, step_s=fast)
    # Fewer than min_early_chunk_tokens pending: they would play nothing yet; wait.
    assert not listening_row(0.0, 12, 7).chunk_ready(cfg, now=0.070, step_s=fast)
    # Plenty heard ahead (2 s sent): the full chunk is in time, chunks keep their size.
    assert not listening_row(0.0, 100, 8).chunk_ready(cfg, now=0.080, step_s=fast)
    # Steps slower than real time: no schedule avoids the gap; no extra vocoder calls.
    assert not listening_row(0.0, 12, 20).chunk_ready(cfg, now=0.4, step_s=1.2 * TOKEN_S)
    # Off (None, the engine's default): only full chunks, whatever the listener.
    off = cfg.model_copy(update={"listener_margin_s": None})
    assert not listening_row(0.0, 12, 23).chunk_ready(off, now=5.0, step_s=fast)
    assert listening_row(0.0, 12, 24).chunk_ready(off, now=0.0, step_s=fast)
    # Before the first chunk there is no listener: the first chunk keeps its size.
    first = make_row(0)
    first.pending = [torch.zeros(4)] * 11
    assert not first.chunk_ready(cfg, now=5.0, step_s=fast)
    # A finished row sends its final chunk elsewhere, never here.
    done = listening_row(0.0, 12, 23)
    done.finish_reason = "stop"
    assert not done.chunk_ready(cfg, now=5.0, step_s=fast)


def _listen(
    engine: AcousticEngine, req: SegmentRequest, pause_s: float
) -> tuple[torch.Tensor, list[tuple[float, int]], float]:
    """Decode one row, ``pause_s`` between steps (a slower engine); (hidden states, (time, tokens
    sent) at every send, the engine's pace)."""
    import time

    stream = engine.submit(req)
    sends: list[tuple[float, int]] = []
    sent = 0
    while True:
        rows = list(engine.batch.rows)
        engine.step()
        total = rows[0].tokens_sent if rows else 0
        if total != sent:
            sends.append((time.monotonic(), total))
            sent = total
        if stream.ended or (rows and rows[0].finish_reason is not None and not engine.batch.rows):
            break
        time.sleep(pause_s)
    chunks = list(stream)
    return torch.cat([c.hidden for c in chunks]), sends, engine.pace_s or 0.0


def _listener_gap(sends: list[tuple[float, int]], lag: int) -> float:
    """Seconds a listener who starts at the first send waits for audio: after a send it can play
    up to tokens_sent - lag tokens (the last send, the final chunk, is heard whole)."""
    t0, heard_until, waited = sends[0][0], None, 0.0
    for i, (t, tokens) in enumerate(sends):
        if heard_until is not None and t > heard_until:
            waited += t - heard_until
            heard_until = t
        audible = tokens if i == len(sends) - 1 else max(0, tokens - lag)
        heard_until = t0 + waited + audible * TOKEN_S
    return waited


def test_early_chunks_keep_a_listener_fed_and_change_no_token(tiny_model, spk):
    """Steps at about half a token's audio (a tiny step plus 8 ms): fixed chunks (12, then 24)
    starve a listener after the first chunk (24 steps against the 8 tokens it can play: a gap
    once a step takes more than ~8 ms); chunks sent for the listener do not, and carry the same
    tokens and hidden states."""
    req = seg(spk, 100, seed=3)
    fixed = AcousticEngine(tiny_model, fixed_chunks(first_chunk_tokens=12, chunk_tokens=24))
    fed = AcousticEngine(tiny_model, AcousticConfig(first_chunk_tokens=12, chunk_tokens=24, listener_margin_s=0.1))
    h_fixed, s_fixed, _ = _listen(fixed, req, pause_s=0.008)
    h_fed, s_fed, pace = _listen(fed, req, pause_s=0.008)
    assert torch.equal(h_fixed, h_fed) and h_fed.shape[0] == 100
    sizes = [b - a for (_, a), (_, b) in zip([(0, 0)] + s_fed[:-1], s_fed)]
    assert sizes[0] == 12 and all(8 <= n <= 24 for n in sizes[1:-1]), sizes
    if pace >= 0.8 * TOKEN_S:
        pytest.skip(f"this machine stepped at {1000 * pace:.1f} ms, too close to real time to judge gaps")
    assert any(n < 24 for n in sizes[1:-1]), sizes  # some went early
    assert _listener_gap(s_fixed, 4) > 0.02  # the 12 -> 24 schedule: dry after the first chunk (0.1-0.2 s here)
    assert _listener_gap(s_fed, 4) < 0.02, (sizes, _listener_gap(s_fed, 4))
    report(
        "engine: listener gap with chunks 12 then 24 / with early chunks",
        f"{_listener_gap(s_fixed, 4):.3f} s / "
        f"{_listener_gap(s_fed, 4):.3f} s at {1000 * pace:.1f} ms per step; chunk sizes {sizes}",
    )
