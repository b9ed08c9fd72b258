"""A small client for chattts-serve: HTTP (sync and async, streaming to a file) on httpx, and
text streamed in over the WebSocket (``AsyncSpeechClient.stream_text`` / ``.session``) on
websockets.

    from serve_app.client import SpeechClient
    with SpeechClient("http://127.0.0.1:8000") as c:
        c.speak_to_file("你好", "hello.mp3", voice="alloy")
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterable, AsyncIterator, Callable, Iterator, Optional, Union

import httpx

from .engine.wav import finish_file, with_true_length

DEFAULT_TIMEOUT = httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=60.0)


class SpeechError(RuntimeError):
    """The server answered with an error (its OpenAI-style body is kept)."""

    def __init__(self, status: int, body: Any):
        err = body.get("error", {}) if isinstance(body, dict) else {}
        super().__init__(f"{status}: {err.get('message', body)}")
        self.status = status
        self.body = body
        self.code = err.get("code")


@dataclass
class SpeechResult:
    path: Optional[str]
    bytes: int
    ttfb_s: float  # time to the first audio byte
    total_s: float
    request_id: Optional[str]
    headers: dict[str, str]


def _payload(text: str, voice: str, response_format: str, **extra: Any) -> dict[str, Any]:
    body = {"model": "chattts", "input": text, "voice": voice, "response_format": response_format}
    body.update({k: v for k, v in extra.items() if v is not None})
    return body


def _headers(api_key: Optional[str]) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _raise_for(resp: httpx.Response, body: bytes) -> None:
    if resp.status_code >= 400:
        try:
            parsed: Any = json.loads(body)
        except ValueError:
            parsed = body.decode(errors="replace")
        raise SpeechError(resp.status_code, parsed)


class _FileSink:
    """Writes a response to a file, timing the first byte and the whole transfer."""

    def __init__(self, path: Union[str, Path]):
        self.path = str(path)
        self.t0 = time.perf_counter()
        self.ttfb: Optional[float] = None
        self.bytes = 0

    def __enter__(self) -> "_FileSink":
        self._file = open(self.path, "w+b")
        return self

    def __exit__(self, *exc: Any) -> None:
        if not any(exc):  # the file is whole: a WAV's header gets its true sizes
            finish_file(self._file, self.bytes)
        self._file.close()

    def write(self, data: bytes) -> None:
        if self.ttfb is None:
            self.ttfb = time.perf_counter() - self.t0
        self._file.write(data)
        self.bytes += len(data)

    def result(self, resp: httpx.Response) -> SpeechResult:
        total = time.perf_counter() - self.t0
        headers = dict(resp.headers)
        ttfb = self.ttfb if self.ttfb is not None else total
        return SpeechResult(self.path, self.bytes, ttfb, total, headers.get("x-request-id"), headers)


class SpeechClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: Optional[str] = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    ):
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout)

    def __enter__(self) -> "SpeechClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def stream(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> Iterator[bytes]:
        """Audio bytes as the server sends them. Extra fields: speed, seed, temperature, ..."""
        with self._http.stream(
            "POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)
        ) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, resp.read())
            yield from resp.iter_bytes()

    def speech(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> bytes:
        """The whole file (a WAV with its true length)."""
        return with_true_length(b"".join(self.stream(text, voice, response_format, **extra)))

    def speak_to_file(
        self, text: str, path: Union[str, Path], voice: str = "alloy", response_format: str = "mp3", **extra: Any
    ) -> SpeechResult:
        sink = _FileSink(path)
        with self._http.stream(
            "POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)
        ) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, resp.read())
            with sink:
                for data in resp.iter_bytes():
                    sink.write(data)
            return sink.result(resp)

    def voices(self) -> list[dict[str, Any]]:
        """Built-in and custom voices (``GET /v1/audio/voices``)."""
        resp = self._http.get("/v1/audio/voices")
        if resp.status_code >= 400:
            _raise_for(resp, resp.content)
        return resp.json()["data"]

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False


WS_PATH = "/v1/audio/speech/stream"


class SpeechSession:
    """One open ``WS /v1/audio/speech/stream`` session (``AsyncSpeechClient.session``).

    Send text as it is written (``append``), ``flush`` to speak the buffer now, ``cancel`` to
    barge in (audio not yet sent is dropped; the session stays open), ``close`` to speak the rest
    and end. ``receive()`` yields audio ``bytes`` and event dicts (``segment.start``,
    ``segment.done``, ``cancelled``, ``done``) until the session ends; an error event raises
    ``SpeechError`` with the HTTP status the same error has (the close code less 4000).
    """

    def __init__(self, ws: Any):
        self._ws = ws
        self.created: Optional[dict[str, Any]] = None  # the session.created event

    async def _send(self, message: dict[str, Any]) -> None:
        await self._ws.send(json.dumps(message, ensure_ascii=False))

    async def append(self, text: str) -> None:
        if text:
            await self._send({"type": "text.append", "text": text})

    async def flush(self) -> None:
        await self._send({"type": "text.flush"})

    async def cancel(self) -> None:
        await self._send({"type": "cancel"})

    async def close(self) -> None:
        await self._send({"type": "close"})

    async def receive(self) -> AsyncIterator[Union[bytes, dict[str, Any]]]:
        from websockets.exceptions import ConnectionClosed

        error: Optional[dict[str, Any]] = None
        done = False
        while True:
            try:
                item = await self._ws.recv()
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd else 1006
                if error is not None or not done:
                    status = code - 4000 if 4000 <= code < 5000 else code
                    raise SpeechError(status, {"error": error} if error else f"connection closed ({code})") from None
                return
            if isinstance(item, bytes):
                yield item
                continue
            event = json.loads(item)
            if event.get("type") == "session.created":
                self.created = event
            if event.get("type") == "error":
                error = event.get("error")  # the close that follows carries the status
                continue
            done = done or event.get("type") == "done"
            yield event


class AsyncSpeechClient:
    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        api_key: Optional[str] = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    ):
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key), timeout=timeout)
        self._ws_url = base_url.rstrip("/").replace("https://", "wss://", 1).replace("http://", "ws://", 1) + WS_PATH
        self._api_key = api_key

    async def __aenter__(self) -> "AsyncSpeechClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def stream(
        self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any
    ) -> AsyncIterator[bytes]:
        async with self._http.stream(
            "POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)
        ) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, await resp.aread())
            async for data in resp.aiter_bytes():
                yield data

    async def speech(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> bytes:
        """The whole file (a WAV with its true length)."""
        return with_true_length(b"".join([b async for b in self.stream(text, voice, response_format, **extra)]))

    async def speak_to_file(
        self, text: str, path: Union[str, Path], voice: str = "alloy", response_format: str = "mp3", **extra: Any
    ) -> SpeechResult:
        sink = _FileSink(path)
        async with self._http.stream(
            "POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)
        ) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, await resp.aread())
            with sink:
                async for data in resp.aiter_bytes():
                    sink.write(data)
            return sink.result(resp)

    def session(self, voice: str = "alloy", response_format: str = "pcm", **options: Any) -> "_SessionContext":
        """``async with client.session(...) as s``: a WebSocket session (``SpeechSession``),
        started with these options (``speed``, ``seed``, ``lang``, ``clause_seconds``, ...)."""
        start = {"type": "session.start", "voice": voice, "response_format": response_format}
        start.update({k: v for k, v in options.items() if v is not None})
        return _SessionContext(self._ws_url, _headers(self._api_key), start)

    async def stream_text(
        self,
        texts: AsyncIterable[str],
        voice: str = "alloy",
        response_format: str = "pcm",
        on_event: Optional[Callable[[dict[str, Any]], None]] = None,
        **options: Any,
    ) -> AsyncIterator[bytes]:
        """Audio bytes for text that is still being written (an LLM's deltas): each sentence is
        spoken as soon as it is complete, in order. ``pcm`` is s16le 24 kHz mono; ``opus`` (Ogg)
        and ``mp3`` are one stream for the whole text. ``on_event`` sees the JSON events."""
        from websockets.exceptions import ConnectionClosed

        async with self.session(voice, response_format, **options) as s:

            async def write() -> None:
                try:
                    async for text in texts:
                        await s.append(text)
                    await s.close()
                except ConnectionClosed:
                    return  # the server ended the session: the reader says why
                except Exception:
                    await s._ws.close()  # the text source failed: end the session (the reader stops)
                    raise

            writer = asyncio.ensure_future(write())
            try:
                async for item in s.receive():
                    if isinstance(item, bytes):
                        yield item
                    elif on_event is not None:
                        on_event(item)
            except SpeechError:
                (failed,) = await asyncio.gather(writer, return_exceptions=True)
                if isinstance(failed, Exception):
                    raise failed from None  # the text source's error, not the close it caused
                raise
            finally:
                writer.cancel()  # the consumer stopped early: closing the socket cancels the rest
                await asyncio.gather(writer, return_exceptions=True)


class _SessionContext:
    def __init__(self, url: str, headers: dict[str, str], start: dict[str, Any]):
        self._url, self._headers, self._start = url, headers, start
        self._conn: Any = None

    async def __aenter__(self) -> SpeechSession:
        from websockets.asyncio.client import connect

        self._conn = connect(self._url, additional_headers=self._headers, max_size=None, open_timeout=60)
        session = SpeechSession(await self._conn.__aenter__())
        await session._send(self._start)
        return session

    async def __aexit__(self, *exc: Any) -> None:
        await self._conn.__aexit__(*exc)
