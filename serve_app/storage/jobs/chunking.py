"""A job's text cut into chunks, each one synthesis: paragraphs (blank lines), then whole
sentences up to ``chunk_chars``, a longer sentence at its clauses. The planner then cuts each
chunk into its own segments (``segments.max_chars``, ``max_seconds``).

Plain Python on the text alone: it runs in the Ingress at submission, so the chunks (and each
one's seed) are fixed before any work and a chunk done again gives the same audio.
"""

from __future__ import annotations

import re

from ...engine.audio import SAMPLE_RATE
from ...engine.pacing import expected_seconds, speed_tag_level
from ...engine.text.chars import is_speakable
from ...engine.voices import MAX_SEED
from .model import PCM_BYTES_PER_SAMPLE, JobChunk

# A prime unlike the planner's per-segment step (7919): chunk k's segment i and chunk k+1's
# segment j never share a seed for any segment counts a chunk can have.
CHUNK_SEED_STEP = 104729

_PARAGRAPH_RE = re.compile(r"\n[ \t\u3000\r]*\n\s*")
# Where a sentence ends: its end marks and any closing quotes or brackets after them; a full stop
# only before whitespace (not 3.5, e.g., www); a line break.
_SENTENCE_END_RE = re.compile(r"[。！？!?；;…]+[”’」』）)\]\"']*|\.+[”’\"')\]]*(?=\s)|\n")
_CLAUSE_END_RE = re.compile(r"[，,、：:]+|\s+")


def chunk_seed(seed: int, index: int) -> int:
    """Chunk ``index``'s seed (chunk 0 decodes with the job's own seed, as a request would)."""
    return (seed + index * CHUNK_SEED_STEP) % (MAX_SEED + 1)


def _cut(text: str, pattern: re.Pattern) -> list[str]:
    out, start = [], 0
    for m in pattern.finditer(text):
        if m.end() > start:
            out.append(text[start:m.end()])
            start = m.end()
    if start < len(text):
        out.append(text[start:])
    return out


def _pieces(sentence: str, limit: int) -> list[str]:
    """A sentence of at most ``limit`` characters as it is, a longer one at clause marks or
    spaces, a run without either every ``limit`` characters."""
    if len(sentence) <= limit:
        return [sentence]
    out: list[str] = []
    for clause in _cut(sentence, _CLAUSE_END_RE):
        while len(clause) > limit:
            out.append(clause[:limit])
            clause = clause[limit:]
        if out and len(out[-1]) + len(clause) <= limit:
            out[-1] += clause
        else:
            out.append(clause)
    return out


def _packed(paragraph: str, limit: int) -> list[str]:
    chunks: list[str] = []
    current = ""
    for sentence in _cut(paragraph, _SENTENCE_END_RE):
        for piece in _pieces(sentence, limit):
            if current and len(current) + len(piece) > limit:
                chunks.append(current)
                current = ""
            current += piece
    if current:
        chunks.append(current)
    return chunks


def cut_text(text: str, seed: int, chunk_chars: int, paragraph_pause_s: float) -> list[JobChunk]:
    """The job's chunks in order, each with its seed and the silence after it
    (``paragraph_pause_s`` after a paragraph's last chunk, none after the job's last). Nothing
    unspeakable (a line of asterisks) becomes a chunk."""
    texts: list[tuple[str, bool]] = []
    for paragraph in _PARAGRAPH_RE.split(text):
        pieces = [p.strip() for p in _packed(paragraph, chunk_chars)]
        pieces = [p for p in pieces if is_speakable(p)]
        texts += [(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
    chunks = [JobChunk(text=t, seed=chunk_seed(seed, k), pause_after=paragraph_pause_s if ends else 0.0)
              for k, (t, ends) in enumerate(texts)]
    if chunks:
        chunks[-1].pause_after = 0.0
    return chunks


def estimated_pcm_bytes(chunks: list[JobChunk], speed: float) -> int:
    """The job's audio as PCM, from the pacing rules (random weights' exact length; real
    weights end near it): what it reserves of its owner's quota until it is done."""
    level = speed_tag_level(speed)
    seconds = sum(expected_seconds(c.text, level) + c.pause_after for c in chunks)
    return int(seconds * SAMPLE_RATE * PCM_BYTES_PER_SAMPLE)
