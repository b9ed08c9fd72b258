"""The Wyoming server's connections without Ray: real sockets, a real server, and in place of the
service either nothing (a closed port) or a black hole that accepts and never answers, which
shows when the server gives up a service connection. What needs the service's answers is in
tests/serve/test_wyoming.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import AsyncIterator, Optional

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart

from bench.lib.procs import REPO_ROOT
from serve_app.engine.voices import OPENAI_VOICES
from serve_app.wyoming import WyomingConfig, WyomingServer

READ_S = 10.0


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BlackHole:
    """A 'service' that takes connections and never answers: ``open`` counts the live ones."""

    def __init__(self) -> None:
        self.open = 0
        self.accepted = 0
        self._server: Optional[asyncio.AbstractServer] = None

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc) -> None:
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.accepted += 1
        try:
            while await reader.read(65536):
                pass
        finally:
            self.open -= 1
            writer.close()

    async def until(self, test, what: str, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not test():
            assert time.monotonic() < deadline, f"{what}: open={self.open} accepted={self.accepted}"
            await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def server(base_url: str, **limits) -> AsyncIterator[tuple[str, int]]:
    settings = WyomingConfig.from_env({}, uri="tcp://127.0.0.1:0", base_url=base_url, **limits)
    running = WyomingServer(settings)
    host, port = (await running.start())[0][:2]
    try:
        yield host, port
    finally:
        await running.stop()


async def read(client: AsyncTcpClient) -> Optional[Event]:
    return await asyncio.wait_for(client.read_event(), READ_S)


async def error_of(host: str, port: int, *events: Event) -> dict:
    """The error event the server answers ``events`` with; the connection then ends."""
    async with AsyncTcpClient(host, port) as client:
        for event in events:
            await client.write_event(event)
        event = await read(client)
        assert event is not None and event.type == "error", event
        assert await read(client) is None
    return event.data


async def test_a_service_that_is_down():
    async with server(f"http://127.0.0.1:{closed_port()}") as (host, port):
        error = await error_of(host, port, Synthesize(text="Hello.").event())
        assert error["code"] == "service_unavailable" and "unreachable" in error["text"]
        stream = await error_of(host, port, SynthesizeStart().event(), SynthesizeChunk(text="Hi.").event())
        assert stream["code"] == "service_unavailable"
        # Still serving, and Home Assistant can still be set up: the built-in voices.
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Describe().event())
            info = Info.from_event(await read(client))
        assert [v.name for v in info.tts[0].voices] == list(OPENAI_VOICES)


@pytest.mark.parametrize("how", ["synthesize", "stream"])
async def test_a_dropped_client_closes_its_service_connection(how):
    hole = BlackHole()
    async with hole as base_url, server(base_url) as (host, port):
        client = AsyncTcpClient(host, port)
        await client.connect()
        if how == "synthesize":
            await client.write_event(Synthesize(text="Never answered.").event())
        else:
            await client.write_event(SynthesizeStart().event())
        await hole.until(lambda: hole.open == 1, "the service asked")
        client._writer.transport.abort()
        await hole.until(lambda: hole.open == 0, "the service connection closed after the hang-up", timeout=2.0)


async def test_syntheses_per_connection_are_bounded():
    hole = BlackHole()
    async with hole as base_url, server(base_url, max_synthesize_per_connection=2) as (host, port):
        events = [Synthesize(text=f"Number {i}.").event() for i in range(3)]
        error = await error_of(host, port, *events)
        assert error["code"] == "too_many_requests"
        await hole.until(lambda: hole.open == 0, "the running synthesis given up with the connection")
        assert hole.accepted == 1  # one at a time: the second waited its turn


@pytest.mark.parametrize(
    "events, code",
    [
        ([SynthesizeChunk(text="Hi.").event()], "invalid_event"),
        ([Event("synthesize-stop")], "invalid_event"),
        ([SynthesizeStart().event(), SynthesizeStart().event()], "invalid_event"),
        ([Synthesize(text="x" * 101).event()], "request_too_large"),
        # A stream's text waits while its session is not open yet: bounded too.
        ([SynthesizeStart().event()] + [SynthesizeChunk(text="y" * 60).event()] * 2, "request_too_large"),
        ([Event("synthesize", {"text": "x"}, payload=b"z" * 70_000)], "request_too_large"),
        ([Event("synthesize", {"voice": {"name": "nova"}})], "missing_required_parameter"),
    ],
    ids=["chunk-first", "stop-first", "two-starts", "long-text", "long-stream", "big-event", "no-text"],
)
async def test_protocol_misuse_is_an_error(events, code):
    hole = BlackHole()
    async with hole as base_url, server(base_url, max_text_chars=100) as (host, port):
        assert (await error_of(host, port, *events))["code"] == code


async def test_idle_connections_are_closed_but_not_while_speaking():
    hole = BlackHole()
    async with hole as base_url, server(base_url, idle_timeout_s=0.2) as (host, port):
        t0 = time.monotonic()
        assert (await error_of(host, port))["code"] == "idle_timeout"
        assert time.monotonic() - t0 < 2
        async with AsyncTcpClient(host, port) as client:
            await client.write_event(Synthesize(text="Slow service.").event())
            with pytest.raises(asyncio.TimeoutError):  # waiting for the service is not idling
                await asyncio.wait_for(client.read_event(), 0.6)


async def test_connections_are_bounded():
    async with server(f"http://127.0.0.1:{closed_port()}", max_connections=1) as (host, port):
        async with AsyncTcpClient(host, port) as first:
            await first.write_event(Describe().event())
            assert (await read(first)).type == "info"
            assert (await error_of(host, port, Describe().event()))["code"] == "too_many_connections"
        await asyncio.sleep(0.1)  # the first one's end reaches the server
        async with AsyncTcpClient(host, port) as again:
            await again.write_event(Describe().event())
            assert (await read(again)).type == "info"


def test_the_command_serves_and_stops_on_sigterm():
    """``chattts-serve wyoming`` as an operator runs it; it loads neither Ray nor torch."""
    port = closed_port()
    env = {**os.environ, "CHATTTS_BASE_URL": f"http://127.0.0.1:{closed_port()}"}
    code = (
        "import sys, atexit, json\n"
        "atexit.register(lambda: print(json.dumps(sorted({'torch', 'ray'} & set(sys.modules))), file=sys.stderr))\n"
        "from chattts_serve.cli import main\n"
        f"sys.exit(main(['wyoming', '--uri', 'tcp://127.0.0.1:{port}']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True)
    try:

        async def describe() -> Info:
            deadline = time.monotonic() + 60
            while True:
                try:
                    async with AsyncTcpClient("127.0.0.1", port) as client:
                        await client.write_event(Describe().event())
                        return Info.from_event(await read(client))
                except OSError:
                    assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
                    await asyncio.sleep(0.2)

        info = asyncio.run(describe())
        assert info.tts[0].name == "chattts-serve"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert json.loads(err.strip().splitlines()[-1]) == [], err[-2000:]
    assert "Wyoming server on" in err


async def test_zeroconf_announces_the_server():
    """What Home Assistant's discovery looks up: ``_wyoming._tcp`` with the server's port."""
    pytest.importorskip("zeroconf")
    from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

    name = f"chattts-test-{os.getpid()}"
    settings = WyomingConfig(uri="tcp://127.0.0.1:0", base_url="http://127.0.0.1:9", zeroconf=True, zeroconf_name=name)
    running = WyomingServer(settings)
    port = (await running.start())[0][1]
    browser = AsyncZeroconf(interfaces=["127.0.0.1"])
    try:
        info = AsyncServiceInfo("_wyoming._tcp.local.", f"{name}._wyoming._tcp.local.")
        assert await info.async_request(browser.zeroconf, 3000)
        assert (info.port, info.parsed_addresses()) == (port, ["127.0.0.1"])
    finally:
        await browser.async_close()
        await running.stop()


async def test_a_reset_client_is_no_failure(caplog):
    async with server(f"http://127.0.0.1:{closed_port()}") as (host, port):
        client = AsyncTcpClient(host, port)
        await client.connect()
        client._writer.transport.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
        )
        client._writer.transport.abort()  # with SO_LINGER 0: a reset, not a close
        await asyncio.sleep(0.2)
        async with AsyncTcpClient(host, port) as again:
            await again.write_event(Describe().event())
            assert (await read(again)).type == "info"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
