"""The WebSocket session logic without Ray (serve_app/realtime/): incremental cutting, the message
protocol, the one-stream Ogg Opus joiner, and what a session does with errors and empty text,
over an in-memory transport against the real engine in this process (``support.ws.InProcess``).
The session scenarios on both this backend and Serve: tests/serve/test_ws_sessions.py."""

from __future__ import annotations

import json
import random
from typing import Optional

import numpy as np
import pytest
from support.audio import decode_av
from support.ws import InProcess, MemoryTransport, ogg_pages

from serve_app.engine.audio import SAMPLE_RATE, new_encoder
from serve_app.engine.errors import EmptyInputError
from serve_app.engine.text import split_unfinished
from serve_app.engine.types import SynthesisOptions
from serve_app.errors import APIError
from serve_app.protocol import SessionStart
from serve_app.realtime import OggOpusJoiner, SessionLimits, receive_message
from serve_app.realtime.ogg import opus_packet_samples

SENTENCES = InProcess.sentences
TEXT = "".join(SENTENCES)


# ---------------------------------------------------------------------------------------- cutting


@pytest.mark.parametrize(
    "text, complete, rest",
    [
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
    ],
)
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


async def _message(text: Optional[str] = None, data: Optional[bytes] = None, limits: SessionLimits = SessionLimits()):
    t = MemoryTransport()
    t.send_raw(text, data)
    return await receive_message(t, limits)


@pytest.mark.parametrize(
    "raw, status, code, param",
    [
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
    ],
)
async def test_bad_messages_are_api_errors(raw, status, code, param):
    with pytest.raises(APIError) as info:
        await _message(raw)
    assert (info.value.status, info.value.code, info.value.param) == (status, code, param)


async def test_messages_validate_like_the_http_body():
    start = await _message(
        json.dumps(
            {
                "type": "session.start",
                "voice": "nova",
                "seed": 7,
                "speed": 1.5,
                "response_format": "opus",
                "api_key": "k",
            }
        )
    )
    assert isinstance(start, SessionStart)
    opts = start.to_options()
    assert isinstance(opts, SynthesisOptions) and (opts.voice, opts.seed, opts.speed) == ("nova", 7, 1.5)
    assert "api_key" not in repr(start)
    with pytest.raises(APIError) as info:
        await _message(data=b"\x00\x01")
    assert info.value.code == "invalid_message"


# ---------------------------------------------------------------------------------------- Ogg Opus


def _decode(data: bytes, fmt: str) -> np.ndarray:
    return decode_av(data, fmt)[0].reshape(-1)


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
            out += joiner.feed(data[pos : pos + step])
            pos += step
        joiner.end_segment()
    out += joiner.finish()
    assert joiner.finish() == b""
    pages = ogg_pages(out)
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
    pages = ogg_pages(out)
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


async def test_admit_errors_close_the_session(inprocess_ws):
    async def refuse(start: SessionStart):
        raise EmptyInputError("not a real reason, only an engine error type to map")

    async with inprocess_ws.connect(admit=refuse) as s:
        await s.send(type="session.start")
        assert await s.closed() == 4400
    assert [e["error"]["code"] for e in s.events] == ["empty_input"]


@pytest.mark.parametrize(
    "bad, status, code",
    [
        ({"type": "speak", "text": "hi"}, 400, "unknown_type"),
        ({"type": "session.start"}, 400, "session_already_started"),
        ({"type": "text.append", "text": "好" * 200}, 413, "input_too_long"),
    ],
)
async def test_bad_message_mid_session_ends_it_cleanly(inprocess_ws, bad, status, code):
    async with inprocess_ws.session(limits=SessionLimits(max_text_chars=150), response_format="pcm") as s:
        await s.until("session.created")
        await s.send(type="text.append", text=SENTENCES[0] + " Another one")
        await s.first_frame()
        await s.send(**bad)
        error = await s.until("error")
        assert error["error"]["code"] == code
        assert await s.closed() == 4000 + status
        _, stats = await s.result()
    assert stats.status == str(status)
    await inprocess_ws.idle()  # its rows are cancelled, not left decoding


async def test_nothing_speakable_is_dropped_silently(inprocess_ws):
    async with inprocess_ws.session(response_format="pcm") as s:
        await s.until("session.created")
        await s.send(type="text.append", text="... !!! ")
        await s.send(type="text.flush")
        await s.send(type="text.append", text="Fine.")
        await s.send(type="close")
        assert await s.closed() == 1000
        _, stats = await s.result()
    assert [e["text"] for e in s.of("segment.start")] == ["Fine."]
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
