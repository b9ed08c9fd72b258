"""A request body read whole, up to a route's own limit: its pieces kept in a list and joined once
(``raw += piece`` copied everything read so far at every piece: quadratic in the body), the count
checked as each piece arrives."""

from __future__ import annotations

from typing import Callable

from fastapi import Request

from ..errors import APIError


async def read_bounded(request: Request, limit: int, too_large: Callable[[], APIError]) -> bytes:
    """The body, or ``too_large()`` raised as soon as more than ``limit`` bytes have come."""
    pieces: list[bytes] = []
    size = 0
    async for piece in request.stream():
        size += len(piece)
        if size > limit:
            raise too_large()
        pieces.append(piece)
    return b"".join(pieces)
