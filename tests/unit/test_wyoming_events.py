"""The Wyoming server's mapping between events and the service, with no I/O but a stream reader:
PCM into audio events, what a synthesize asks of the service, the bounded event reader, info and
error events, the service's failures as errors, and the settings."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.event import Event
from wyoming.info import Info
from wyoming.tts import Synthesize, SynthesizeStart, SynthesizeVoice

from serve_app.client import SpeechError
from serve_app.errors import APIError
from serve_app.wyoming import WyomingConfig
from serve_app.wyoming.events import (
    MAX_LISTED_VOICES,
    PcmChunks,
    SynthesizeData,
    SynthesizeStartData,
    check_text,
    error_event,
    info_event,
    lang_of,
    parse,
    read_event,
    speech_options,
)
from serve_app.wyoming.service import builtin_cards, service_error

BASE = "http://svc:8000"


# ------------------------------------------------------------------ PCM into audio events


def test_pcm_chunks_keep_samples_whole_and_small():
    audio = PcmChunks(samples_per_chunk=4, rate=1000)
    first = audio.feed(b"\x01\x02\x03")  # a sample and a half
    assert [e.type for e in first] == ["audio-start", "audio-chunk"]
    assert AudioStart.from_event(first[0]).rate == 1000
    assert AudioChunk.from_event(first[1]).audio == b"\x01\x02"
    rest = audio.feed(b"\x04" + bytes(range(10, 30)))  # the odd byte joins the next piece
    chunks = [AudioChunk.from_event(e) for e in rest]
    assert all(e.type == "audio-chunk" for e in rest)
    assert [len(c.audio) for c in chunks] == [8, 8, 6]  # at most 4 samples each, all whole
    assert chunks[0].audio[:2] == b"\x03\x04"
    assert [c.timestamp for c in chunks] == [1, 5, 9]  # ms from the first sample at 1 kHz
    assert (chunks[0].rate, chunks[0].width, chunks[0].channels) == (1000, 2, 1)
    (stop,) = audio.stop()
    assert AudioStop.from_event(stop).timestamp == 12 and audio.samples == 12


def test_pcm_chunks_without_audio_still_start_and_stop():
    assert [e.type for e in PcmChunks(1024).stop()] == ["audio-start", "audio-stop"]
    audio = PcmChunks(1024)
    assert [e.type for e in audio.feed(b"\x01")] == ["audio-start"]  # one byte is no sample yet
    assert audio.feed(b"") == [] and audio.samples == 0


# ------------------------------------------------------------------ synthesize -> the service's options


@pytest.mark.parametrize(
    "language, lang", [("en", "en"), ("en_US", "en"), ("zh-CN", "zh"), ("ZH_tw", "zh"), ("de_DE", None), (None, None)]
)
def test_language_tags_map_to_the_service_lang(language, lang):
    assert lang_of(language) == lang


def test_synthesize_options():
    event = Synthesize(text="hi", voice=SynthesizeVoice(name="nova")).event()
    options = speech_options(parse(SynthesizeData, event), default_voice="alloy")
    assert (options.voice, options.lang, options.input_format) == ("nova", None, None)
    # A language alone keeps the default voice and picks lang; SSML goes to the HTTP API as SSML.
    raw = Event("synthesize", {"text": "<speak>hi</speak>", "voice": {"language": "zh_CN"}, "text_format": "ssml"})
    options = speech_options(parse(SynthesizeData, raw), default_voice="echo")
    assert options.http_fields() == {"lang": "zh", "input_format": "ssml"} and options.voice == "echo"
    with pytest.raises(APIError) as exc:
        options.session_fields()  # the WebSocket takes plain text only
    assert exc.value.status == 400 and exc.value.param == "text_format"
    start = speech_options(parse(SynthesizeStartData, SynthesizeStart().event()), default_voice="alloy")
    assert start.session_fields() == {"lang": None} and start.voice == "alloy"


@pytest.mark.parametrize(
    "data, code, param",
    [
        ({}, "missing_required_parameter", "text"),
        ({"text": 5}, "invalid_value", "text"),
        ({"text": "x", "voice": {"name": ""}}, "invalid_value", "voice.name"),
        ({"text": "x", "text_format": "markdown"}, "invalid_value", "text_format"),
    ],
)
def test_bad_synthesize_data_is_a_400_naming_the_field(data, code, param):
    with pytest.raises(APIError) as exc:
        parse(SynthesizeData, Event("synthesize", data))
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, code, param)


def test_text_bounds():
    assert check_text("x" * 10, 10) == "x" * 10
    with pytest.raises(APIError) as exc:
        check_text("x" * 11, 10)
    assert (exc.value.status, exc.value.code) == (413, "request_too_large")
    with pytest.raises(APIError):
        check_text("a\x00b", 10)


# ------------------------------------------------------------------ the bounded reader


def _reader(data: bytes, limit: int = 2**16) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=limit)
    reader.feed_data(data)
    reader.feed_eof()
    return reader


async def test_read_event_merges_data_and_takes_a_payload():
    extra = json.dumps({"text": "你好"}).encode()
    header = {"type": "synthesize", "data": {"voice": {"name": "nova"}}, "data_length": len(extra), "payload_length": 3}
    event = await read_event(_reader(json.dumps(header).encode() + b"\n" + extra + b"abc"), 1024)
    assert event.type == "synthesize" and event.payload == b"abc"
    assert event.data == {"voice": {"name": "nova"}, "text": "你好"}
    assert await read_event(_reader(b""), 1024) is None  # the client hung up


@pytest.mark.parametrize(
    "raw, status, code",
    [
        (b'{"type": "synthesize", "data_length": 1000000000}\n', 413, "request_too_large"),  # refused before reading
        (b'{"type": "audio-chunk", "payload_length": 5000}\n', 413, "request_too_large"),
        (b"not json\n", 400, "invalid_json"),
        (b'{"data": {}}\n', 400, "invalid_value"),
        (b'{"type": "x", "data_length": -1}\n', 400, "invalid_value"),
        (b'{"type": "x", "data_length": 2}\n[]', 400, "invalid_value"),
        (b'{"type": "x", "data": {"text": "' + b"y" * 200 + b'"}}\n', 413, "request_too_large"),  # the line's limit
    ],
)
async def test_read_event_refuses_what_it_cannot_bound(raw, status, code):
    with pytest.raises(APIError) as exc:
        await read_event(_reader(raw, limit=128), 1024)
    assert (exc.value.status, exc.value.code) == (status, code)


# ------------------------------------------------------------------ events out


def test_info_lists_voices_with_their_languages():
    grandma = {"id": "voice_abc", "name": "grandma", "kind": "clip"}
    cards = builtin_cards() + [grandma, {**grandma, "id": "voice_def"}]  # two owners' voices of one name: listed once
    info = Info.from_event(info_event(cards, "1.2.3"))
    (program,) = info.tts
    assert program.supports_synthesize_streaming and program.version == "1.2.3"
    assert [v.name for v in program.voices] == [c["name"] for c in builtin_cards()] + ["grandma"]
    assert {tuple(v.languages) for v in program.voices} == {("en", "zh")}
    assert "clip" in program.voices[-1].description
    many = [{"name": f"v{i}"} for i in range(MAX_LISTED_VOICES + 10)]
    assert len(Info.from_event(info_event(many, None)).tts[0].voices) == MAX_LISTED_VOICES


def test_error_events_carry_message_and_code():
    event = error_event(APIError(404, "unknown voice 'x'", code="voice_not_found"))
    assert event.type == "error" and event.data == {"text": "unknown voice 'x'", "code": "voice_not_found"}
    assert error_event(APIError(500, "failed")).data["code"] == "500"  # no code: the status


# ------------------------------------------------------------------ the service's failures


def test_service_errors_keep_the_service_message_and_code():
    body = {
        "error": {
            "message": "unknown voice 'zz'",
            "type": "invalid_request_error",
            "param": "voice",
            "code": "voice_not_found",
        }
    }
    err = service_error(SpeechError(404, body), BASE)
    assert (err.status, err.message, err.code, err.param) == (404, "unknown voice 'zz'", "voice_not_found", "voice")
    closed = service_error(SpeechError(1006, "connection closed (1006)"), BASE)  # a socket that just dropped
    assert (closed.status, closed.code) == (502, "service_error")
    down = service_error(httpx.ConnectError("All connection attempts failed"), BASE)
    assert (down.status, down.code) == (503, "service_unavailable") and BASE in down.message
    assert service_error(ConnectionRefusedError(111, "refused"), BASE).code == "service_unavailable"
    assert service_error(httpx.ReadTimeout("slow"), BASE).code == "timeout"
    assert service_error(httpx.RemoteProtocolError("peer closed"), BASE).code == "service_error"
    internal = service_error(KeyError("secret internals"), BASE)
    assert internal.status == 500 and "secret" not in internal.message


# ------------------------------------------------------------------ settings


def test_settings_from_the_environment_and_flags(tmp_path):
    env = {"CHATTTS_BASE_URL": "https://tts.example/", "CHATTTS_API_KEY": "sk-env\n"}
    s = WyomingConfig.from_env(env)
    assert s.base_url == "https://tts.example" and s.key == "sk-env" and s.uri == "tcp://0.0.0.0:10200"
    assert "sk-env" not in repr(s)  # the key stays out of logs and tracebacks
    key_file = tmp_path / "key"
    key_file.write_text("sk-file\n")
    s = WyomingConfig.from_env(
        env,
        key_file=key_file,
        base_url="http://other:9000",
        uri="tcp://127.0.0.1:10300",
        max_text_chars=100,
        voice=None,
    )
    assert (s.base_url, s.key, s.uri, s.voice) == ("http://other:9000", "sk-file", "tcp://127.0.0.1:10300", "alloy")
    assert s.limits.max_text_chars == 100 and s.limits.max_synthesize_per_connection == 2
    assert WyomingConfig.from_env({}).key is None


@pytest.mark.parametrize(
    "given", [{"uri": "tcp://host"}, {"uri": "stdio://"}, {"base_url": "ftp://x"}, {"max_connections": 0}]
)
def test_settings_refuse_what_cannot_work(given):
    with pytest.raises(ValueError):
        WyomingConfig.from_env({}, **given)
