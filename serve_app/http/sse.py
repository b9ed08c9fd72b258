"""OpenAI's speech SSE framing (``stream_format: "sse"``) over a stream of audio bytes."""

from __future__ import annotations

import base64
import json
from typing import Any, AsyncIterator


def sse_event(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n".encode()


async def sse_stream(audio: AsyncIterator[bytes], usage: dict[str, Any]) -> AsyncIterator[bytes]:
    """``speech.audio.delta`` events with base64 audio, then ``speech.audio.done``."""
    async for data in audio:
        yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()})
    yield sse_event({"type": "speech.audio.done", "usage": usage})
