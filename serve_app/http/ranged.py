"""A stored file that is not a local file (an object in S3, say), answered as Starlette's
``FileResponse`` answers a local one, from ranged reads: never the whole file in memory.

``RangedResponse`` answers GET and HEAD with ``Accept-Ranges: bytes``, ``ETag`` and
``Last-Modified``; a single byte range (``bytes=a-b``, ``a-``, ``-n``) with 206 and
``Content-Range``; a start past the end with 416 and ``Content-Range: bytes */<size>`` (a
number of any length: past ``MAX_POSITION_DIGITS`` digits it is past every end, and a suffix
that long is the whole file); a malformed range with 400; ``If-Range`` with this ETag or
Last-Modified keeps the range, any other value (a weak ETag included) gets the whole file. Unlike ``FileResponse`` it does not answer
several ranges as multipart/byteranges: it sends the whole file (200), as RFC 9110 allows.
"""

from __future__ import annotations

import hashlib
import re
from email.utils import formatdate
from typing import AsyncIterator, Callable, Mapping, Optional
from urllib.parse import quote

import anyio
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from ..storage.jobs import FileStat

PIECE_BYTES = 256 * 1024  # one ranged read: what the response holds in memory at a time
# RFC 9110's DIGIT is ASCII (``\d`` would take other scripts' digits too).
_RANGE_RE = re.compile(r"([0-9]*)\s*-\s*([0-9]*)")
# More digits than this (after leading zeros) is past any file a store holds (below 2**63); such a
# number is never given to int(), which refuses 4300 digits and is slow well before that.
MAX_POSITION_DIGITS = 18


class _BadRange(Exception):
    pass


def _single_range(value: str, size: int) -> Optional[tuple[int, int]]:
    """``[start, end)`` of a ``Range`` header; None to send the whole file (several ranges);
    ``_BadRange`` when malformed; ``(size, size)`` when it starts past the end."""
    units, _, spec = value.partition("=")
    if units.strip().lower() != "bytes":
        raise _BadRange("Range header: only byte ranges are supported")
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not parts:
        raise _BadRange("Range header: range must be requested")
    if len(parts) > 1:
        return None
    m = _RANGE_RE.fullmatch(parts[0])
    if m is None or not (m[1] or m[2]):
        raise _BadRange("Range header: malformed range")
    if not m[1]:  # the last n bytes (more than the file: all of it)
        return max(size - _position(m[2], size), 0), size
    start = _position(m[1], size)
    if start >= size:
        return size, size
    if not m[2]:
        return start, size
    last = _position(m[2], size)
    if last < start:
        raise _BadRange("Range header: start must be less than end")
    return start, min(last + 1, size)


def _position(digits: str, size: int) -> int:
    """A byte position or count of the header; one of more than ``MAX_POSITION_DIGITS`` digits
    is past the end of any file and reads as at least ``size``, without int() reading it."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= MAX_POSITION_DIGITS else max(size, 10**MAX_POSITION_DIGITS)


class RangedResponse(Response):
    """``stat``: the file's size and version; ``read(start, length)``: a blocking ranged read
    (run in a worker thread)."""

    def __init__(
        self,
        stat: FileStat,
        read: Callable[[int, int], bytes],
        media_type: str,
        filename: Optional[str] = None,
        headers: Optional[Mapping[str, str]] = None,
        content_disposition_type: str = "attachment",
    ):
        self.stat = stat
        self.read = read
        self.media_type = media_type
        self.status_code = 200
        self.background = None
        self.init_headers(headers)
        self.headers.setdefault("accept-ranges", "bytes")
        self.headers.setdefault("last-modified", formatdate(stat.mtime, usegmt=True))
        self.headers.setdefault("etag", f'"{hashlib.md5(stat.tag.encode(), usedforsecurity=False).hexdigest()}"')
        if filename is not None:
            quoted = quote(filename)
            self.headers.setdefault(
                "content-disposition",
                f'{content_disposition_type}; filename="{filename}"'
                if quoted == filename
                else f"{content_disposition_type}; filename*=utf-8''{quoted}",
            )

    def _range_applies(self, if_range: Optional[str]) -> bool:
        return if_range is None or (
            not if_range.startswith("W/") and if_range in (self.headers["last-modified"], self.headers["etag"])
        )

    async def _pieces(self, start: int, end: int) -> AsyncIterator[bytes]:
        while start < end:
            piece = await anyio.to_thread.run_sync(self.read, start, min(PIECE_BYTES, end - start))
            if not piece:
                raise RuntimeError("the stored file is shorter than its size")
            start += len(piece)
            yield piece

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope.get("method", "GET").upper()
        request_headers = Headers(scope=scope)
        size = self.stat.size
        start, end, status = 0, size, 200
        http_range = request_headers.get("range")
        if (
            http_range is not None
            and method in ("GET", "HEAD")
            and self._range_applies(request_headers.get("if-range"))
        ):
            try:
                wanted = _single_range(http_range, size)
            except _BadRange as exc:
                return await PlainTextResponse(str(exc), status_code=400)(scope, receive, send)
            if wanted is not None:
                if wanted[0] >= size:
                    response = PlainTextResponse(status_code=416, headers={"Content-Range": f"bytes */{size}"})
                    return await response(scope, receive, send)
                (start, end), status = wanted, 206
        headers = dict(self.headers)
        headers["content-length"] = str(end - start)
        if status == 206:
            headers["content-range"] = f"bytes {start}-{end - 1}/{size}"
        body = self._pieces(start, end) if method != "HEAD" else _nothing()
        await StreamingResponse(body, status_code=status, headers=headers, media_type=self.media_type)(
            scope, receive, send
        )


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing
