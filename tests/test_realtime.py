"""The WebSocket session logic without Ray (serve_app/realtime/): incremental cutting, the message
protocol, the one-stream Ogg Opus joiner, and whole sessions over an in-memory transport against
the real engine in this process (tiny random weights: planner, continuously batched decode loop,
sliding-window vocoder, encoders). The same sessions through Serve and a real WebSocket client:
tests/test_serve_ws.py."""

from __future__ import annotations

import asyncio
import io
import json
import random
import struct
from typing import Any, AsyncIterator, Optional, Union

import av
import numpy as np
import pytest

from serve_app.engine.audio import SAMPLE_RATE, new_encoder
from serve_app.engine.config import SegmentLimits
from serve_app.engine.errors import EmptyInputError
from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.planner import segment_seed
from serve_app.engine.text import split_unfinished
from serve_app.engine.types import Plan, StreamSummary, SynthesisOptions
from serve_app.errors import APIError
from serve_app.protocol import SessionCreated, SessionStart
from serve_app.realtime import OggOpusJoiner, SessionLimits, receive_message, serve_session
from serve_app.realtime.ogg import ogg_crc, opus_packet_samples
from stream_helpers import assert_same_audio, deltas
from waiting import wait_until_async
from engine_helpers import fixed_chunks

# Three sentences without clause marks, each ~1.6 s of speech: with segments of at most 1 s
# (BACKEND_LIMITS) the planner makes each sentence a segment of its own, as the session's cuts
# at sentence ends do: the premise of the equality test (it asserts it).
SENTENCES = ["The quick brown fox jumps high.", " Seven small birds sing today.", " A warm wind moves the tall trees."]
TEXT = "".join(SENTENCES)
BACKEND_LIMITS = SegmentLimits(max_chars=120, max_seconds=1.0)


# ---------------------------------------------------------------------------------------- cutting


@pytest.mark.parametrize("text, complete, rest", [
    ("Hello world", "", "Hello world"),
    ("Hello world.", "Hello world.", ""),
    ("Hello world. How", "Hello world.", " How"),
    ("It costs 3.", "", "It costs 3."),  # a final "." after a digit waits: it may become 3.5
    ("See e.g.", "", "See e.g."),  # not a sentence end
    ("Ask J.", "", "Ask J."),  # initials: J. K. Rowling
    ("Wait...", "Wait...", ""),
    ("It costs 3.5 dollars", "", "It costs 3.5 dollars"),
    ("Is it?", "Is it?", ""),  # unambiguous ends are complete at once
    ("你好。", "你好。", ""),
    ("你好。今天", "你好。", "今天"),
    ("他说：“你好。”", "他说：“你好。”", ""),  # closing quotes belong to the sentence
    ("one line\n", "one line\n", ""),
    ("Mr. Smith", "", "Mr. Smith"),
    ("", "", ""),
])
def test_split_unfinished_sentences(text, complete, rest):
    assert split_unfinished(text) == (complete, rest)


def test_split_unfinished_cuts_long_unfinished_sentences_at_clauses():
    text = "今天天气很好，我们一起去公园散步吧，公园里有很多花，红的黄的都很漂亮，走累了我们"
    complete, rest = split_unfinished(text, 120, max_seconds=4.0)
    assert complete + rest == text
    assert complete.endswith("，") and rest == "走累了我们"  # the last clause may still grow
    # Within the limits nothing is cut before the sentence ends.
    assert split_unfinished(text, 120) == ("", text)
    # No clause marks: past max_chars, cut at whitespace; the last word stays (it may be partial).
    words = "word " * 30 + "unfinish"
    complete, rest = split_unfinished(words, 120)
    assert complete + rest == words and rest == "unfinish" and len(complete) > 120


def test_split_unfinished_streams_like_one_cut():
    """Fed character by character, the pieces released join back to the text and end at its
    sentence ends."""
    released, buf = [], ""
    for ch in TEXT:
        complete, buf = split_unfinished(buf + ch)
        if complete:
            released.append(complete)
    assert released == SENTENCES and buf == ""


# ---------------------------------------------------------------------------------------- messages


class MemoryTransport:
    """The server side of a WebSocket in memory (what Starlette's offers a session), with the
    client side for the test: ``send`` / ``send_raw`` / ``disconnect`` and ``next``."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.out: asyncio.Queue = asyncio.Queue()
        self.close_code: Optional[int] = None

    async def receive(self) -> dict[str, Any]:
        return await self.inbox.get()

    async def send_bytes(self, data: bytes) -> None:
        assert self.close_code is None, "sent after close"
        self.out.put_nowait(data)

    async def send_text(self, data: str) -> None:
        assert self.close_code is None, "sent after close"
        self.out.put_nowait(json.loads(data))

    async def close(self, code: int = 1000, reason: Optional[str] = None) -> None:
        self.close_code = code
        self.out.put_nowait(("close", code))

    # client side
    def send(self, **message: Any) -> None:
        self.send_raw(json.dumps(message))

    def send_raw(self, text: Optional[str] = None, data: Optional[bytes] = None) -> None:
        self.inbox.put_nowait({"type": "websocket.receive", "text": text, "bytes": data})

    def disconnect(self) -> None:
        self.inbox.put_nowait({"type": "websocket.disconnect", "code": 1001})

    async def next(self, timeout: float = 60.0) -> Union[bytes, dict, tuple]:
        return await asyncio.wait_for(self.out.get(), timeout)


async def _message(text: Optional[str] = None, data: Optional[bytes] = None, limits: SessionLimits = SessionLimits()):
    t = MemoryTransport()
    t.send_raw(text, data)
    return await receive_message(t, limits)


@pytest.mark.parametrize("raw, status, code, param", [
    ("not json", 400, "invalid_json", None),
    ("[1, 2]", 400, "invalid_message", None),
    ('{"type": "speak"}', 400, "unknown_type", "type"),
    ('{"text": "hi"}', 400, "unknown_type", "type"),
    ('{"type": "text.append"}', 400, "missing_required_parameter", "text"),
    ('{"type": "text.append", "text": 5}', 400, "invalid_value", "text"),
    ('{"type": "text.append", "text": "a\\u0000b"}', 400, "invalid_value", "text"),
    ('{"type": "session.start", "speed": 9}', 400, "invalid_value", "speed"),
    ('{"type": "session.start", "response_format": "wav"}', 400, "invalid_value", "response_format"),
    ('{"type": "session.start", "voices": "alloy"}', 400, "invalid_value", "voices"),  # a typo is refused
    ('{"type": "text.append", "text": "' + "x" * 70000 + '"}', 413, "message_too_large", None),
])
async def test_bad_messages_are_api_errors(raw, status, code, param):
    with pytest.raises(APIError) as info:
        await _message(raw)
    assert (info.value.status, info.value.code, info.value.param) == (status, code, param)


async def test_messages_validate_like_the_http_body():
    start = await _message(json.dumps({"type": "session.start", "voice": "nova", "seed": 7, "speed": 1.5,
                                       "response_format": "opus", "api_key": "k"}))
    assert isinstance(start, SessionStart)
    opts = start.to_options()
    assert isinstance(opts, SynthesisOptions) and (opts.voice, opts.seed, opts.speed) == ("nova", 7, 1.5)
    assert "api_key" not in repr(start)
    with pytest.raises(APIError) as info:
        await _message(data=b"\x00\x01")
    assert info.value.code == "invalid_message"


# ---------------------------------------------------------------------------------------- Ogg Opus


def _pages(data: bytes) -> list[dict]:
    pages, pos = [], 0
    while pos < len(data):
        assert data[pos:pos + 4] == b"OggS"
        _, _, flags, granule, serial, seq, crc, n = struct.unpack_from("<4sBBqIIIB", data, pos)
        end = pos + 27 + n + sum(data[pos + 27:pos + 27 + n])
        page = bytearray(data[pos:end])
        page[22:26] = b"\0\0\0\0"
        assert ogg_crc(bytes(page)) == crc, f"bad CRC on page {seq}"
        pages.append({"flags": flags, "granule": granule, "serial": serial, "seq": seq, "body": data[pos + 27 + n:end]})
        pos = end
    return pages


def _decode(data: bytes, fmt: str) -> np.ndarray:
    with av.open(io.BytesIO(data), format={"opus": "ogg", "mp3": "mp3"}[fmt]) as container:
        stream = container.streams.audio[0]
        return np.concatenate([f.to_ndarray().reshape(-1) for f in container.decode(stream)])


def _tone(n: int, f: float = 220.0) -> np.ndarray:
    return (0.5 * np.sin(2 * np.pi * f * np.arange(n) / SAMPLE_RATE)).astype(np.float32)


def _encode(pcm: np.ndarray, fmt: str) -> bytes:
    enc = new_encoder(fmt)
    half = len(pcm) // 2
    return enc.write(pcm[:half]) + enc.write(pcm[half:]) + enc.close()


def test_ogg_joiner_makes_one_logical_stream():
    lengths = [24000, 13001, 30000]
    joiner = OggOpusJoiner(serial=77)
    out = b""
    rng = random.Random(0)
    for n in lengths:
        data = _encode(_tone(n), "opus")
        pos = 0
        while pos < len(data):  # arbitrary byte chunks: pages are reassembled
            step = rng.randint(1, 300)
            out += joiner.feed(data[pos:pos + step])
            pos += step
        joiner.end_segment()
    out += joiner.finish()
    assert joiner.finish() == b""
    pages = _pages(out)
    assert {p["serial"] for p in pages} == {77}
    assert [p["seq"] for p in pages] == list(range(len(pages)))
    assert [p["flags"] & 0x02 for p in pages] == [2] + [0] * (len(pages) - 1)  # one BOS: the first page
    assert [p["flags"] & 0x04 for p in pages] == [0] * (len(pages) - 1) + [4]  # one EOS: the last page
    assert sum(p["body"][:8] == b"OpusHead" for p in pages) == 1
    assert sum(p["body"][:8] == b"OpusTags" for p in pages) == 1
    granules = [p["granule"] for p in pages[2:] if p["granule"] != -1]
    assert granules == sorted(granules)  # time only moves forward across segments
    audio = _decode(out, "opus")  # 48 kHz
    want = 2 * sum(lengths)
    # Each later segment adds its encoder's priming and the previous one's last-frame padding.
    assert want <= len(audio) <= want + 2 * 960 * len(lengths), (len(audio), want)
    # The granule positions count exactly the samples the packets decode to (pre-skip included).
    assert pages[-1]["granule"] == len(audio) + 312


def test_ogg_joiner_survives_a_segment_cut_short():
    joiner = OggOpusJoiner(serial=1)
    first = _encode(_tone(48000), "opus")
    out = joiner.feed(first[: len(first) // 2])  # barge-in half-way through a page, maybe
    joiner.end_segment()
    out += joiner.feed(_encode(_tone(12000, 440.0), "opus"))
    joiner.end_segment()
    out += joiner.finish()
    pages = _pages(out)
    assert [p["seq"] for p in pages] == list(range(len(pages))) and pages[-1]["flags"] == 4
    audio = _decode(out, "opus")
    # About half of the first segment (the pages complete in half its bytes), then all the second.
    assert 2 * (18000 + 12000) < len(audio) < 2 * (30000 + 12000), len(audio)


def test_opus_packet_samples():
    assert opus_packet_samples(bytes([(31 << 3) | 0])) == 960  # CELT 20 ms, one frame
    assert opus_packet_samples(bytes([(28 << 3) | 1])) == 240  # CELT 2.5 ms, two frames
    assert opus_packet_samples(bytes([(3 << 3) | 3, 3])) == 3 * 2880  # SILK 60 ms, three frames
    assert opus_packet_samples(bytes([(13 << 3) | 0])) == 960  # hybrid 20 ms


def test_mp3_segments_concatenate_into_one_stream():
    """mp3 needs no joiner: bare MPEG frames of separately encoded segments are one stream."""
    parts = [_encode(_tone(n), "mp3") for n in (24000, 12000)]
    audio = _decode(b"".join(parts), "mp3")
    assert 36000 <= len(audio) <= 36000 + 2 * 2000


# ---------------------------------------------------------------------------------------- sessions


class EngineBackend:
    """The graph's work in this process: the planner (TextNormalizer), the continuously batched
    engine (Acoustic) and per-plan assembly and encoding (Vocoder), as the stages do it."""

    def __init__(self, model) -> None:
        from serve_app.engine.acoustic import AcousticEngine
        from serve_app.engine.planner import Planner
        from serve_app.engine.threads import TorchThread
        from serve_app.engine.vocoder import Vocoder

        self.planner = Planner(BACKEND_LIMITS)
        self.engine = AcousticEngine(model, fixed_chunks(max_rows=16))
        self.vocoder = Vocoder(model)
        self.thread = TorchThread("vocoder", threads=1)
        self.engine.start()
        self.opened: list = []  # every segment request sent to audio(), in order
        self.planned: list[str] = []  # every text sent to plan(), in order

    def close(self) -> None:
        self.engine.stop()
        self.thread.shutdown()

    async def plan(self, text: str, options: SynthesisOptions) -> Plan:
        self.planned.append(text)
        return self.planner.plan(text, options)

    async def audio(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        from serve_app.engine.pipeline import AudioAssembler, aordered_chunks

        self.opened += plan.segments
        assembler = AudioAssembler(self.vocoder, response_format)
        streams = self.engine.submit_all(plan.segments, loop=asyncio.get_running_loop())
        async for seg, chunk in aordered_chunks(streams):  # cancels the rows when closed early
            data = await self.thread.acall(assembler.feed, seg, chunk.hidden, chunk.final)
            if data:
                yield data
        yield await self.thread.acall(assembler.close)
        yield StreamSummary(assembler.samples / SAMPLE_RATE, len(plan.segments), 0, 0.0, 0.0)

    async def speak(self, text: str, options: SynthesisOptions, fmt: str = "pcm") -> bytes:
        """One request for the whole text (what HTTP does)."""
        plan = await self.plan(text, options)
        return b"".join([x async for x in self.audio(plan, fmt) if isinstance(x, bytes)])


@pytest.fixture(scope="module")
def backend(tiny_model):
    b = EngineBackend(tiny_model)
    yield b
    b.close()


async def _admit(start: SessionStart) -> SessionCreated:
    return SessionCreated(id="test", response_format=start.response_format, sample_rate=SAMPLE_RATE, weights="random")


class Client:
    """A session on a MemoryTransport, read from the client's side."""

    def __init__(self, backend: EngineBackend, limits: SessionLimits = SessionLimits(), **start: Any) -> None:
        self.t = MemoryTransport()
        self.t.send(type="session.start", **start)
        self.task = asyncio.ensure_future(serve_session(self.t, backend, _admit, limits))
        self.events: list[dict] = []
        self.audio = bytearray()

    async def until(self, kind: str, timeout: float = 120.0) -> dict:
        """Read until the event ``kind`` (audio collected on the way)."""
        while True:
            item = await self.t.next(timeout)
            if isinstance(item, bytes):
                self.audio += item
                continue
            if isinstance(item, tuple):
                raise AssertionError(f"closed with {item[1]} waiting for {kind}; events {self.events}")
            self.events.append(item)
            if item["type"] == kind:
                return item

    async def frame(self, timeout: float = 120.0) -> bytes:
        """The next binary frame (events on the way are kept)."""
        while True:
            item = await self.t.next(timeout)
            if isinstance(item, bytes):
                self.audio += item
                return item
            assert not isinstance(item, tuple), f"closed with {item[1]} waiting for audio"
            self.events.append(item)

    async def finish(self, timeout: float = 120.0):
        await self.until("done", timeout)
        assert await self.t.next(timeout) == ("close", 1000)
        return await self.task


async def _engine_state(engine) -> dict:
    return {"steps": engine.stats.steps, "rows": engine.running_rows + engine.waiting_rows}


async def _idle(engine) -> dict:
    """The engine's counters once no row runs or waits (polled every 5 ms)."""
    return await wait_until_async(lambda: _engine_state(engine), 30, 0.005, until=lambda s: s["rows"] == 0, what="rows freed")


async def _rows(engine, n: int) -> None:
    await wait_until_async(lambda: _engine_state(engine), 60, 0.005, until=lambda s: s["rows"] >= n, what=f"{n} rows")


async def test_deltas_speak_the_same_audio_as_one_request(backend):
    opts = SynthesisOptions(voice="nova", seed=1234)
    whole = await backend.plan(TEXT, opts)
    assert whole.texts == [s.strip() for s in SENTENCES], "premise: one segment per sentence"
    reference = await backend.speak(TEXT, opts)

    c = Client(backend, voice="nova", seed=1234, response_format="pcm")
    assert (await c.until("session.created"))["response_format"] == "pcm"
    backend.opened.clear()
    backend.planned.clear()
    for delta in deltas(TEXT):
        c.t.send(type="text.append", text=delta)
    c.t.send(type="close")
    _, stats = await c.finish()
    # Per-segment seeds as HTTP gives them; a segment behind unsent audio yields a priority level.
    assert [r.seed for r in backend.opened] == [r.seed for r in whole.segments] == [segment_seed(1234, i) for i in range(3)]
    assert [r.priority for r in backend.opened] == [0, -1, -1]
    # The first sentence was spoken at once; the next two, behind its audio, were packed into
    # one cut (under clause_seconds of speech), which the planner split as HTTP does.
    assert backend.planned == [SENTENCES[0], SENTENCES[1] + SENTENCES[2]]
    starts = [e for e in c.events if e["type"] == "segment.start"]
    dones = [e for e in c.events if e["type"] == "segment.done"]
    assert [e["text"] for e in starts] == whole.texts
    assert [e["index"] for e in starts] == [e["index"] for e in dones] == [0, 1, 2]
    # Random weights: each segment is exactly its target length, 512 samples a token less 256.
    samples = [r.target_tokens * SAMPLES_PER_TOKEN - SAMPLES_PER_TOKEN // 2 for r in whole.segments]
    assert [e["audio_seconds"] for e in dones] == [round(n / SAMPLE_RATE, 4) for n in samples]
    assert len(c.audio) == 2 * sum(samples) == len(reference)
    assert_same_audio(bytes(c.audio), reference)
    assert stats.status == "done" and stats.segments == 3 and stats.chars == len(TEXT)
    # Another seed is other audio (the comparison above can fail).
    other = await backend.speak(TEXT, SynthesisOptions(voice="nova", seed=1235))
    with pytest.raises(AssertionError):
        assert_same_audio(other, reference)


async def test_first_audio_before_the_next_text_is_sent(backend):
    c = Client(backend, response_format="pcm")
    await c.until("session.created")
    for delta in deltas(SENTENCES[0] + " Sev", seed=1):  # the next sentence has only begun
        c.t.send(type="text.append", text=delta)
    await c.frame()
    start = next(e for e in c.events if e["type"] == "segment.start")
    assert start == {"type": "segment.start", "index": 0, "text": SENTENCES[0].strip()}
    c.t.send(type="text.append", text="en small birds sing today.")
    c.t.send(type="text.flush")  # speak the rest now, without waiting for more text
    c.t.send(type="close")
    _, stats = await c.finish()
    assert [e["text"] for e in c.events if e["type"] == "segment.start"] == [s.strip() for s in SENTENCES[:2]]
    assert stats.segments == 2


async def test_cancel_stops_audio_and_rows_within_a_step(backend):
    engine = backend.engine
    # clause_seconds under a sentence's length: every sentence is a segment at once, none held.
    c = Client(backend, response_format="pcm", clause_seconds=1.0)
    await c.until("session.created")
    c.t.send(type="text.append", text=TEXT + " And one more sentence here")
    await c.frame()
    await _rows(engine, 2)  # the second segment joins once the first has audio; two decode at once
    assert engine.running_rows + engine.waiting_rows == SessionLimits().decoding_segments
    before = engine.stats.rows_cancelled
    c.t.send(type="cancel")
    ack = await c.until("cancelled")
    steps_at_ack = engine.stats.steps
    assert ack["segments"] == [0, 1, 2]
    # The rows leave the batch at the next step's end (the decode thread may be mid-step).
    steps_when_idle = (await _idle(engine))["steps"]
    assert steps_when_idle - steps_at_ack <= 1, (steps_at_ack, steps_when_idle)
    assert engine.stats.rows_cancelled - before == 2  # the third never started
    # Nothing of the dropped segments follows: the next item is the answer to new text.
    c.t.send(type="text.append", text="Back again.")
    c.t.send(type="close")
    item = await c.t.next()
    assert item == {"type": "segment.start", "index": 3, "text": "Back again."}, item
    _, stats = await c.finish()
    assert stats.segments == 1 and stats.cancelled_segments == 3


async def test_opus_and_mp3_sessions_are_one_stream(backend):
    for fmt in ("opus", "mp3"):
        c = Client(backend, response_format=fmt)
        await c.until("session.created")
        for delta in deltas(TEXT[: len(SENTENCES[0]) + len(SENTENCES[1])]):
            c.t.send(type="text.append", text=delta)
        c.t.send(type="close")
        _, stats = await c.finish()
        assert stats.segments == 2
        audio = _decode(bytes(c.audio), fmt)
        rate = 48000 if fmt == "opus" else SAMPLE_RATE
        want = stats.audio_seconds * rate
        assert want <= len(audio) <= want + 0.12 * rate, (fmt, len(audio), want)
        if fmt == "opus":
            pages = _pages(bytes(c.audio))
            assert len({p["serial"] for p in pages}) == 1 and pages[-1]["flags"] == 4


@pytest.mark.parametrize("messages, status, code", [
    ([{"type": "text.append", "text": "hi"}], 400, "session_not_started"),
    (["{nope"], 400, "invalid_json"),
])
async def test_errors_before_the_session_starts(backend, messages, status, code):
    t = MemoryTransport()
    for m in messages:
        t.send_raw(m if isinstance(m, str) else json.dumps(m))
    start, stats = await serve_session(t, backend, _admit)
    event = await t.next()
    assert event["type"] == "error" and event["error"]["code"] == code
    assert set(event["error"]) == {"message", "type", "param", "code"}
    assert await t.next() == ("close", 4000 + status)
    assert stats.status == str(status)


async def test_admit_errors_close_the_session(backend):
    async def refuse(start: SessionStart) -> SessionCreated:
        raise EmptyInputError("not a real reason, only an engine error type to map")

    t = MemoryTransport()
    t.send(type="session.start")
    await serve_session(t, backend, refuse)
    assert (await t.next())["error"]["code"] == "empty_input"
    assert await t.next() == ("close", 4400)


@pytest.mark.parametrize("bad, status, code", [
    ({"type": "speak", "text": "hi"}, 400, "unknown_type"),
    ({"type": "session.start"}, 400, "session_already_started"),
    ({"type": "text.append", "text": "好" * 200}, 413, "input_too_long"),
])
async def test_bad_message_mid_session_ends_it_cleanly(backend, bad, status, code):
    engine = backend.engine
    c = Client(backend, limits=SessionLimits(max_text_chars=150), response_format="pcm")
    await c.until("session.created")
    c.t.send(type="text.append", text=SENTENCES[0] + " Another one")
    await c.frame()
    c.t.send(**bad)
    error = await c.until("error")
    assert error["error"]["code"] == code
    assert await c.t.next() == ("close", 4000 + status)
    _, stats = await c.task
    assert stats.status == str(status)
    await _idle(engine)  # its rows are cancelled, not left decoding


async def test_disconnect_cancels_the_rows(backend):
    engine = backend.engine
    before = engine.stats.rows_cancelled
    c = Client(backend, response_format="pcm", clause_seconds=1.0)
    await c.until("session.created")
    c.t.send(type="text.append", text=TEXT)
    await c.frame()
    await _rows(engine, 2)
    c.t.disconnect()
    _, stats = await c.task
    assert stats.status == "client_disconnect"
    await _idle(engine)
    assert engine.stats.rows_cancelled - before == 2


async def test_nothing_speakable_is_dropped_silently(backend):
    c = Client(backend, response_format="pcm")
    await c.until("session.created")
    c.t.send(type="text.append", text="... !!! ")
    c.t.send(type="text.flush")
    c.t.send(type="text.append", text="Fine.")
    c.t.send(type="close")
    _, stats = await c.finish()
    assert [e["text"] for e in c.events if e["type"] == "segment.start"] == ["Fine."]
    assert stats.segments == 1


# ---------------------------------------------------------------------------------------- bench


def test_bench_llm_tokens_first_sentence_and_playback_gaps():
    from bench.realtime import REPLIES, buffer_needed, first_sentence, llm_tokens, playback_gaps

    for reply in REPLIES:
        tokens = llm_tokens(reply)
        assert "".join(tokens) == reply and max(len(t.strip()) for t in tokens) <= 6
        sentence, end = first_sentence(reply)
        assert "".join(tokens[: end + 1]).strip() == sentence and sentence[-1] in ".。"
    # A player starting with the first frame: 1 s of audio at t=0, the next 1 s at t=1.5 (ran dry
    # for 0.5 s), then 2 s at t=2.0 (it had until 2.5: no wait).
    assert playback_gaps([(0.0, 1.0), (1.5, 1.0), (2.0, 2.0)]) == (0.5, 1)
    assert playback_gaps([(10.0, 0.5), (10.2, 0.5), (10.9, 0.1)]) == (0.0, 0)
    assert playback_gaps([]) == (0.0, 0)
    # Starting 0.5 s after the first frame, the player above never waits.
    assert buffer_needed([(0.0, 1.0), (1.5, 1.0), (2.0, 2.0)]) == 0.5
    assert buffer_needed([(10.0, 0.5), (10.2, 0.5), (10.9, 0.1)]) == 0.0
