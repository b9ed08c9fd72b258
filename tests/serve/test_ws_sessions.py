"""WebSocket session scenarios (``WS /v1/audio/speech/stream``), each run on both backends
(``support.ws``): ``in-process``, the session logic against the engine in this process (no Ray;
in the quick loop), and ``serve``, the session app on the session's Ray Serve through Serve's
HTTP proxy with a real WebSocket client (marked ``serve``).

Text goes in as an LLM would write it (deltas cut mid-word and mid-sentence); audio comes back in
binary frames between ``segment.start`` and ``segment.done`` events. What only one backend can
see is checked there: the in-process backend records what the session asked of the graph and
counts its engine's steps exactly. The session logic alone (cutting, messages, Ogg):
tests/unit/test_realtime.py; what only the server does (keys, voices, the Python client):
tests/serve/test_serve_ws.py.
"""

from __future__ import annotations

import json
import time

import pytest
from support.audio import SR, decode_av
from support.report import report
from support.ws import Served, assert_same_audio, deltas, engine_rows, ogg_pages

from serve_app.engine.pacing import SAMPLES_PER_TOKEN
from serve_app.engine.planner import segment_seed
from serve_app.realtime import SessionLimits

# An unfinished sentence after the complete ones: never cut (no sentence end, no clause mark).
UNFINISHED = " And one more sentence here"


@pytest.fixture(params=["in-process", pytest.param("serve", marks=pytest.mark.serve)])
def ws(request):
    if request.param == "in-process":
        return request.getfixturevalue("inprocess_ws")
    return Served(request.getfixturevalue("app_url"))


# ---------------------------------------------------------------------------------------- audio


async def test_deltas_give_the_same_audio_as_one_request(ws):
    text = "".join(ws.sentences)
    opts = {"voice": "nova", "seed": 1234}
    plan = ws.plan(text, **opts)
    assert plan.texts == [s.strip() for s in ws.sentences], "premise: one request cuts this text at its sentence ends"
    reference = await ws.reference(text, **opts)

    async with ws.session(response_format="pcm", **opts) as s:
        created = await s.until("session.created")
        assert created["response_format"] == "pcm" and created["weights"] == "random" and created["id"]
        if ws.in_process:
            ws.backend.opened.clear()
            ws.backend.planned.clear()
        for d in deltas(text):
            await s.send(type="text.append", text=d)
        await s.send(type="close")
        assert await s.closed() == 1000
    n = len(plan.segments)
    starts, dones = s.of("segment.start"), s.of("segment.done")
    assert [e["text"] for e in starts] == plan.texts
    assert [e["index"] for e in starts] == [e["index"] for e in dones] == list(range(n))
    # Random weights: each segment is exactly its target length, 512 samples a token less 256.
    samples = [r.target_tokens * SAMPLES_PER_TOKEN - SAMPLES_PER_TOKEN // 2 for r in plan.segments]
    assert [e["audio_seconds"] for e in dones] == [round(k / SR, 4) for k in samples]
    assert s.events[-1]["type"] == "done" and s.events[-1]["segments"] == n
    assert len(s.audio) == 2 * sum(samples) == len(reference)
    assert_same_audio(bytes(s.audio), reference)
    if ws.in_process:
        # Per-segment seeds as HTTP gives them; a segment behind unsent audio yields a priority level.
        assert (
            [r.seed for r in ws.backend.opened]
            == [r.seed for r in plan.segments]
            == [segment_seed(1234, i) for i in range(n)]
        )
        assert [r.priority for r in ws.backend.opened] == [0] + [-1] * (n - 1)
        # The first sentence was spoken at once; the next two, behind its audio, were packed into
        # one cut (under clause_seconds of speech), which the planner split as HTTP does.
        assert ws.backend.planned == [ws.sentences[0], ws.sentences[1] + ws.sentences[2]]
        _, stats = await s.result()
        assert stats.status == "done" and stats.segments == n and stats.chars == len(text)
    # Another seed is other audio: the comparison can fail.
    other = await ws.reference(text, voice="nova", seed=1235)
    with pytest.raises(AssertionError):
        assert_same_audio(other, reference)


async def test_first_audio_arrives_before_the_next_text_is_sent(ws):
    first, second = ws.sentences[0], ws.sentences[1]
    async with ws.session(voice="fable", response_format="pcm") as s:
        await s.until("session.created")
        t0 = time.perf_counter()
        for d in deltas(first + second[:4], seed=1):  # the next sentence has only begun
            await s.send(type="text.append", text=d)
        sent = time.perf_counter()
        await s.first_frame()
        first_audio = time.perf_counter()
        assert s.of("segment.start") == [{"type": "segment.start", "index": 0, "text": first.strip()}]
        await s.send(type="text.append", text=second[4:])  # only now: the rest of the second sentence
        await s.send(type="text.flush")  # speak it now, without waiting for more text
        await s.send(type="close")
        assert await s.closed() == 1000
    assert [e["text"] for e in s.of("segment.start")] == [first.strip(), second.strip()]
    assert [e["index"] for e in s.of("segment.done")] == [0, 1]
    report(
        f"ws ({ws.name}): first audio after the first sentence's last delta",
        f"{1000 * (first_audio - sent):.0f} ms ({1000 * (sent - t0):.0f} ms to send it)",
    )


@pytest.mark.parametrize("fmt", ["opus", "mp3"])
async def test_opus_and_mp3_are_one_stream_per_session(ws, fmt):
    async with ws.session(response_format=fmt) as s:
        await s.until("session.created")
        for d in deltas("".join(ws.sentences[:2]), seed=2):
            await s.send(type="text.append", text=d)
        await s.send(type="close")
        assert await s.closed() == 1000
    assert len(s.of("segment.done")) == 2
    decoded, rate = decode_av(bytes(s.audio), fmt)
    want = s.events[-1]["audio_seconds"]
    assert want <= decoded.shape[1] / rate <= want + 0.12, (decoded.shape[1] / rate, want)
    if fmt == "opus":  # one logical stream: one header, one serial number, one end
        pages = ogg_pages(bytes(s.audio))
        assert len({p["serial"] for p in pages}) == 1 and pages[-1]["flags"] == 4
        assert bytes(s.audio).count(b"OpusHead") == 1


# ---------------------------------------------------------------------------------------- barge-in


async def test_cancel_stops_audio_and_frees_the_rows(ws):
    before = await ws.idle()
    n = len(ws.long_sentences)
    # clause_seconds under a sentence's length: each sentence is a segment at once, none held back.
    async with ws.session(voice="onyx", response_format="pcm", clause_seconds=1.0) as s:
        await s.until("session.created")
        await s.send(type="text.append", text="".join(ws.long_sentences) + UNFINISHED)
        await s.first_frame()
        during = await ws.rows_at_least(2)  # the second joins once the first has audio; two at once
        assert engine_rows(during) == SessionLimits().decoding_segments
        await s.send(type="cancel")
        t_cancel = time.perf_counter()
        ack = await s.until("cancelled")
        acked = time.perf_counter()
        steps_at_ack = (await ws.stats())["steps"]
        assert ack["segments"] == list(range(n))  # and the unfinished sentence is dropped from the buffer
        after = await ws.idle()
        freed = time.perf_counter()
        if ws.in_process:  # the rows leave the batch at the next step's end (the decode thread may be mid-step)
            assert after["steps"] - steps_at_ack <= 1, (steps_at_ack, after["steps"])
        assert after["rows_cancelled"] - before["rows_cancelled"] == 2  # the others never started
        assert after["rows_finished"] == before["rows_finished"], "a cancelled row ran to its end"
        # No frame of the dropped segments follows: the next item is the answer to new text.
        frames = s.frames
        await s.send(type="text.append", text="Back again.")
        await s.send(type="close")
        assert await s.recv() == {"type": "segment.start", "index": n, "text": "Back again."}
        assert s.frames == frames
        assert await s.closed() == 1000
    assert s.events[-1] == {"type": "done", "segments": 1, "audio_seconds": s.of("segment.done")[-1]["audio_seconds"]}
    if ws.in_process:
        _, stats = await s.result()
        assert stats.segments == 1 and stats.cancelled_segments == n
    report(
        f"ws ({ws.name}): cancel",
        f"acknowledged after {1000 * (acked - t_cancel):.0f} ms, rows freed after {1000 * (freed - t_cancel):.0f} ms",
    )


async def test_disconnect_cancels_the_rows(ws):
    before = await ws.idle()
    async with ws.session(response_format="pcm", clause_seconds=1.0) as s:
        await s.send(type="text.append", text="".join(ws.long_sentences))
        await s.first_frame()
        await ws.rows_at_least(2)
        await s.disconnect()
        if ws.in_process:
            _, stats = await s.result()
            assert stats.status == "client_disconnect"
    after = await ws.idle()
    assert after["rows_cancelled"] - before["rows_cancelled"] == 2
    assert after["rows_finished"] == before["rows_finished"]


# ---------------------------------------------------------------------------------------- errors


BAD = {
    "not JSON": (["{nope"], 4400, "invalid_json"),
    "text before options": ([{"type": "text.append", "text": "hi"}], 4400, "session_not_started"),
    "unknown type": ([{"type": "session.start"}, {"type": "speak", "text": "hi"}], 4400, "unknown_type"),
    "bad option": ([{"type": "session.start", "speed": 9}], 4400, "invalid_value"),
    "oversized text": (
        [{"type": "session.start"}, {"type": "text.append", "text": "好" * 5000}],
        4413,
        "input_too_long",
    ),
    "binary frame": ([{"type": "session.start"}, b"\x00\x01"], 4400, "invalid_message"),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_messages_get_an_error_event_and_a_clean_close(ws, case):
    messages, code, error_code = BAD[case]
    async with ws.connect() as s:
        for m in messages:
            await s.send_raw(m if isinstance(m, (str, bytes)) else json.dumps(m))
        assert await s.closed() == code
    errors = s.of("error")
    assert len(errors) == 1 and errors[0]["error"]["code"] == error_code, s.events
    assert set(errors[0]["error"]) == {"message", "type", "param", "code"}
    assert s.frames == 0
    if ws.in_process:
        _, stats = await s.result()
        assert stats.status == str(code - 4000)


async def test_still_serves_after_bad_sessions(ws):
    async with ws.session(response_format="pcm") as s:
        await s.until("session.created")
        await s.send(type="text.append", text="Still here.")
        await s.send(type="close")
        assert await s.closed() == 1000
    assert len(s.audio) > 0 and s.of("done")
    assert len(await ws.reference("Still here, without a session.")) > 0
