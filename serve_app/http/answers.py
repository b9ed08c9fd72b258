"""What a speech answer is made of, apart from how it is made: a cached answer (``Hit``), a
segment's place in the audio, and the whole-audio JSON answer (with-timestamps, a dialogue's
timed answer). A long answer is tens of megabytes: it is joined and base64-encoded in a thread,
in pieces, and spliced into its JSON, so no single call holds the event loop.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Union

from ..engine.audio import CONTENT_TYPES
from ..engine.captions import TimedText, caption_file
from ..engine.types import Plan, SegmentMark
from ..engine.wav import with_true_length
from ..protocol import DialogueRequest, SpeechSegment, TimedSpeech, TimedSpeechRequest


@dataclass
class Hit:
    """A cached answer: its audio, and where its segments lie (and its length) when they were
    stored with it."""

    audio: bytes
    segments: Optional[list[SpeechSegment]] = None
    duration: Optional[float] = None
    headers: dict[str, str] = field(default_factory=dict)  # what the answer says about the script (style, SSML)


def segments_key(key: str) -> str:
    """The cache entry beside an answer's audio that holds its segments' timing."""
    return key + ":segments"


def speech_segment(mark: SegmentMark, plan: Plan) -> SpeechSegment:
    span = plan.span_of(mark.index)
    return SpeechSegment(
        index=mark.index,
        text=plan.source_of(mark.index),
        input_start=span[0] if span else None,
        input_end=span[1] if span else None,
        start=round(mark.start_s, 6),
        end=round(mark.end_s, 6),
        speaker=plan.speaker_of(mark.index),
        turn=plan.turn_of(mark.index),
    )


async def hit_items(hit: Hit) -> AsyncIterator[Union[bytes, SpeechSegment]]:
    yield hit.audio
    for segment in hit.segments or ():
        yield segment


def captions_of(segments: list[SpeechSegment], fmt: Optional[str]) -> Optional[str]:
    """The caption file of an answer's segments in ``fmt`` (None: none asked for)."""
    if fmt is None:
        return None
    return caption_file([TimedText(seg.start, seg.end, seg.text, seg.speaker) for seg in segments], fmt)


def whole(parts: list[bytes]) -> bytes:
    """A stream's bytes as one answer, a WAV with its true length."""
    return with_true_length(b"".join(parts))


# Base64 in pieces of 3 MiB (a multiple of 3 bytes: no padding inside): each C call holds the GIL
# for a few ms, so a thread encoding a long answer never holds the event loop for long.
_B64_PIECE = 3 << 20


def _b64(data: bytes) -> bytes:
    return b"".join(base64.b64encode(data[i : i + _B64_PIECE]) for i in range(0, len(data), _B64_PIECE))


def build_timed_answer(
    req: Union[TimedSpeechRequest, DialogueRequest],
    parts: list[bytes],
    segments: list[SpeechSegment],
    duration: Optional[float],
    stream: bool,
) -> tuple[TimedSpeech, bytes]:
    """The timed answer without its audio, and the audio as base64 (run in a thread). ``parts``:
    a stream's bytes (``stream``), else a cached answer's one whole file."""
    data = whole(parts) if stream else parts[0]
    shell = TimedSpeech(
        audio="",
        response_format=req.response_format,
        content_type=CONTENT_TYPES[req.response_format],
        duration=round(duration if duration is not None else (segments[-1].end if segments else 0.0), 6),
        segments=segments,
        captions=captions_of(segments, req.captions),
        captions_format=req.captions,
    )
    return shell, _b64(data)


_EMPTY_AUDIO = b'"audio":""'


def with_audio(shell: TimedSpeech, audio_b64: bytes) -> bytes:
    """``shell`` as JSON with the audio put in place: base64 needs no escaping, so tens of megabytes
    are spliced in instead of going through the JSON encoder in one call."""
    head, tail = shell.model_dump_json().encode().split(_EMPTY_AUDIO, 1)
    return b"".join((head, b'"audio":"', audio_b64, b'"', tail))
