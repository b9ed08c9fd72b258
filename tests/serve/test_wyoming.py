"""``chattts-serve wyoming`` against the session's Serve app, through the ``wyoming`` library's
own client (as Home Assistant talks to it): info, one text, text streamed in, errors carrying the
service's code, a client that hangs up.

Each test runs its own ``WyomingServer`` in its event loop, on a free port, in front of the app.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from typing import AsyncIterator, Optional

import pytest
from support.app import acoustic_stats, ingress_settings, wait_idle
from support.report import report
from support.ws import http_pcm
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from serve_app.engine.voices import OPENAI_VOICES
from serve_app.http.security import key_id
from serve_app.settings import SecurityConfig
from serve_app.wyoming import WyomingConfig, WyomingServer

pytestmark = pytest.mark.serve
READ_S = 60.0
# Many sentences: far more audio than the drop test waits for (its rows must be cancelled, not finish).
LONG_TEXT = "".join(f"第{n}句话在这里慢慢地说出来，一直说到很久以后才结束。" for n in range(1, 13))


@contextlib.asynccontextmanager
async def wyoming_server(app_url: str, api_key: Optional[str] = None) -> AsyncIterator[tuple[str, int]]:
    server = WyomingServer(WyomingConfig(uri="tcp://127.0.0.1:0", base_url=app_url, api_key=api_key))
    host, port = (await server.start())[0][:2]
    try:
        yield host, port
    finally:
        await server.stop()


async def read(client: AsyncTcpClient) -> Optional[Event]:
    return await asyncio.wait_for(client.read_event(), READ_S)


async def read_until(client: AsyncTcpClient, last: str) -> list[Event]:
    """Events up to and including the first of type ``last`` (or an error, or the end)."""
    events = []
    while (event := await read(client)) is not None:
        events.append(event)
        if event.type in (last, "error"):
            break
    return events


def pcm_of(events: list[Event]) -> bytes:
    return b"".join(AudioChunk.from_event(e).audio for e in events if AudioChunk.is_type(e.type))


async def test_describe_lists_the_service_voices(app_url):
    async with wyoming_server(app_url) as (host, port), AsyncTcpClient(host, port) as client:
        await client.write_event(Describe().event())
        info = Info.from_event(await read(client))
    (program,) = info.tts
    assert program.supports_synthesize_streaming and program.installed
    names = {voice.name for voice in program.voices}
    assert set(OPENAI_VOICES) <= names, names
    assert all(voice.languages == ["en", "zh"] for voice in program.voices)


async def test_synthesize_streams_the_service_pcm(app_url):
    text = "Wyoming 的一句话，完整地说出来。"
    async with wyoming_server(app_url) as (host, port), AsyncTcpClient(host, port) as client:
        t0 = time.perf_counter()
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="nova")).event())
        events = await read_until(client, "audio-chunk")
        first_s = time.perf_counter() - t0
        events += await read_until(client, "audio-stop")
        total_s = time.perf_counter() - t0
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-1] == "audio-stop", types
    assert set(types[1:-1]) == {"audio-chunk"}, types
    start = AudioStart.from_event(events[0])
    assert (start.rate, start.width, start.channels) == (24000, 2, 1)
    pcm = pcm_of(events)
    assert pcm and len(pcm) % 2 == 0
    # The same audio as the HTTP API's pcm for the same request (the test app decodes reproducibly).
    assert pcm == http_pcm(app_url, text, voice="nova")
    report(
        "wyoming: synthesize",
        f"{len(pcm) / 48000:.2f} s of audio in {types.count('audio-chunk')} chunks: "
        f"first after {1000 * first_s:.0f} ms, all after {total_s:.2f} s",
    )


async def test_streamed_text_speaks_before_the_text_ends(app_url):
    pieces = ["第一句话已经", "写完了。", "第二句还在", "路上，", "马上就到。"]
    async with wyoming_server(app_url) as (host, port), AsyncTcpClient(host, port) as client:
        t0 = time.perf_counter()
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="alloy")).event())
        for piece in pieces[:2]:
            await client.write_event(SynthesizeChunk(text=piece).event())
        early = await read_until(client, "audio-chunk")  # the first sentence is complete: its audio comes now
        first_s = time.perf_counter() - t0
        assert early[-1].type == "audio-chunk", early
        for piece in pieces[2:]:
            await client.write_event(SynthesizeChunk(text=piece).event())
        # Home Assistant sends the whole text too, for servers without streaming: not spoken twice.
        await client.write_event(Synthesize(text="".join(pieces)).event())
        await client.write_event(SynthesizeStop().event())
        events = early + await read_until(client, "synthesize-stopped")
        # The connection stays usable: a plain synthesize after the stream.
        await client.write_event(Synthesize(text="Then one more.").event())
        after = await read_until(client, "audio-stop")
    types = [e.type for e in events]
    assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"], types
    assert set(types[1:-2]) == {"audio-chunk"}, types
    pcm = pcm_of(events)
    early_pcm = pcm_of(early)
    assert len(pcm) > 2 * len(early_pcm) and len(pcm) % 2 == 0
    # Two sentences' audio, not three (the compatibility synthesize was not spoken): within the
    # length the HTTP API gives the whole text, which the session cuts into the same sentences.
    whole = http_pcm(app_url, "".join(pieces), voice="alloy")
    assert 0.8 * len(whole) < len(pcm) < 1.25 * len(whole), (len(pcm), len(whole))
    assert [e.type for e in after][-1] == "audio-stop" and pcm_of(after)
    report("wyoming: streamed text, first audio", f"{1000 * first_s:.0f} ms after synthesize-start")


async def _error_of(host: str, port: int, *events: Event) -> dict:
    async with AsyncTcpClient(host, port) as client:
        for event in events:
            await client.write_event(event)
        got = await read_until(client, "error")
        assert got and got[-1].type == "error", [e.type for e in got]
        assert await read(client) is None  # an error ends the connection
    return got[-1].data


async def test_errors_carry_the_service_code(app_url, tmp_path):
    unknown = SynthesizeVoice(name="no-such-voice")
    async with wyoming_server(app_url) as (host, port):
        plain = await _error_of(host, port, Synthesize(text="Hello.", voice=unknown).event())
        streamed = await _error_of(
            host,
            port,
            SynthesizeStart(voice=unknown).event(),
            SynthesizeChunk(text="Hello.").event(),
            SynthesizeStop().event(),
        )
    for error in (plain, streamed):
        assert error["code"] == "voice_not_found" and "no-such-voice" in error["text"], error
    keys = tmp_path / "keys"
    keys.write_text("sk-wyoming-right\n")
    security = {**SecurityConfig().model_dump(), "api_keys_env": None, "api_keys_file": str(keys)}
    with ingress_settings(security=security):
        async with wyoming_server(app_url, api_key="sk-wyoming-wrong") as (host, port):
            rejected = await _error_of(host, port, Synthesize(text="Hello.").event())
            rejected_stream = await _error_of(
                host, port, SynthesizeStart().event(), SynthesizeChunk(text="Hello.").event(), SynthesizeStop().event()
            )
        async with wyoming_server(app_url, api_key="sk-wyoming-right") as (host, port):
            async with AsyncTcpClient(host, port) as client:
                await client.write_event(Synthesize(text="The right key.").event())
                keyed = await read_until(client, "audio-stop")
    for error in (rejected, rejected_stream):
        assert error["code"] == "invalid_api_key", error
    assert keyed[-1].type == "audio-stop" and pcm_of(keyed)


@pytest.mark.parametrize("how", ["synthesize", "stream"])
async def test_a_dropped_client_cancels_its_synthesis(app_url, how):
    before = await asyncio.to_thread(wait_idle, 30)
    async with wyoming_server(app_url) as (host, port):
        client = AsyncTcpClient(host, port)
        await client.connect()
        if how == "synthesize":
            await client.write_event(Synthesize(text=LONG_TEXT).event())
        else:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=LONG_TEXT).event())
        await read_until(client, "audio-chunk")
        dropped = time.monotonic()
        client._writer.transport.abort()  # hang up without a word, as a crashed client does
        after = await asyncio.to_thread(wait_idle, 10)
        stop_s = time.monotonic() - dropped
        assert after["rows_cancelled"] > before["rows_cancelled"], after
        assert after["rows_finished"] - before["rows_finished"] <= 2, "the dropped synthesis ran on"
        # The server goes on serving.
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Synthesize(text="还在这里。").event())
            events = await read_until(client, "audio-stop")
        assert events[-1].type == "audio-stop" and pcm_of(events)
    assert (await asyncio.to_thread(acoustic_stats))["running_rows"] == 0
    report(f"wyoming: dropped client ({how})", f"rows stopped {stop_s:.2f} s after the hang-up")


async def test_an_admin_key_is_refused(app_url, tmp_path):
    """With an admin key every client on the network would list and speak with every key's cloned
    voices through the server: ``chattts-serve wyoming`` refuses to start with one (a clear error,
    exit 2), and a server that could not ask at its start speaks nothing once it knows."""
    keys = tmp_path / "keys"
    keys.write_text("sk-wyoming-admin\nsk-wyoming-plain\n")
    admin = {key_id("sk-wyoming-admin"): {"admin": True}}
    security = {**SecurityConfig().model_dump(), "api_keys_env": None, "api_keys_file": str(keys), "keys": admin}
    with ingress_settings(security=security):
        env = {**os.environ, "CHATTTS_BASE_URL": app_url, "CHATTTS_API_KEY": "sk-wyoming-admin"}
        cli = [sys.executable, "-m", "chattts_serve.cli", "wyoming", "--uri", "tcp://127.0.0.1:0"]
        done = await asyncio.to_thread(subprocess.run, cli, env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "admin key" in done.stderr, (done.returncode, done.stderr[-2000:])
        async with wyoming_server(app_url, api_key="sk-wyoming-admin") as (host, port):  # started without asking
            refused = await _error_of(host, port, Synthesize(text="Hello.").event())
            async with AsyncTcpClient(host, port) as client:
                await client.write_event(Describe().event())
                listed = [v.name for v in Info.from_event(await read(client)).tts[0].voices]
        assert refused["code"] == "admin_key_refused" and "admin key" in refused["text"], refused
        assert listed == list(OPENAI_VOICES)
        async with wyoming_server(app_url, api_key="sk-wyoming-plain") as (host, port):  # another key: served
            async with AsyncTcpClient(host, port) as client:
                await client.write_event(Synthesize(text="A key of its own.").event())
                spoken = await read_until(client, "audio-stop")
    assert spoken[-1].type == "audio-stop" and pcm_of(spoken)
