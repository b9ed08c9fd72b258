"""A small HTTP client for chattts-serve (sync and async, streaming to a file), on httpx.

    from serve_app.client import SpeechClient
    with SpeechClient("http://127.0.0.1:8000") as c:
        c.speak_to_file("你好", "hello.mp3", voice="alloy")
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Iterator, Optional, Union

import httpx

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
            import json

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
        self._file = open(self.path, "wb")
        return self

    def __exit__(self, *exc: Any) -> None:
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
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: Optional[str] = None, timeout: httpx.Timeout = DEFAULT_TIMEOUT):
        self._http = httpx.Client(base_url=base_url, headers=_headers(api_key), timeout=timeout)

    def __enter__(self) -> "SpeechClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def stream(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> Iterator[bytes]:
        """Audio bytes as the server sends them. Extra fields: speed, seed, temperature, ..."""
        with self._http.stream("POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, resp.read())
            yield from resp.iter_bytes()

    def speech(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> bytes:
        return b"".join(self.stream(text, voice, response_format, **extra))

    def speak_to_file(self, text: str, path: Union[str, Path], voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> SpeechResult:
        sink = _FileSink(path)
        with self._http.stream("POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, resp.read())
            with sink:
                for data in resp.iter_bytes():
                    sink.write(data)
            return sink.result(resp)

    def voices(self) -> list[dict[str, Any]]:
        return self._http.get("/v1/voices").json()["data"]

    def ready(self) -> bool:
        try:
            return self._http.get("/readyz").status_code == 200
        except httpx.HTTPError:
            return False


class AsyncSpeechClient:
    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: Optional[str] = None, timeout: httpx.Timeout = DEFAULT_TIMEOUT):
        self._http = httpx.AsyncClient(base_url=base_url, headers=_headers(api_key), timeout=timeout)

    async def __aenter__(self) -> "AsyncSpeechClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def stream(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> AsyncIterator[bytes]:
        async with self._http.stream("POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, await resp.aread())
            async for data in resp.aiter_bytes():
                yield data

    async def speech(self, text: str, voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> bytes:
        return b"".join([b async for b in self.stream(text, voice, response_format, **extra)])

    async def speak_to_file(self, text: str, path: Union[str, Path], voice: str = "alloy", response_format: str = "mp3", **extra: Any) -> SpeechResult:
        sink = _FileSink(path)
        async with self._http.stream("POST", "/v1/audio/speech", json=_payload(text, voice, response_format, **extra)) as resp:
            if resp.status_code >= 400:
                _raise_for(resp, await resp.aread())
            with sink:
                async for data in resp.aiter_bytes():
                    sink.write(data)
            return sink.result(resp)
