"""The playback clock: what a listener who plays at 1x after a prebuffer hears of a stream."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.engine.playback import PlaybackClock


def test_a_stream_ahead_of_its_listener_never_stalls():
    c = PlaybackClock(prebuffer_s=0.5)
    c.deliver(1.0, now=0.0)
    c.deliver(1.0, now=0.9)
    c.deliver(1.0, now=1.8)
    assert c.stall_s == 0.0
    assert c.slack(now=1.8) == pytest.approx(3.0 - 1.3)  # played 1.3 s since 0.5
    assert c.min_slack_s == pytest.approx(0.6)  # at 0.9: 1.0 delivered, 0.4 played


def test_a_late_chunk_is_heard_as_silence_and_the_playhead_waits():
    c = PlaybackClock(prebuffer_s=0.5)
    c.deliver(1.0, now=0.0)  # plays 0.5 .. 1.5
    assert c.slack(now=2.0) == pytest.approx(-0.5)  # silent since 1.5
    c.deliver(1.0, now=2.0)  # plays 2.0 .. 3.0: the playhead did not skip
    assert c.stall_s == pytest.approx(0.5)
    assert c.min_slack_s == pytest.approx(-0.5)
    c.deliver(0.5, now=2.5)
    assert c.stall_s == pytest.approx(0.5)
    assert c.slack(now=2.5) == pytest.approx(1.0)  # 2.5 delivered, 1.5 played


def test_before_playback_starts_the_prebuffer_counts_as_time_left():
    c = PlaybackClock(prebuffer_s=0.5)
    assert c.slack(now=0.0) == 0.0 and not c.started
    c.deliver(0.2, now=1.0)
    assert c.slack(now=1.1) == pytest.approx(0.6)  # 0.4 s until it plays, then 0.2 s of audio
    assert c.deadline(now=1.1) == pytest.approx(1.7)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.floats(0.0, 2.0), st.floats(0.0, 1.0)), min_size=1, max_size=40), st.floats(0.0, 1.0))
def test_audio_heard_plus_silence_is_the_time_played(events, prebuffer):
    """However the audio comes, the playhead never passes what was delivered, and between the
    start of playback and the last delivery every second is either audio or silence."""
    c = PlaybackClock(prebuffer_s=prebuffer)
    now = 0.0
    for gap, audio in events:
        now += gap
        c.deliver(audio, now=now)
        assert c.played_s <= c.delivered_s + 1e-9
    if c.play_from is not None and now > c.play_from:
        assert c.played_s + c.stall_s == pytest.approx(now - c.play_from)
