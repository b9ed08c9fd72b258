"""ElevenLabs' HTTP text-to-speech over the service's speech (``http/speech.py``: prepared,
cached, planned and streamed as ``/v1/audio/speech`` is, in the caller's stream slot):

- ``POST /v1/text-to-speech/{voice_id}``: the whole audio;
- ``.../stream``: the audio as it is made (a real-time stream: its listener plays it as it comes);
- ``.../stream/with-timestamps``: newline-delimited JSON, one line per message of audio, each
  ``{"audio_base64", "alignment", "normalized_alignment"}`` with the characters that start in it
  (``alignment.py``: estimated within each segment; exact segment times where the answer was
  cached), in seconds from the audio's start.
"""

from __future__ import annotations

import base64
from typing import Any, AsyncIterator, Optional, Union

from fastapi.responses import Response

from ..callers import Caller
from ..engine.audio import SAMPLE_RATE
from ..engine.types import Plan
from ..http.answers import Hit
from ..http.request_log import RequestRecord
from ..http.speech import SpeechService, audio_only
from ..http.streams import OwnedStreamResponse
from ..protocol import SpeechSegment
from ..protocol.elevenlabs import ElevenLabsSpeechRequest, TimestampedChunk
from ..realtime.feed import segment_sources, share_out
from .alignment import Placed, StreamAligner, expected_samples

# A cached answer goes out in lines of this much audio: each line's base64 is small work, and
# well under the line lengths clients read whole (aiohttp's readline refuses lines past 128 KiB).
HIT_LINE_BYTES = 16 * 1024


class ElevenLabsSpeech:
    def __init__(self, speech: SpeechService):
        self.speech = speech

    async def whole(
        self, req: ElevenLabsSpeechRequest, rec: RequestRecord, caller: Caller, cache_control: str
    ) -> Response:
        audio = await self.speech.audio(req, rec, caller, cache_control)
        headers = {**self.speech.answer_headers(rec), **audio.headers}
        if isinstance(audio, Hit):
            return Response(audio.audio, media_type=req.content_type, headers=headers)
        async with audio:
            data = b"".join([chunk async for chunk in audio_only(audio)])
        return Response(data, media_type=req.content_type, headers=headers)

    async def stream(
        self,
        req: ElevenLabsSpeechRequest,
        rec: RequestRecord,
        caller: Caller,
        cache_control: str,
        flow_acks: bool = False,
    ) -> Response:
        """``/v1/audio/speech``'s streamed answer (paced by what the client takes, as it is)."""
        return await self.speech.respond(req, rec, caller, cache_control, flow_acks=flow_acks)

    async def with_timestamps(
        self, req: ElevenLabsSpeechRequest, rec: RequestRecord, caller: Caller, cache_control: str
    ) -> Response:
        audio = await self.speech.audio(req, rec, caller, cache_control, timed=True, listener=True)
        headers = {**self.speech.answer_headers(rec), **audio.headers}
        if isinstance(audio, Hit):
            lines: AsyncIterator[bytes] = _hit_lines(req, audio)
            owned: Any = None
        else:
            lines = _lines(req, audio, audio.plan)
            owned = audio
        return OwnedStreamResponse(lines, owned, media_type="application/x-ndjson", headers=headers)


def _line(data: bytes, original: Placed, normalized: Placed) -> bytes:
    chunk = TimestampedChunk(
        audio_base64=base64.b64encode(data).decode("ascii"),
        alignment=original.absolute() if original else None,
        normalized_alignment=normalized.absolute() if normalized else None,
    )
    return chunk.model_dump_json().encode() + b"\n"


def _joined(a: Placed, b: Placed) -> Placed:
    return Placed(a.chars + b.chars, a.starts + b.starts, a.ends + b.ends, a.since)


async def _lines(
    req: ElevenLabsSpeechRequest, items: AsyncIterator[Union[bytes, SpeechSegment]], plan: Optional[Plan]
) -> AsyncIterator[bytes]:
    """A line per message of audio. Each segment's characters are spread over its expected length
    from where it starts (the one before it ended, exactly: its mark); what a segment that ended
    early did not place goes with the next line, at its end."""
    aligner = StreamAligner(req.response_format)
    n = len(plan.segments) if plan is not None else 0
    sources = segment_sources(req.input, plan) if plan is not None else []

    def begin(k: int, start: int) -> None:
        if plan is not None and k < n:
            aligner.segment(sources[k], plan.texts[k], expected_samples(plan.segments[k]), start)

    begin(0, round((plan.lead_in if plan is not None else 0.0) * SAMPLE_RATE))
    left = (Placed(), Placed())  # placed at a segment's end, not sent yet
    async for item in items:
        if isinstance(item, SpeechSegment):
            end = aligner.end_segment()
            left = (_joined(left[0], end[0]), _joined(left[1], end[1]))
            pause = plan.pause_after(item.index) if plan is not None else 0.0
            begin(item.index + 1, round((item.end + pause) * SAMPLE_RATE))
            continue
        original, normalized = aligner.audio(len(item))
        yield _line(item, _joined(left[0], original), _joined(left[1], normalized))
        left = (Placed(), Placed())
    if left[0] or left[1]:
        yield _line(b"", *left)


async def _hit_lines(req: ElevenLabsSpeechRequest, hit: Hit) -> AsyncIterator[bytes]:
    """A cached answer: its segments' exact times are known, so each segment's characters are
    spread over its true length; the audio goes out in lines of ``HIT_LINE_BYTES``."""
    aligner = StreamAligner(req.response_format)
    segments = hit.segments or []
    sources = share_out(req.input, [s.input_start for s in segments])
    for seg, source in zip(segments, sources):
        start = round(seg.start * SAMPLE_RATE)
        aligner.segment(source, source, round(seg.end * SAMPLE_RATE) - start, start)
    data = hit.audio
    for pos in range(0, len(data), HIT_LINE_BYTES):
        piece = data[pos : pos + HIT_LINE_BYTES]
        yield _line(piece, *aligner.audio(len(piece)))
    rest, _ = aligner.end_all()  # rounding's last characters, if any
    if rest:
        yield _line(b"", rest, rest)
