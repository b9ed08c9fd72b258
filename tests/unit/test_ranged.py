"""Byte ranges of a stored file that is not a local one (``http/ranged.py``), over hostile
``Range`` headers: every answer is 206, 200, 400 or 416, never a 500. No Ray, no store: the
response reads from bytes in memory."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.routing import Route
from starlette.testclient import TestClient

from serve_app.http.ranged import RangedResponse, _BadRange, _single_range
from serve_app.storage.jobs import FileStat

BODY = bytes(range(256)) * 4  # 1024 bytes
HUGE = "9" * 5000  # past int()'s 4300-digit limit


@pytest.fixture(scope="module")
def http():
    async def audio(request):
        return RangedResponse(
            FileStat(len(BODY), 1_700_000_000.0, "v1"), lambda start, n: BODY[start : start + n], "audio/wav"
        )

    with TestClient(
        Starlette(routes=[Route("/a", audio, methods=["GET", "HEAD"])]), raise_server_exceptions=False
    ) as c:
        yield c


N = len(BODY)


@pytest.mark.parametrize(
    "value, status, span",
    [  # span: the bytes a 206 sends
        # A suffix longer than the file is all of it (RFC 9110 14.1.2); before: ValueError, a 500.
        (f"bytes=-{HUGE}", 206, (0, N)),
        (f"bytes=-{'0' * 5000}5", 206, (N - 5, N)),  # leading zeros are no digits of the number
        (f"bytes={HUGE}-", 416, None),
        (f"bytes={HUGE}-{HUGE}", 416, None),
        (f"bytes=10-{HUGE}", 206, (10, N)),
        (f"bytes={'0' * 5000}10-19", 206, (10, 20)),
        ("bytes=-99999999999999999999", 206, (0, N)),  # 20 digits: past the bound, past the file
        ("bytes=1000-999999999999999999", 206, (1000, N)),  # 18 digits: read
        (f"bytes=20-{'1' * 5000}-", 400, None),
    ],
)
def test_hostile_ranges_are_answered_without_a_500(http, value, status, span):
    r = http.get("/a", headers={"Range": value})
    assert r.status_code == status, (value[:40], r.status_code, r.text[:200])
    if status == 416:
        assert r.headers["content-range"] == f"bytes */{N}"
    if status == 206:
        start, end = span
        assert r.content == BODY[start:end]
        assert r.headers["content-range"] == f"bytes {start}-{end - 1}/{N}"


def test_only_ascii_digits_are_positions():
    """RFC 9110's DIGIT; ``\\d`` took other scripts' digits (a header decoded as latin-1 cannot
    carry them, a caller of the function can)."""
    with pytest.raises(_BadRange):
        _single_range("bytes=\u0663-", 100)
    assert _single_range("bytes=3-", 100) == (3, 100)


def test_ordinary_ranges_as_before(http):
    assert http.get("/a", headers={"Range": "bytes=0-9"}).content == BODY[:10]
    assert http.get("/a", headers={"Range": "bytes=-5"}).content == BODY[-5:]
    assert http.get("/a", headers={"Range": "bytes=9-3"}).status_code == 400
    assert http.get("/a", headers={"Range": f"bytes={len(BODY)}-"}).status_code == 416
    assert http.get("/a").content == BODY
