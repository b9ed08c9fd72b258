"""Job text cutting is linear in the text: it runs on the Ingress's event loop at submission, and
``re`` holds the GIL, so a pattern that backtracks freezes every request of the replica."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from serve_app.storage.jobs.chunking import _SENTENCE_END_RE, _cut, cut_text

# The sentence-end rule as first written (a full stop only before whitespace, by look-ahead):
# quadratic on a run of full stops, kept here as the reference of what a cut must be.
_REFERENCE = re.compile(r"[。！？!?；;…]+[”’」』）)\]\"']*|\.+[”’\"')\]]*(?=\s)|\n")


def _reference_cut(text: str) -> list[str]:
    out, start = [], 0
    for m in _REFERENCE.finditer(text):
        if m.end() > start:
            out.append(text[start : m.end()])
            start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.text(alphabet=". \t\n\"')]a。!”’…", max_size=24))
def test_sentences_are_cut_where_the_look_ahead_rule_cut_them(text):
    assert _cut(text, _SENTENCE_END_RE) == _reference_cut(text)


def test_a_million_full_stops_cut_in_well_under_a_second():
    # Before: 20,000 dots took 4.3 s (quadratic); a million, hours.
    for text in ("." * 1_000_000, ".a" * 500_000, "..." + "x" * 999_997, '."' * 500_000):
        t0 = time.perf_counter()
        chunks = cut_text(text, seed=1, chunk_chars=1200, paragraph_pause_s=0.5)
        assert time.perf_counter() - t0 < 1.0
        assert all(len(c.text) <= 1200 for c in chunks)
