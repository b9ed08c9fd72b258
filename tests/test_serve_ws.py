"""``WS /v1/audio/speech/stream`` end to end: the session app on Ray Serve (tiny random weights)
through Serve's HTTP proxy, with a real WebSocket client (``websockets``).

Text goes in as an LLM would write it (deltas cut mid-word and mid-sentence); audio comes back
in binary frames between ``segment.start`` and ``segment.done`` events. Session logic alone,
without Ray: tests/test_realtime.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any, AsyncIterator, Optional, Union

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from serve_fixtures import APP_NAME, acoustic_stats, app_args, report
from stream_helpers import assert_same_audio, deltas
from waiting import wait_until_async

# Two sentences over 60 characters each: with the app's segments.max_chars of 120 one HTTP request
# makes a segment of each, as the session's cuts at sentence ends do (the test asserts it).
S1 = "The quick brown fox jumps over the lazy dog near the quiet river."
S2 = " Seven small birds were singing their songs in the tall green trees."
TEXT = S1 + S2
# Four long sentences: rows still decoding while the first ones play.
LONG = "".join(f" Sentence {w} is a long line of words that keeps the decoder busy for a while." for w in
               ("one", "two", "three", "four"))


def ws_url(app_url: str) -> str:
    return app_url.replace("http://", "ws://") + "/v1/audio/speech/stream"


class Session:
    """The client side of one session: events and audio as they arrive, and how it closed."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.events: list[dict] = []
        self.audio = bytearray()
        self.frames = 0
        self.close_code: Optional[int] = None

    async def send(self, **message: Any) -> None:
        await self.ws.send(json.dumps(message))

    async def recv(self, timeout: float = 120) -> Union[bytes, dict, None]:
        """The next frame (bytes) or event (dict); None once closed (``close_code`` set)."""
        try:
            item = await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None
            return None
        if isinstance(item, bytes):
            self.audio += item
            self.frames += 1
            return item
        event = json.loads(item)
        self.events.append(event)
        return event

    async def until(self, kind: str, timeout: float = 120) -> dict:
        while True:
            item = await self.recv(timeout)
            assert item is not None, f"closed ({self.close_code}) waiting for {kind}; events {self.events}"
            if isinstance(item, dict) and item["type"] == kind:
                return item

    async def first_frame(self, timeout: float = 120) -> None:
        while not isinstance(await self.recv(timeout), bytes):
            assert self.close_code is None, f"closed ({self.close_code}); events {self.events}"

    async def closed(self, timeout: float = 120) -> int:
        while await self.recv(timeout) is not None:
            pass
        return self.close_code

    def of(self, kind: str) -> list[dict]:
        return [e for e in self.events if e["type"] == kind]


@contextlib.asynccontextmanager
async def session(app_url: str, headers: Optional[dict] = None, **start: Any) -> AsyncIterator[Session]:
    async with connect(ws_url(app_url), additional_headers=headers, max_size=None, open_timeout=60) as ws:
        s = Session(ws)
        await s.send(type="session.start", **start)
        yield s


def http_pcm(app_url: str, text: str, **body: Any) -> bytes:
    r = httpx.post(app_url + "/v1/audio/speech", json={"model": "chattts", "input": text, "response_format": "pcm", **body},
                   headers={"Cache-Control": "no-store"}, timeout=180)
    assert r.status_code == 200, r.text[:300]
    return r.content


async def rows_at_least(n: int) -> dict:
    return await wait_until_async(lambda: asyncio.to_thread(acoustic_stats), 60, 0.02,
                                  until=lambda s: s["running_rows"] + s["waiting_rows"] >= n, what=f"{n} rows decoding")


async def idle_stats(timeout_s: float = 10) -> dict:
    return await wait_until_async(lambda: asyncio.to_thread(acoustic_stats), timeout_s, 0.05,
                                  until=lambda s: s["running_rows"] == 0 and s["waiting_rows"] == 0,
                                  what="the acoustic engine idle")


# ---------------------------------------------------------------------------------------- audio


async def test_deltas_give_the_same_audio_as_one_http_request(app_url):
    from serve_app.engine.planner import Planner
    from serve_app.engine.types import SynthesisOptions

    plan = Planner(app_args().segments).plan(TEXT, SynthesisOptions(voice="echo", seed=99))
    assert plan.texts == [S1.strip(), S2.strip()], "premise: HTTP cuts this text at its sentence end"
    reference = await asyncio.to_thread(http_pcm, app_url, TEXT, voice="echo", seed=99)

    async with session(app_url, voice="echo", seed=99, response_format="pcm") as s:
        created = await s.until("session.created")
        assert created["response_format"] == "pcm" and created["weights"] == "random" and created["id"]
        for d in deltas(TEXT):
            await s.send(type="text.append", text=d)
        await s.send(type="close")
        assert await s.closed() == 1000
    assert [e["text"] for e in s.of("segment.start")] == plan.texts
    assert [e["index"] for e in s.of("segment.done")] == [0, 1]
    assert s.events[-1]["type"] == "done" and s.events[-1]["segments"] == 2
    assert_same_audio(bytes(s.audio), reference)
    # Another seed is other audio: the comparison can fail.
    other = await asyncio.to_thread(http_pcm, app_url, TEXT, voice="echo", seed=100)
    with pytest.raises(AssertionError):
        assert_same_audio(other, reference)


async def test_first_audio_arrives_before_the_next_text_is_sent(app_url):
    async with session(app_url, voice="fable", response_format="pcm") as s:
        await s.until("session.created")
        t0 = time.perf_counter()
        for d in deltas(S1 + " Sev", seed=1):
            await s.send(type="text.append", text=d)
        sent = time.perf_counter()
        await s.first_frame()
        first = time.perf_counter()
        assert s.of("segment.start") == [{"type": "segment.start", "index": 0, "text": S1}]
        await s.send(type="text.append", text=S2[4:])  # only now: the rest of the second sentence
        await s.send(type="close")
        assert await s.closed() == 1000
    assert [e["index"] for e in s.of("segment.done")] == [0, 1]
    report("ws: first audio after the first sentence's last delta", f"{1000 * (first - sent):.0f} ms ({1000 * (sent - t0):.0f} ms to send it)")


@pytest.mark.parametrize("fmt, demuxer", [("opus", "ogg"), ("mp3", "mp3")])
async def test_opus_and_mp3_are_one_stream_per_session(app_url, fmt, demuxer):
    import io

    import av

    async with session(app_url, response_format=fmt) as s:
        await s.until("session.created")
        for d in deltas(TEXT, seed=2):
            await s.send(type="text.append", text=d)
        await s.send(type="close")
        assert await s.closed() == 1000
    with av.open(io.BytesIO(bytes(s.audio)), format=demuxer) as container:
        stream = container.streams.audio[0]
        decoded = sum(f.samples for f in container.decode(stream))
        rate = stream.codec_context.sample_rate
    want = s.events[-1]["audio_seconds"]
    assert want <= decoded / rate <= want + 0.15, (decoded / rate, want)
    if fmt == "opus":  # one logical stream: one header, one serial number
        assert bytes(s.audio).count(b"OpusHead") == 1


# ---------------------------------------------------------------------------------------- barge-in


async def test_cancel_stops_audio_and_frees_the_rows(app_url):
    before = await idle_stats()
    # clause_seconds under a sentence's length: each sentence is a segment at once, none held back.
    async with session(app_url, voice="onyx", response_format="pcm", clause_seconds=1.0) as s:
        await s.until("session.created")
        await s.send(type="text.append", text=LONG)
        await s.first_frame()
        during = await rows_at_least(2)  # the second joins once the first has audio; two at once
        await s.send(type="cancel")
        t_cancel = time.perf_counter()
        ack = await s.until("cancelled")
        acked = time.perf_counter()
        assert ack["segments"] == [0, 1, 2, 3]
        after = await idle_stats()
        freed = time.perf_counter()
        assert after["rows_cancelled"] - before["rows_cancelled"] == 2  # the others never started
        assert after["rows_finished"] == before["rows_finished"], "a cancelled row ran to its end"
        # No frame of the dropped segments follows; the session goes on with new text.
        frames = s.frames
        await s.send(type="text.append", text="Back again.")
        await s.send(type="close")
        assert await s.recv() == {"type": "segment.start", "index": 4, "text": "Back again."}
        assert s.frames == frames
        assert await s.closed() == 1000
    assert s.events[-1] == {"type": "done", "segments": 1, "audio_seconds": s.of("segment.done")[-1]["audio_seconds"]}
    report("ws: cancel", f"acknowledged after {1000 * (acked - t_cancel):.0f} ms, rows freed after "
           f"{1000 * (freed - t_cancel):.0f} ms, {after['row_steps'] - during['row_steps']} row-steps decoded "
           f"from the first frame to idle")


async def test_disconnect_cancels_the_rows(app_url):
    before = await idle_stats()
    async with session(app_url, response_format="pcm", clause_seconds=1.0) as s:
        await s.send(type="text.append", text=LONG)
        await s.first_frame()
        await rows_at_least(2)
    after = await idle_stats()
    assert after["rows_cancelled"] - before["rows_cancelled"] == 2
    assert after["rows_finished"] == before["rows_finished"]


async def test_custom_voice_by_id_or_name(app_url):
    r = await asyncio.to_thread(httpx.post, app_url + "/v1/audio/voices", json={"name": "ws-narrator", "seed": 4321}, timeout=60)
    assert r.status_code in (200, 201), r.text[:300]
    voice_id = r.json()["id"]
    try:
        reference = await asyncio.to_thread(http_pcm, app_url, "A custom voice.", voice=voice_id, seed=8)
        for voice in ({"id": voice_id}, "ws-narrator"):
            async with session(app_url, voice=voice, seed=8, response_format="pcm") as s:
                await s.until("session.created")
                await s.send(type="text.append", text="A custom voice.")
                await s.send(type="close")
                assert await s.closed() == 1000
            assert_same_audio(bytes(s.audio), reference)
    finally:
        await asyncio.to_thread(httpx.delete, app_url + f"/v1/audio/voices/{voice_id}", timeout=60)


# ---------------------------------------------------------------------------------------- errors


BAD = {
    "not JSON": (["{nope"], 4400, "invalid_json"),
    "text before options": ([{"type": "text.append", "text": "hi"}], 4400, "session_not_started"),
    "unknown type": ([{"type": "session.start"}, {"type": "speak", "text": "hi"}], 4400, "unknown_type"),
    "bad option": ([{"type": "session.start", "speed": 9}], 4400, "invalid_value"),
    "unknown voice": ([{"type": "session.start", "voice": "nobody"}], 4404, "voice_not_found"),
    "unknown model": ([{"type": "session.start", "model": "whisper-1"}], 4404, "model_not_found"),
    "oversized text": ([{"type": "session.start"}, {"type": "text.append", "text": "好" * 5000}], 4413, "input_too_long"),
    "binary frame": ([{"type": "session.start"}, b"\x00\x01"], 4400, "invalid_message"),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_messages_get_an_error_event_and_a_clean_close(app_url, case):
    messages, code, error_code = BAD[case]
    async with connect(ws_url(app_url), open_timeout=60) as ws:
        s = Session(ws)
        for m in messages:
            await ws.send(m if isinstance(m, (str, bytes)) else json.dumps(m))
        assert await s.closed() == code
    errors = s.of("error")
    assert len(errors) == 1 and errors[0]["error"]["code"] == error_code, s.events
    assert set(errors[0]["error"]) == {"message", "type", "param", "code"}
    assert s.frames == 0


async def test_still_serves_after_bad_sessions(app_url):
    async with session(app_url, response_format="pcm") as s:
        await s.until("session.created")
        await s.send(type="text.append", text="Still here.")
        await s.send(type="close")
        assert await s.closed() == 1000
    assert len(s.audio) > 0 and s.of("done")
    assert len(await asyncio.to_thread(http_pcm, app_url, "Still here, over HTTP.")) > 0


# ---------------------------------------------------------------------------------------- keys


@contextlib.asynccontextmanager
async def security(**settings: Any) -> AsyncIterator[None]:
    """The Ingress's security settings changed live (its user_config), then back to defaults."""
    from ray import serve

    from serve_app.settings import SecuritySettings

    ingress = serve.get_app_handle(APP_NAME)
    await ingress.reconfigure.remote({"security": {**SecuritySettings().model_dump(), **settings}})
    try:
        yield
    finally:
        await ingress.reconfigure.remote({"security": SecuritySettings().model_dump()})


async def test_api_keys_and_stream_limit(app_url, tmp_path):
    keys = tmp_path / "keys.txt"
    keys.write_text("sk-ws-one\n")
    async with security(api_keys_env=None, api_keys_file=str(keys), max_streams_per_key=1):
        async with session(app_url) as s:  # no key
            assert await s.closed() == 4401
            assert s.of("error")[0]["error"]["code"] == "invalid_api_key"
        async with session(app_url, api_key="sk-wrong") as s:
            assert await s.closed() == 4401
        # The key in the handshake's header, or in the first message.
        async with session(app_url, headers={"Authorization": "Bearer sk-ws-one"}, response_format="pcm") as s:
            await s.until("session.created")
            async with session(app_url, api_key="sk-ws-one") as second:  # one stream per key
                assert await second.closed() == 4429
                assert second.of("error")[0]["error"]["code"] == "too_many_streams"
            await s.send(type="text.append", text="Keyed.")
            await s.send(type="close")
            assert await s.closed() == 1000
        async with session(app_url, api_key="sk-ws-one", response_format="pcm") as s:  # the slot was released
            await s.until("session.created")
            await s.send(type="close")
            assert await s.closed() == 1000


# ---------------------------------------------------------------------------------------- client


async def test_python_client_stream_text_and_session(app_url):
    from serve_app.tools.client import AsyncSpeechClient, SpeechError

    async def llm() -> AsyncIterator[str]:
        for d in deltas(TEXT, seed=3):
            yield d
            await asyncio.sleep(0.005)

    reference = await asyncio.to_thread(http_pcm, app_url, TEXT, voice="sage", seed=5)
    events: list[dict] = []
    async with AsyncSpeechClient(app_url) as client:
        audio = b"".join([b async for b in client.stream_text(llm(), voice="sage", seed=5, on_event=events.append)])
        assert_same_audio(audio, reference)
        assert [e["type"] for e in events][-1] == "done" and len([e for e in events if e["type"] == "segment.done"]) == 2

        with pytest.raises(SpeechError) as info:
            async for _ in client.stream_text(llm(), voice="nobody"):
                pass
        assert info.value.status == 404 and info.value.code == "voice_not_found"

        async def broken() -> AsyncIterator[str]:
            yield "The source fails "
            raise RuntimeError("the LLM stream broke")

        with pytest.raises(RuntimeError, match="LLM stream broke"):  # the source's error, not a close
            async for _ in client.stream_text(broken()):
                pass

        # Barge-in through the session API: cancel, then more text in the same session.
        async with client.session(voice="sage", clause_seconds=1.0) as s:
            await s.append(LONG)
            items = s.receive()
            assert (await items.__anext__())["type"] == "session.created"
            while not isinstance(await items.__anext__(), bytes):
                pass
            await s.cancel()
            while (event := await items.__anext__()) is not None and not (isinstance(event, dict) and event["type"] == "cancelled"):
                pass
            await s.append("After the cancel.")
            await s.close()
            after = [item async for item in items]
        assert after[0] == {"type": "segment.start", "index": 4, "text": "After the cancel."}
        assert after[-1]["type"] == "done" and after[-1]["segments"] == 1
