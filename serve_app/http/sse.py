"""OpenAI's speech SSE framing (``stream_format: "sse"``) over a synthesis stream."""

from __future__ import annotations

import base64
import json
from typing import Any, AsyncIterator

from ..protocol import SpeechSegment


def sse_event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


async def sse_stream(
    items: AsyncIterator[Any], usage: dict[str, Any], timestamps: bool = False
) -> AsyncIterator[bytes]:
    """``speech.audio.delta`` events with base64 audio, with ``timestamps`` a ``speech.segment``
    event once each segment's audio is complete (between the deltas), then ``speech.audio.done``."""
    async for item in items:
        if isinstance(item, bytes):
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(item).decode()})
        elif timestamps and isinstance(item, SpeechSegment):
            yield sse_event({"type": "speech.segment", **item.model_dump()})
    yield sse_event({"type": "speech.audio.done", "usage": usage})
