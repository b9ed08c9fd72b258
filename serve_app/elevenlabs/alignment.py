"""Where characters lie in the audio, for the ElevenLabs door's ``alignment``: estimated.

ChatTTS has no aligner: the service knows where each segment (a sentence or clause) starts and
ends, to the sample, but not where a word lies inside it. So each segment's characters are spread
evenly over its samples (its expected length while it is being made: exact for random weights,
whose length is fixed, the text's estimate for real ones; its true length where it is known, a
cached answer's), and each message of audio carries the characters that start in it. Nothing is
invented: a message's span never passes the audio sent, and a segment that ends before all its
characters were placed puts the rest at its end, with no duration.

Two texts are placed the same way: what the client sent (``alignment``) and what the service
speaks, normalised (``normalizedAlignment``), each on its own track.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field
from typing import Optional

from ..engine.audio import SAMPLE_RATE, nominal_bytes_per_second
from ..engine.pacing import SAMPLES_PER_TOKEN, expected_tokens
from ..engine.types import SegmentRequest
from ..protocol.elevenlabs import Alignment, CharacterAlignment

_SPEED_TAG = re.compile(r"\[speed_(\d)\]")


def expected_samples(req: SegmentRequest) -> int:
    """The samples a segment's audio is expected to have: ``target_tokens`` (random weights: its
    length) or the estimate at its speed tag, as one decode of T tokens gives 512 T - 256."""
    if req.target_tokens:
        tokens = req.target_tokens
    else:
        level = _SPEED_TAG.search(req.prompt)
        tokens = expected_tokens(req.text, int(level.group(1)) if level else 5)
    return max(0, tokens * SAMPLES_PER_TOKEN - SAMPLES_PER_TOKEN // 2)


def _ms(samples: float) -> int:
    return round(samples * 1000 / SAMPLE_RATE)


@dataclass
class Placed:
    """Characters on a stream's audio timeline (samples at ``SAMPLE_RATE`` from its start), and
    the span of audio they account for: from ``since`` (where the previous span ended) to
    ``until`` (the last character's end)."""

    chars: list[str] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    since: int = 0

    def __bool__(self) -> bool:
        return bool(self.chars)

    def relative(self) -> Alignment:
        """ElevenLabs' WebSocket alignment: ms from ``since``, so that the spans of a context's
        messages add up to its audio (what clients keep their word clock with)."""
        base = _ms(self.since)
        return Alignment(
            chars=self.chars,
            charStartTimesMs=[_ms(s) - base for s in self.starts],
            charDurationsMs=[_ms(e) - _ms(s) for s, e in zip(self.starts, self.ends)],
        )

    def absolute(self) -> CharacterAlignment:
        """ElevenLabs' HTTP alignment: seconds from the answer's first sample."""
        return CharacterAlignment(
            characters=self.chars,
            character_start_times_seconds=[round(s / SAMPLE_RATE, 4) for s in self.starts],
            character_end_times_seconds=[round(e / SAMPLE_RATE, 4) for e in self.ends],
        )


class _Spread:
    """One segment's text spread evenly over ``length`` samples from ``start``."""

    def __init__(self, text: str, start: int, length: int):
        self.text, self.start, self.length = text, start, max(0, length)
        self.next = 0  # the first character not placed yet

    def pos(self, i: int) -> int:
        return self.start + i * self.length // max(1, len(self.text))

    @property
    def done(self) -> bool:
        return self.next >= len(self.text)


class Track:
    """One text's characters over a stream's audio: its segments' spreads, in order."""

    def __init__(self) -> None:
        self._spreads: deque[_Spread] = deque()
        self.covered = 0  # where the last span ended

    def add(self, text: str, start: int, length: int) -> None:
        if text:
            self._spreads.append(_Spread(text, start, length))

    def take(self, until: int) -> Placed:
        """The characters that start before ``until``; the last one's end is ``until`` (the span
        covers the audio sent), each other's the next one's start."""
        out = Placed(since=self.covered)
        while self._spreads:
            spread = self._spreads[0]
            while not spread.done and spread.pos(spread.next) < until:
                i = spread.next
                out.chars.append(spread.text[i])
                out.starts.append(max(spread.pos(i), self.covered))
                out.ends.append(spread.pos(i + 1) if i + 1 < len(spread.text) else spread.start + spread.length)
                spread.next += 1
            if not spread.done:
                break
            self._spreads.popleft()
        if out:
            out.ends = [min(max(e, s), until) for s, e in zip(out.starts, out.ends)]
            out.ends[-1] = until
            self.covered = until
        return out

    def end_first(self, at: int) -> Placed:
        """The first segment is over at ``at``: its characters not placed yet, there, with no
        duration (it spoke faster than expected)."""
        out = Placed(since=self.covered)
        if self._spreads:
            spread = self._spreads.popleft()
            rest = spread.text[spread.next :]
            out.chars = list(rest)
            out.starts = out.ends = [max(at, self.covered)] * len(rest)
            if rest:
                self.covered = max(at, self.covered)
        return out


def _end_all(track: Track, at: int) -> Placed:
    out = Placed(since=track.covered)
    while track._spreads:
        part = track.end_first(at)
        out.chars += part.chars
        out.starts += part.starts
        out.ends += part.ends
    return out


class StreamAligner:
    """Both texts of a stream over its audio, as its bytes go out in ``fmt``."""

    def __init__(self, fmt: str):
        rate = nominal_bytes_per_second(fmt)
        if rate is None:
            raise ValueError(f"no byte rate to place characters in {fmt!r} audio")
        self._samples_per_byte = SAMPLE_RATE / rate
        self._samples = 0.0  # the audio sent so far
        self.original, self.normalized = Track(), Track()

    @property
    def samples(self) -> int:
        return int(self._samples)

    def segment(self, source: str, spoken: str, length: int, start: Optional[int] = None) -> None:
        """A segment from ``start`` (default: the audio sent so far) of ``length`` samples (its
        expected length, or its true one), with its received and its normalised text."""
        at = self.samples if start is None else start
        self.original.add(source, at, length)
        self.normalized.add(spoken, at, length)

    def audio(self, nbytes: int) -> tuple[Placed, Placed]:
        """``nbytes`` more of the audio: the characters that start in it (either may be empty)."""
        self._samples += nbytes * self._samples_per_byte
        return self.original.take(self.samples), self.normalized.take(self.samples)

    def end_segment(self) -> tuple[Placed, Placed]:
        """The current segment's audio is complete: its characters not placed yet."""
        return self.original.end_first(self.samples), self.normalized.end_first(self.samples)

    def end_all(self) -> tuple[Placed, Placed]:
        """The audio is all sent: every character not placed yet, at its end."""
        return _end_all(self.original, self.samples), _end_all(self.normalized, self.samples)
