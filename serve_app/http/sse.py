"""OpenAI's speech SSE framing (``stream_format: "sse"``) over a synthesis stream."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, AsyncIterator, Optional

from ..protocol import SpeechSegment
from .answers import captions_of


def sse_event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n".encode()


async def sse_stream(
    items: AsyncIterator[Any], usage: dict[str, Any], timestamps: bool = False, captions: Optional[str] = None
) -> AsyncIterator[bytes]:
    """``speech.audio.delta`` events with base64 audio, with ``timestamps`` a ``speech.segment``
    event once each segment's audio is complete (between the deltas), then ``speech.audio.done``
    (with ``captions``: the caption file of every segment, made as the with-timestamps answer's)."""
    segments: list[SpeechSegment] = []
    async for item in items:
        if isinstance(item, bytes):
            yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(item).decode()})
        elif timestamps and isinstance(item, SpeechSegment):
            segments.append(item)
            yield sse_event({"type": "speech.segment", **item.model_dump()})
    done: dict[str, Any] = {"type": "speech.audio.done", "usage": usage}
    if timestamps and captions is not None:
        # Linear in the segments (at most a request's segment limit), off the loop all the same.
        done.update(captions=await asyncio.to_thread(captions_of, segments, captions), captions_format=captions)
    yield sse_event(done)
