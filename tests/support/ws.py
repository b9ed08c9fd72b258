"""WebSocket sessions (``WS /v1/audio/speech/stream``) from the client's side, over two backends
that the session scenarios run on (tests/serve/test_ws_sessions.py):

- ``InProcess``: the session logic (serve_app/realtime/) over an in-memory transport against the
  real engine in this process (planner, continuously batched decode loop, sliding-window vocoder,
  encoders: what the stages do), no Ray. A pytest plugin fixture, ``inprocess_ws``.
- ``Served``: the session app on the session's Ray Serve, through Serve's HTTP proxy, with a real
  WebSocket client (``websockets``).

Both open sessions that read the same (``Conn``: events and audio as they arrive, how it closed),
give the engine's counters, a plan of their own planner and the audio of one whole request (the
reference a session must match). Also: text cut as an LLM streams it, comparing session audio
with a request's, and Ogg pages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import struct
from typing import Any, AsyncIterator, Optional, Union

import numpy as np
import pytest

from serve_app.realtime.ogg import ogg_crc
from support.waiting import wait_until_async

# ---------------------------------------------------------------------------------------- helpers


def deltas(text: str, seed: int = 0) -> list[str]:
    """The text in pieces of 1-6 characters: cuts fall mid-word and mid-sentence, as LLM tokens do."""
    rng = random.Random(seed)
    out, pos = [], 0
    while pos < len(text):
        n = rng.randint(1, 6)
        out.append(text[pos : pos + n])
        pos += n
    return out


def assert_same_audio(pcm: bytes, reference: bytes) -> None:
    """The same tokens, decoded the same way: sample for sample, within the rounding of float
    matmuls over batches of other sizes (a session's rows share decode steps with other rows than
    one request's do) and of the vocoder's bfloat16 matmuls over windows split elsewhere (chunks
    go early on other schedules), which moves some int16 samples by one (~5 %), never more."""
    a = np.frombuffer(pcm, "<i2").astype(np.int32)
    b = np.frombuffer(reference, "<i2").astype(np.int32)
    assert len(a) == len(b)
    diff = np.abs(a - b)
    assert diff.max() <= 2 and (diff > 0).mean() < 0.15, (int(diff.max()), float((diff > 0).mean()))


def ogg_pages(data: bytes) -> list[dict]:
    """The Ogg pages of ``data`` (each CRC checked): flags, granule, serial, sequence, body."""
    pages, pos = [], 0
    while pos < len(data):
        assert data[pos : pos + 4] == b"OggS"
        _, _, flags, granule, serial, seq, crc, n = struct.unpack_from("<4sBBqIIIB", data, pos)
        end = pos + 27 + n + sum(data[pos + 27 : pos + 27 + n])
        page = bytearray(data[pos:end])
        page[22:26] = b"\0\0\0\0"
        assert ogg_crc(bytes(page)) == crc, f"bad CRC on page {seq}"
        pages.append(
            {"flags": flags, "granule": granule, "serial": serial, "seq": seq, "body": data[pos + 27 + n : end]}
        )
        pos = end
    return pages


# ---------------------------------------------------------------------------------------- one session


class Conn:
    """One session from the client's side: the events and audio as they arrive, and how it
    closed. ``recv`` gives the next frame (bytes) or event (dict), None once closed."""

    def __init__(self) -> None:
        self.events: list[dict] = []
        self.audio = bytearray()
        self.frames = 0
        self.close_code: Optional[int] = None

    async def send(self, **message: Any) -> None:
        await self.send_raw(json.dumps(message))

    async def send_raw(self, data: Union[str, bytes]) -> None:
        raise NotImplementedError

    async def disconnect(self) -> None:
        """Go away without a ``close`` message."""
        raise NotImplementedError

    async def _next(self, timeout: float) -> Union[bytes, str, None]:
        """The next message as received (None: closed, ``close_code`` set)."""
        raise NotImplementedError

    async def recv(self, timeout: float = 120) -> Union[bytes, dict, None]:
        item = await self._next(timeout)
        if item is None:
            return None
        if isinstance(item, bytes):
            self.audio += item
            self.frames += 1
            return item
        event = json.loads(item) if isinstance(item, str) else item
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


class MemoryConn(Conn):
    """A session served in this process (``serve_session`` on a ``MemoryTransport``); ``result()``
    is what ``serve_session`` returned: the start message and the session's stats."""

    def __init__(self, backend: "EngineBackend", limits, admit=None) -> None:
        from serve_app.realtime import serve_session

        super().__init__()
        self.t = MemoryTransport()
        self.task = asyncio.ensure_future(serve_session(self.t, backend, admit or _admit, limits))

    async def send_raw(self, data: Union[str, bytes]) -> None:
        if isinstance(data, str):
            self.t.send_raw(text=data)
        else:
            self.t.send_raw(data=data)

    async def disconnect(self) -> None:
        self.t.disconnect()

    async def _next(self, timeout: float) -> Union[bytes, dict, None]:
        if self.close_code is not None:
            return None
        item = await self.t.next(timeout)
        if isinstance(item, tuple):
            self.close_code = item[1]
            return None
        return item

    async def result(self, timeout: float = 120):
        return await asyncio.wait_for(asyncio.shield(self.task), timeout)


class WsConn(Conn):
    """A session through the server's WebSocket (``websockets`` client)."""

    def __init__(self, ws) -> None:
        super().__init__()
        self.ws = ws

    async def send_raw(self, data: Union[str, bytes]) -> None:
        await self.ws.send(data)

    async def disconnect(self) -> None:
        await self.ws.close()

    async def _next(self, timeout: float) -> Union[bytes, str, None]:
        from websockets.exceptions import ConnectionClosed

        try:
            return await asyncio.wait_for(self.ws.recv(), timeout)
        except ConnectionClosed as exc:
            self.close_code = exc.rcvd.code if exc.rcvd else None
            return None


# ---------------------------------------------------------------------------------------- backends


async def _admit(start):
    from serve_app.engine.audio import SAMPLE_RATE
    from serve_app.protocol import SessionCreated

    return SessionCreated(id="test", response_format=start.response_format, sample_rate=SAMPLE_RATE, weights="random")


class EngineBackend:
    """The graph's work in this process: the session's backend over the in-process speech
    pipeline (``LocalPipeline``: the planner, the continuously batched engine, per-plan assembly
    and encoding, as the stages do it), stage errors raised as they are. It records every text
    sent to ``plan`` and every segment request sent to ``audio``, in order."""

    def __init__(self, model, limits) -> None:
        from serve_app.engine.acoustic import AcousticEngine
        from serve_app.engine.planner import Planner
        from serve_app.engine.threads import TorchThread
        from serve_app.engine.vocoder import VocoderEngine
        from serve_app.pipeline.local import LocalPipeline
        from serve_app.realtime.graph import PipelineBackend
        from support.engine import fixed_chunks

        self.planner = Planner(limits)
        # Streams wait for room rather than being refused past the measured real-time capacity,
        # as in the session's Serve app (support/app.py): the box is shared, its pace varies.
        self.engine = AcousticEngine(model, fixed_chunks(max_rows=16, capacity_wait_s=None))
        self.thread = TorchThread("vocoder", threads=1)
        self.engine.start()
        self.pipeline = LocalPipeline(self.planner, self.engine, VocoderEngine(model), self.thread)
        self.session_backend = PipelineBackend(self.pipeline, errors=None)
        self.opened: list = []
        self.planned: list[str] = []

    def close(self) -> None:
        self.engine.stop()
        self.thread.shutdown()

    async def plan(self, text: str, options):
        self.planned.append(text)
        return await self.session_backend.plan(text, options)

    async def audio(self, plan, response_format: str):
        self.opened += plan.segments
        async with contextlib.aclosing(self.session_backend.audio(plan, response_format)) as items:
            async for item in items:
                yield item

    async def speak(self, text: str, options, fmt: str = "pcm") -> bytes:
        """One request for the whole text (what HTTP does)."""
        plan = await self.plan(text, options)
        return b"".join([x async for x in self.audio(plan, fmt) if isinstance(x, bytes)])


class Backend:
    """What the scenarios use of a backend; ``stats()`` gives the engine's counters (running and
    waiting rows, steps, rows cancelled and finished), polled every ``poll_s``."""

    name = ""
    in_process = False
    poll_s = 0.05
    sentences: list[str] = []
    long_sentences: list[str] = []

    async def stats(self) -> dict:
        raise NotImplementedError

    async def rows_at_least(self, n: int) -> dict:
        return await wait_until_async(
            self.stats,
            60,
            self.poll_s,
            until=lambda s: engine_rows(s) >= n,
            what=f"{n} rows decoding",
        )

    async def idle(self, timeout_s: float = 30) -> dict:
        return await wait_until_async(
            self.stats,
            timeout_s,
            self.poll_s,
            until=lambda s: engine_rows(s) == 0,
            what="the engine idle",
        )


def engine_rows(stats: dict) -> int:
    """Rows the engine holds: running, waiting, and set aside (parked for a slow reader, or by the
    deadline rule for a listener far behind them): each ends cancelled or finished."""
    return sum(stats[k] for k in ("running_rows", "waiting_rows", "parked_rows", "deadline_parked_rows"))


class InProcess(Backend):
    """Sessions served in this process. Its planner cuts segments of at most 1 s of speech, so
    each of ``sentences`` (~1.6 s each, no clause marks) is a segment of its own, as a session's
    cuts at sentence ends are."""

    name = "in-process"
    in_process = True
    poll_s = 0.005
    sentences = [
        "The quick brown fox jumps high.",
        " Seven small birds sing today.",
        " A warm wind moves the tall trees.",
    ]
    long_sentences = sentences

    def __init__(self, model) -> None:
        from serve_app.engine.config import SegmentConfig

        self.backend = EngineBackend(model, SegmentConfig(max_chars=120, max_seconds=1.0))
        self.engine = self.backend.engine

    def close(self) -> None:
        self.backend.close()

    def plan(self, text: str, **options):
        from serve_app.engine.types import SynthesisOptions

        return self.backend.planner.plan(text, SynthesisOptions(**options))

    async def reference(self, text: str, **options) -> bytes:
        from serve_app.engine.types import SynthesisOptions

        return await self.backend.speak(text, SynthesisOptions(**options))

    @contextlib.asynccontextmanager
    async def connect(self, limits=None, admit=None) -> AsyncIterator[MemoryConn]:
        from serve_app.realtime import SessionLimits

        conn = MemoryConn(self.backend, limits or SessionLimits(), admit)
        try:
            yield conn
        finally:
            if not conn.task.done():
                conn.t.disconnect()
                await conn.result(30)

    @contextlib.asynccontextmanager
    async def session(self, limits=None, **start: Any) -> AsyncIterator[MemoryConn]:
        async with self.connect(limits) as conn:
            await conn.send(type="session.start", **start)
            yield conn

    async def stats(self) -> dict:
        e = self.engine
        return {
            "running_rows": e.running_rows,
            "waiting_rows": e.waiting_rows,
            "parked_rows": e.parked_rows,
            "deadline_parked_rows": e.deadline_parked_rows,
            "steps": e.stats.steps,
            "rows_cancelled": e.stats.rows_cancelled,
            "rows_finished": e.stats.rows_finished,
        }


class Served(Backend):
    """Sessions through the session's Serve app. Its segments (``segments.max_chars`` 120) cut
    each of ``sentences`` (over 60 characters) as a request of them both is cut."""

    name = "serve"
    poll_s = 0.02
    sentences = [
        "The quick brown fox jumps over the lazy dog near the quiet river.",
        " Seven small birds were singing their songs in the tall green trees.",
    ]
    # Long sentences: rows still decoding while the first ones play.
    long_sentences = [
        f" Sentence {w} is a long line of words that keeps the decoder busy for a while."
        for w in ("one", "two", "three", "four")
    ]

    def __init__(self, app_url: str) -> None:
        self.app_url = app_url
        self.url = app_url.replace("http://", "ws://") + "/v1/audio/speech/stream"

    def plan(self, text: str, **options):
        from serve_app.engine.planner import Planner
        from serve_app.engine.types import SynthesisOptions
        from support.app import app_args

        return Planner(app_args().segments).plan(text, SynthesisOptions(**options))

    async def reference(self, text: str, **options) -> bytes:
        return await asyncio.to_thread(http_pcm, self.app_url, text, **options)

    @contextlib.asynccontextmanager
    async def connect(self, headers: Optional[dict] = None) -> AsyncIterator[WsConn]:
        from websockets.asyncio.client import connect

        async with connect(self.url, additional_headers=headers, max_size=None, open_timeout=60) as ws:
            yield WsConn(ws)

    @contextlib.asynccontextmanager
    async def session(self, headers: Optional[dict] = None, **start: Any) -> AsyncIterator[WsConn]:
        async with self.connect(headers) as conn:
            await conn.send(type="session.start", **start)
            yield conn

    async def stats(self) -> dict:
        from support.app import acoustic_stats

        return await asyncio.to_thread(acoustic_stats)


def http_pcm(app_url: str, text: str, **body: Any) -> bytes:
    """One HTTP request's pcm, synthesised afresh (``no-store``: no cache lookup)."""
    import httpx

    r = httpx.post(
        app_url + "/v1/audio/speech",
        json={"model": "chattts", "input": text, "response_format": "pcm", **body},
        headers={"Cache-Control": "no-store"},
        timeout=180,
    )
    assert r.status_code == 200, r.text[:300]
    return r.content


@pytest.fixture(scope="module")
def inprocess_ws(tiny_model):
    """The in-process session backend of a module (its own engine thread, stopped after it)."""
    backend = InProcess(tiny_model)
    yield backend
    backend.close()
