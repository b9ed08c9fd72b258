"""What a listener who plays a stream at 1x hears, as the server can infer it: the playback clock.

A voice agent, a phone line or the web page plays a streamed answer at 1x from its first audio,
after holding ``prebuffer_s`` of it (or as long: playback starts ``prebuffer_s`` after the first
audio arrives). From then on the playhead moves at 1x while audio is buffered; when the buffer is
empty the listener hears silence (a stall) and the playhead waits for the next audio: it never
skips. ``slack`` is the audio buffered ahead of the playhead (below zero: stalled that long),
``stall_s`` the silence heard so far. Time is the caller's clock (monotonic seconds); audio is
seconds of the stream. Plain arithmetic: the server feeds it as it sends audio, the benchmark's
clients as they receive it.
"""

from __future__ import annotations

import time
from typing import Callable, Optional

# What the server assumes a listener holds before it plays (seconds): a voice agent or the web
# page starts about half a second after the first audio (the streams benchmark's clients do).
PREBUFFER_S = 0.5


class PlaybackClock:
    def __init__(self, prebuffer_s: float = PREBUFFER_S, clock: Callable[[], float] = time.monotonic):
        self.prebuffer_s = max(0.0, prebuffer_s)
        self.clock = clock
        self.delivered_s = 0.0  # audio sent so far
        self.played_s = 0.0  # the playhead, as of ``_at``
        self.stall_s = 0.0  # silence heard so far, after playback began
        self.first_at: Optional[float] = None  # when the first audio was sent
        self.min_slack_s: Optional[float] = None  # the lowest slack any delivery found
        self._at = 0.0  # the time the playhead is accounted to

    @property
    def started(self) -> bool:
        return self.first_at is not None

    @property
    def play_from(self) -> Optional[float]:
        return None if self.first_at is None else self.first_at + self.prebuffer_s

    def _advance(self, now: float) -> None:
        """Move the playhead to ``now``: 1x while audio is buffered, a stall while none is."""
        start = self.play_from
        if start is None or now <= start:
            return
        begin = max(self._at, start)
        if now <= begin:
            return
        elapsed = now - begin
        played = min(max(0.0, self.delivered_s - self.played_s), elapsed)
        self.played_s += played
        self.stall_s += elapsed - played
        self._at = now

    def deliver(self, audio_s: float, now: Optional[float] = None) -> None:
        """``audio_s`` more seconds of audio leave (or arrive) at ``now``."""
        now = self.clock() if now is None else now
        if self.first_at is None:
            if audio_s <= 0:
                return
            self.first_at = self._at = now
        elif now >= self.play_from:  # how close the listener came to (or how long into) silence
            slack = self.slack(now)
            self.min_slack_s = slack if self.min_slack_s is None else min(self.min_slack_s, slack)
        self._advance(now)
        self.delivered_s += audio_s

    def slack(self, now: Optional[float] = None) -> float:
        """Audio buffered ahead of the playhead at ``now`` (below zero: the listener has been
        waiting that long). Before any audio: minus the time waited is not known here, so 0."""
        now = self.clock() if now is None else now
        start = self.play_from
        if start is None:
            return 0.0
        ahead = self.delivered_s - self.played_s
        if now <= max(self._at, start):
            return ahead + (start - now if now < start else 0.0)
        return ahead - (now - max(self._at, start))

    def deadline(self, now: Optional[float] = None) -> float:
        """When the listener runs out of audio if nothing more comes (the next audio's deadline)."""
        now = self.clock() if now is None else now
        return now + self.slack(now)
