"""The one text cutter for work cut before it is planned (``engine/text/segment.py``'s
``pack_text``: a job's chunks): lossless, within its bound, whole sentences where they fit, and
linear in the text, since a book of a million characters is cut at submission (a quadratic cut
froze the Ingress's loop: 20,000 full stops took 4.3 s)."""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.engine.text.segment import pack_text, split_sentences
from serve_app.jobs.cutting import cut_text

ALPHABET = ". \t\n\"')]a1,，。!；”’…[]laugh_uvbrek"


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.text(alphabet=ALPHABET, max_size=80), st.integers(min_value=1, max_value=30))
def test_pieces_are_the_text_within_the_bound(text, max_chars):
    pieces = pack_text(text, max_chars)
    assert "".join(pieces) == text
    assert all(0 < len(p) <= max_chars for p in pieces) or any("[" in p for p in pieces)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(["你好。", "Hi there. ", "一句话！", "Yes? ", "好的，没问题。"]), max_size=30))
def test_whole_sentences_are_packed_until_the_next_does_not_fit(sentences):
    text = "".join(sentences)
    pieces = pack_text(text, 20)
    ends = {len("".join(split_sentences(text)[:k])) for k in range(len(split_sentences(text)) + 1)}
    at = 0
    for i, piece in enumerate(pieces):
        at += len(piece)
        assert at in ends  # every piece ends at a sentence end (each sentence here fits)
        if i + 1 < len(pieces):  # and the next sentence did not fit
            following = next(s for s in split_sentences(text[at:]))
            assert len(piece) + len(following) > 20


def test_a_control_tag_is_never_cut():
    text = "a" * 9 + "[laugh_2]" + "b" * 30
    pieces = pack_text(text, 12)
    assert "".join(pieces) == text
    assert any("[laugh_2]" in p for p in pieces)


def _seconds(text: str) -> float:
    """The cut's CPU time (this process's: what else runs on the machine does not count)."""
    t0 = time.process_time()
    chunks = cut_text(text, seed=1, chunk_chars=1200, paragraph_pause_s=0.5)
    assert all(len(c.text) <= 1200 for c in chunks)
    return time.process_time() - t0


def test_cutting_is_linear_on_the_worst_texts():
    """Four times the text, about four times the CPU time (a quadratic cut: sixteen), the best of
    three runs each; a million characters in seconds, not hours."""
    for unit in (".", ".a", "x", '."', "，", "Mr. A. "):
        small, large = (unit * (n // len(unit)) for n in (250_000, 1_000_000))
        ratio = min(_seconds(large) for _ in range(3)) / min(_seconds(small) for _ in range(3))
        assert ratio < 8.0, (unit, ratio)
