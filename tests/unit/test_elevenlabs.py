"""The ElevenLabs door without Ray: its messages and query strings (protocol/elevenlabs.py), the
estimated alignment (elevenlabs/alignment.py), and its sockets (elevenlabs/socket.py) over an
in-memory transport against the real engine in this process (``support.ws.InProcess``: planner,
continuously batched decode loop, vocoder, encoders). The plugins themselves, through Serve:
tests/serve/test_elevenlabs_plugins.py."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from typing import Any, Optional

import pytest
from pydantic import ValidationError
from support.ws import MemoryTransport, assert_same_audio, deltas

from serve_app.elevenlabs.alignment import StreamAligner, Track
from serve_app.elevenlabs.socket import ElevenLabsSocket, OpenedContext, receive_stream_input
from serve_app.engine.audio import SAMPLE_RATE
from serve_app.engine.types import SynthesisOptions
from serve_app.errors import APIError
from serve_app.protocol import CLAUSE_SECONDS
from serve_app.protocol.elevenlabs import (
    OUTPUT_FORMATS,
    StreamInputMessage,
    StreamInputParams,
    TextToSpeechParams,
    TextToSpeechRequest,
    context_start,
    speech_request,
)
from serve_app.realtime import SessionLimits

# ---------------------------------------------------------------------------------------- protocol


def test_output_formats_name_the_service_encoders():
    assert OUTPUT_FORMATS["pcm_24000"] == "pcm"  # the model's own rate: no resampling
    assert {OUTPUT_FORMATS[f"pcm_{r}"] for r in (8000, 16000, 22050, 32000, 44100, 48000)} == {
        f"pcm_{r}" for r in (8000, 16000, 22050, 32000, 44100, 48000)
    }
    assert OUTPUT_FORMATS["ulaw_8000"] == "ulaw" and OUTPUT_FORMATS["mp3_44100_128"] == "mp3"
    assert StreamInputParams().encoder_format == "mp3"  # ElevenLabs' default, mp3_44100_128
    with pytest.raises(ValidationError, match="output_format must be one of"):
        StreamInputParams(output_format="pcm_11025")


def test_pipecat_query_string_is_read():
    params = StreamInputParams.model_validate(
        {
            "model_id": "eleven_turbo_v2_5",
            "output_format": "pcm_16000",
            "auto_mode": "true",
            "enable_ssml_parsing": "false",
            "apply_text_normalization": "off",
            "language_code": "en",
            "some_future_switch": "1",  # ignored, as ElevenLabs ignores it
        }
    )
    assert params.auto_mode and params.encoder_format == "pcm_16000"
    start = context_start("nova", params, None)
    assert (start.voice, start.lang, start.text_normalization) == ("nova", "en", "off")


def test_messages_of_the_plugins_parse():
    init = StreamInputMessage.model_validate(
        {"text": " ", "context_id": "c1", "voice_settings": {"stability": 0.5, "speed": 1.1, "style": 0.1}}
    )
    assert init.context_id == "c1" and init.voice_settings.speed == 1.1
    assert context_start("nova", StreamInputParams(), init.voice_settings).to_options().speed == 1.1
    assert StreamInputMessage.model_validate({"contextId": "c2", "close_context": True}).context_id == "c2"
    assert StreamInputMessage.model_validate({"text": ""}).text == ""
    key = StreamInputMessage.model_validate({"text": " ", "xi-api-key": "k1"})
    assert key.api_key == "k1"
    assert StreamInputMessage.model_validate({"text": " ", "authorization": "Bearer k2"}).api_key == "k2"
    ignored = StreamInputMessage.model_validate(
        {"text": "Hi.", "try_trigger_generation": True, "generation_config": {"chunk_length_schedule": [50, 120]}}
    )
    assert ignored.text == "Hi."
    for bad in ({"text": "a\x00b"}, {"text": " ", "voice_settings": {"speed": 9}}, {"context_id": "x" * 129}):
        with pytest.raises(ValidationError):
            StreamInputMessage.model_validate(bad)


def test_http_body_on_the_service_terms():
    body = TextToSpeechRequest.model_validate(
        {"text": "Hello there.", "model_id": "eleven_multilingual_v2", "voice_settings": {"speed": 0.9}, "seed": 7}
    )
    req = speech_request("echo", body, TextToSpeechParams(output_format="pcm_22050"))
    assert (req.voice, req.speed, req.seed, req.response_format) == ("echo", 0.9, 7, "pcm_22050")
    assert req.content_type == "audio/pcm"
    with pytest.raises(ValidationError):
        TextToSpeechRequest(text="   ")
    with pytest.raises(ValidationError):  # a voice the service cannot name: 400 on the voice
        speech_request("x" * 10_000, body, TextToSpeechParams())


async def test_hostile_frames_are_refused_before_parsing():
    t = MemoryTransport()
    limits = SessionLimits(max_message_bytes=64)
    for raw, code in (("[1]", "invalid_message"), ("{nope", "invalid_json"), ('{"text": "' + "a" * 100 + '"}', None)):
        t.send_raw(text=raw)
        with pytest.raises(APIError) as e:
            await receive_stream_input(t, limits)
        assert e.value.status in (400, 413) and (code is None or e.value.code == code)


# ---------------------------------------------------------------------------------------- alignment


def test_track_spreads_a_segment_and_never_passes_the_audio_sent():
    track = Track()
    track.add("abcd", 0, 400)
    first = track.take(150)  # a, b start before 150
    assert first.chars == ["a", "b"] and first.starts == [0, 100] and first.ends == [100, 150]
    second = track.take(1000)
    assert second.chars == ["c", "d"] and second.since == 150 and second.ends[-1] == 1000
    assert max(first.ends + second.ends) <= 1000


def test_segment_shorter_than_expected_places_the_rest_at_its_end():
    aligner = StreamAligner("pcm")
    aligner.segment("Hello world.", "Hello world.", 24_000)
    placed, _ = aligner.audio(2 * 6_000)  # a quarter of what was expected
    rest, _ = aligner.end_segment()
    assert "".join(placed.chars + rest.chars) == "Hello world."
    assert set(rest.starts) == {6_000} and rest.starts == rest.ends  # no duration, no invented audio
    relative = placed.relative()
    assert relative.charStartTimesMs[0] == 0 and relative.charStartTimesMs[-1] + relative.charDurationsMs[-1] == 250


def test_alignment_of_other_formats_uses_their_byte_rate():
    aligner = StreamAligner("ulaw")  # 8 kHz, a byte a sample
    aligner.segment("ab", "ab", 2 * SAMPLE_RATE)
    placed, _ = aligner.audio(8000)  # one second
    assert placed.chars == ["a"] and placed.relative().charDurationsMs == [1000]


# ---------------------------------------------------------------------------------------- the socket, in process


class Client:
    """An ElevenLabs socket served in this process, seen from its client: ``send``, then
    ``messages`` as they come; ``opened`` / ``released``: contexts admitted and given back."""

    def __init__(self, backend, multi: bool = True, query: Optional[dict] = None, limits=None):
        self.t = MemoryTransport()
        self.params = StreamInputParams.model_validate({"output_format": "pcm_24000", **(query or {})})
        self.opened: list[SynthesisOptions] = []
        self.released = 0
        self.messages: list[dict] = []
        self.close_code: Optional[int] = None

        async def open_context(first: StreamInputMessage) -> OpenedContext:
            options = context_start("nova", self.params, first.voice_settings).to_options()
            self.opened.append(options)
            return OpenedContext(backend, options, self._release)

        sock = ElevenLabsSocket(self.t, self.params, multi, open_context, limits or SessionLimits(), CLAUSE_SECONDS)
        self.task = asyncio.ensure_future(sock.run())

    def _release(self) -> None:
        self.released += 1

    def send(self, **message: Any) -> None:
        self.t.send(**message)

    async def recv(self, timeout: float = 60) -> Optional[dict]:
        if self.close_code is not None:
            return None
        item = await self.t.next(timeout)
        if isinstance(item, tuple):
            self.close_code = item[1]
            return None
        self.messages.append(item)
        return item

    async def until(self, pred, timeout: float = 60) -> dict:
        while True:
            m = await self.recv(timeout)
            assert m is not None, f"closed {self.close_code} before the message: {self.messages[-3:]}"
            if pred(m):
                return m

    async def closed(self, timeout: float = 60) -> int:
        while await self.recv(timeout) is not None:
            pass
        return self.close_code  # type: ignore[return-value]

    def audio(self, cid: Optional[str] = None) -> bytes:
        return b"".join(
            base64.b64decode(m["audio"]) for m in self.messages if "audio" in m and m.get("contextId") == cid
        )

    def chars(self, cid: Optional[str] = None) -> str:
        return "".join(
            "".join(m["alignment"]["chars"]) for m in self.messages if m.get("alignment") and m.get("contextId") == cid
        )


@contextlib.asynccontextmanager
async def client(backend, **kw):
    c = Client(backend, **kw)
    try:
        yield c
    finally:
        if not c.task.done():
            c.t.disconnect()
        await asyncio.wait_for(c.task, 30)


async def test_tokens_of_a_context_give_one_requests_audio(inprocess_ws):
    """Pipecat's sequence: context init (" ", voice settings), tokens, flush, close_context at the
    end of the turn: the audio is what one request of the text gives, the alignment spells the
    text as received, and its spans never pass the audio."""
    text = "".join(inprocess_ws.sentences)
    reference = await inprocess_ws.reference(text, voice="nova")
    async with client(inprocess_ws.backend) as c:
        c.send(text="")  # a keep-alive before any context: opens nothing
        c.send(text=" ", context_id="turn-1", voice_settings={"speed": 1.0, "stability": 0.5})
        for d in deltas(text, seed=3):
            c.send(text=d, context_id="turn-1")
        c.send(context_id="turn-1", flush=True)
        c.send(context_id="turn-1", close_context=True)
        final = await c.until(lambda m: m.get("isFinal"))
        assert final == {"isFinal": True, "contextId": "turn-1"}
        c.send(close_socket=True)
        assert await c.closed() == 1000
    assert len(c.opened) == 1 and c.released == 1
    assert_same_audio(c.audio("turn-1"), reference)
    assert c.chars("turn-1") == " " + text
    spans = [
        m["alignment"]["charStartTimesMs"][-1] + m["alignment"]["charDurationsMs"][-1]
        for m in c.messages
        if m.get("alignment")
    ]
    audio_ms = len(reference) / 2 / SAMPLE_RATE * 1000
    assert sum(spans) <= audio_ms + len(spans)  # rounding: a ms per message at most
    (_,) = {m.get("contextId") for m in c.messages}  # every message names its context


async def test_contexts_speak_side_by_side(inprocess_ws):
    """Two contexts at once on one socket: each is a stream of its own (admitted, given back),
    its audio what one request of its text gives, every message naming its context."""
    texts = {"x": inprocess_ws.sentences[0].strip(), "y": inprocess_ws.sentences[1].strip()}
    references = {cid: await inprocess_ws.reference(t, voice="nova") for cid, t in texts.items()}
    async with client(inprocess_ws.backend) as c:
        for cid, text in texts.items():
            c.send(text=" ", context_id=cid)
            c.send(text=text, context_id=cid)
        for cid in texts:
            c.send(context_id=cid, flush=True)
            c.send(context_id=cid, close_context=True)
        finals = set()
        while len(finals) < 2:
            m = await c.until(lambda m: m.get("isFinal"))
            finals.add(m["contextId"])
    assert finals == {"x", "y"} and len(c.opened) == 2 and c.released == 2
    for cid, text in texts.items():
        assert_same_audio(c.audio(cid), references[cid])
        assert c.chars(cid) == " " + text


async def test_close_context_mid_answer_stops_its_rows_within_a_step(inprocess_ws):
    """An interruption: close_context while the answer is being spoken cancels its rows at the
    engine's next step, no audio of it follows its isFinal, and another context goes on."""
    before = await inprocess_ws.idle()
    async with client(inprocess_ws.backend) as c:
        c.send(text=" ", context_id="a")
        c.send(text="".join(inprocess_ws.long_sentences) + " And then", context_id="a")
        await c.until(lambda m: "audio" in m)
        await inprocess_ws.rows_at_least(2)
        c.send(context_id="a", close_context=True)
        t_close = time.perf_counter()
        assert await c.until(lambda m: m.get("isFinal")) == {"isFinal": True, "contextId": "a"}
        steps_at_final = (await inprocess_ws.stats())["steps"]
        after = await inprocess_ws.idle()
        freed = time.perf_counter() - t_close
        assert after["steps"] - steps_at_final <= 1, (steps_at_final, after["steps"])
        assert after["rows_cancelled"] - before["rows_cancelled"] == 2
        assert after["rows_finished"] == before["rows_finished"], "a cancelled row ran to its end"
        n_a = len([m for m in c.messages if m.get("contextId") == "a"])
        c.send(text="Back again.", context_id="b", flush=True)
        c.send(context_id="b", close_context=True)
        await c.until(lambda m: m.get("isFinal") and m.get("contextId") == "b")
        assert len([m for m in c.messages if m.get("contextId") == "a"]) == n_a, "audio of a after its isFinal"
        assert c.audio("b")
    assert c.released == 2
    assert freed < 30


async def test_close_context_again_after_the_turn_end_stops_it(inprocess_ws):
    """Pipecat ends a turn with flush + close_context (the rest is spoken), and closes the context
    again when the user barges in while it plays: that second close stops it at once."""
    before = await inprocess_ws.idle()
    async with client(inprocess_ws.backend) as c:
        c.send(text=" ", context_id="t")
        c.send(text="".join(inprocess_ws.long_sentences), context_id="t")
        c.send(context_id="t", flush=True)
        c.send(context_id="t", close_context=True)
        await c.until(lambda m: "audio" in m)
        await inprocess_ws.rows_at_least(2)
        c.send(context_id="t", close_context=True)
        assert await c.until(lambda m: m.get("isFinal")) == {"isFinal": True, "contextId": "t"}
        after = await inprocess_ws.idle()
        assert after["rows_cancelled"] - before["rows_cancelled"] == 2
        assert after["rows_finished"] == before["rows_finished"]
    assert c.released == 1


async def test_stream_input_ends_with_empty_text(inprocess_ws):
    """stream-input: one unnamed context; {"text": ""} ends the input, the rest is spoken, isFinal,
    then the socket closes 1000."""
    async with client(inprocess_ws.backend, multi=False, query={"output_format": "ulaw_8000"}) as c:
        c.send(text=" ", voice_settings={"speed": 1.0})
        c.send(text="Short and sweet.")
        c.send(text="")
        assert await c.closed() == 1000
    assert c.messages[-1] == {"isFinal": True}
    assert len(c.audio()) > 0 and "contextId" not in c.messages[0]
    assert c.chars() == " Short and sweet."


async def test_idle_socket_is_closed(inprocess_ws):
    limits = SessionLimits(idle_s=0.3)
    async with client(inprocess_ws.backend, limits=limits) as c:
        c.send(text="")  # keep-alives reset the clock...
        await asyncio.sleep(0.2)
        c.send(text="")
        await asyncio.sleep(0.2)
        assert c.close_code is None and not c.messages
        assert await c.closed(5) == 4408  # ...silence does not
    assert c.messages[-1]["error"] == "idle_timeout" and c.messages[-1]["code"] == 4408


async def test_a_refused_context_ends_the_socket_with_its_error(inprocess_ws):
    async with client(inprocess_ws.backend, limits=SessionLimits(max_text_chars=50)) as c:
        c.send(text=" ", context_id="x")
        c.send(text="word " * 20, context_id="x")
        assert await c.closed() == 4413
    assert c.messages[-1]["error"] == "input_too_long" and c.messages[-1]["contextId"] == "x"
    assert c.released == 1
