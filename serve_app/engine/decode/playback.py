"""A stream's playback clock inside the engine: one request's rows, read in order by one listener.

A request's segments play one after the other: segment k's audio starts once segments 0..k-1 have
played. The engine knows what it has sent of each (``note_sent``, from ``RowStream.send``) and when
the request's first chunk left, so it can tell, without asking anyone, where a listener playing the
stream at 1x would be (engine/playback.py's ``PlaybackClock``, fed the request's audio in playback
order: it starts ``prebuffer_s`` after the first audio and waits through silence) and how long each
row has before its listener needs its next audio (``row_slack``). A segment not finished counts
its expected length (``target_tokens``, else its cap), or what it has sent if more; pauses between
segments (SSML breaks, dialogue turns) are not known here and are ignored, which only understates
the slack.

The decode thread writes it (``note_sent``); the scheduler and ``AcousticEngine.realtime`` read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ..pacing import TOKEN_SECONDS
from ..playback import PlaybackClock
from ..types import SegmentRequest

if TYPE_CHECKING:
    from .streams import RowStream


class Playback:
    """The playback clock of one request (``realtime``: someone listens at 1x; otherwise the same
    clock is kept for reports, and the scheduler gives its rows no deadline)."""

    def __init__(self, reqs: Sequence[SegmentRequest], prebuffer_s: float, opened_at: float):
        self.realtime = bool(reqs[0].realtime)
        self.ahead_s = max(0.0, reqs[0].ahead_s)  # audio its listener holds before this request's
        self.client = reqs[0].client
        self.expected = [r.target_tokens or r.max_new_tokens for r in reqs]
        n = len(reqs)
        self.sent = [0] * n  # tokens sent per segment
        self.done = [False] * n  # its final chunk was sent
        self.head = 0  # the first segment not finished: the one its listener waits on
        self._done_tokens = 0  # tokens of segments 0..head-1
        self._starts = [0]  # _starts[k]: tokens played before segment k (valid for k < len)
        self.opened_at = opened_at  # the request came in: its listener waits for first audio from here
        self.clock = PlaybackClock(prebuffer_s)
        self.streams: list["RowStream"] = []  # the rows' streams, in segment order (engine)

    def __len__(self) -> int:
        return len(self.expected)

    @property
    def started(self) -> bool:
        """Its first chunk has left (its listener has audio)."""
        return self.clock.started

    @property
    def finished(self) -> bool:
        """Every segment sent its final chunk: nothing more will come."""
        return self.head >= len(self.expected)

    @property
    def ended(self) -> bool:
        """Every row's stream ended (finished, cancelled or failed)."""
        return all(s.ended for s in self.streams)

    @property
    def submitted_at(self) -> float:
        return self.opened_at

    @property
    def continuing(self) -> bool:
        """It continues a stream its listener already plays (``SegmentRequest.ahead_s``)."""
        return self.ahead_s > 0

    # ------------------------------------------------------------------ producer (decode thread)

    def note_sent(self, index: int, tokens: int, final: bool, now: float) -> None:
        """Segment ``index`` sent ``tokens`` more at ``now`` (``final``: its last chunk)."""
        before = self._contiguous()
        self.sent[index] += tokens
        if final:
            self.done[index] = True
        del self._starts[index + 1 :]  # later segments' start points moved
        while self.head < len(self.expected) and self.done[self.head]:
            self._done_tokens += self.sent[self.head]
            self.head += 1
        grew = self._contiguous() - before
        if grew > 0:
            if self.continuing and not self.clock.started:
                # No new prebuffer: it plays on when the audio before it runs out (now, if it has).
                self.clock.prebuffer_s = max(0.0, self.opened_at + self.ahead_s - now)
            self.clock.deliver(grew * TOKEN_SECONDS, now)

    def _contiguous(self) -> int:
        """Tokens its listener can play in order: the finished segments, then the head's."""
        return self._done_tokens + (self.sent[self.head] if self.head < len(self.sent) else 0)

    # ------------------------------------------------------------------ readers

    def start_tokens(self, index: int) -> int:
        """Tokens played before segment ``index`` starts (expected lengths where not finished)."""
        starts = self._starts
        while len(starts) <= index:
            j = len(starts) - 1
            length = self.sent[j] if self.done[j] else max(self.expected[j], self.sent[j])
            starts.append(starts[-1] + length)
        return starts[index]

    def read_tokens(self) -> int:
        """Tokens its reader has taken, in order (the segments are read one after the other)."""
        return sum(s.taken_tokens for s in self.streams)

    def beyond_reader_s(self, index: int) -> float:
        """How far segment ``index``'s audio starts beyond what the request's reader has taken (s)."""
        return (self.start_tokens(index) - self.read_tokens()) * TOKEN_SECONDS

    def slack(self, now: float) -> float:
        """Seconds before its listener hears silence (negative: for how long it has; before the first
        audio: minus the time waited for it)."""
        return self.clock.slack(now) if self.clock.started else self.ahead_s - (now - self.opened_at)

    def row_slack(self, index: int, now: float) -> float:
        """Seconds before the listener needs segment ``index``'s next audio: its audio sent so far ends
        ``start + sent`` into the stream, and the listener is ``played`` into it. The head's is the
        stream's slack; a later segment's lies further ahead by the audio before it."""
        clock = self.clock
        if not clock.started:
            wait = self.ahead_s - (now - self.opened_at)
            if index == 0:
                return wait
            return wait + (0.0 if self.continuing else clock.prebuffer_s) + self.start_tokens(index) * TOKEN_SECONDS
        # The clock holds the audio delivered in order (the head's end); this row's ends further on.
        ahead = (self.start_tokens(index) + self.sent[index]) * TOKEN_SECONDS - clock.delivered_s
        return clock.slack(now) + ahead

    def stall_s(self, now: float) -> float:
        """Silence its listener has heard so far (time its slack spent below zero after the first
        audio), the silence it is in now included; final once it is ``finished``."""
        clock = self.clock
        if self.finished or not clock.started:
            return clock.stall_s
        return clock.stall_s + max(0.0, -clock.slack(now))
