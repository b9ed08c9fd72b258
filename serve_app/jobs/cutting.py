"""A job's text cut into chunks, each one synthesis: paragraphs (blank lines), then the engine's
one text cutter (``engine/text/segment.py``'s ``pack_text``: whole sentences up to
``chunk_chars``, a longer sentence at its clauses). The planner then cuts each chunk into its own
segments (``segments.max_chars``, ``max_seconds``).

Plain Python on the text alone: it runs in the Ingress at submission, so the chunks (and each
one's seed) are fixed before any work and a chunk done again gives the same audio.
"""

from __future__ import annotations

import re
from typing import Optional

from ..engine.audio import SAMPLE_RATE
from ..engine.pacing import expected_seconds, speed_tag_level
from ..engine.text.chars import is_speakable
from ..engine.text.segment import pack_text
from ..engine.voices import MAX_SEED
from ..storage.jobs.model import PCM_BYTES_PER_SAMPLE, JobChunk, JobPart

# A prime unlike the planner's per-segment step (7919): chunk k's segment i and chunk k+1's
# segment j never share a seed for any segment counts a chunk can have.
CHUNK_SEED_STEP = 104729

_PARAGRAPH_RE = re.compile(r"\n[ \t\u3000\r]*\n\s*")


def chunk_seed(seed: int, index: int) -> int:
    """Chunk ``index``'s seed (chunk 0 decodes with the job's own seed, as a request would)."""
    return (seed + index * CHUNK_SEED_STEP) % (MAX_SEED + 1)


# A chapter starts at a heading line: Markdown's ``#``; 第…章/回/节/卷/部/篇/集/幕 or a named
# front or back part (序言, 尾声, ...) in a short line that ends no sentence; Chapter / Part / Book /
# Act / Section and a number (digits, Roman, a word up to twenty) or Prologue, Epilogue and the
# like, then the line's end, a mark or a capitalised title. Or after a scene break: a line of ``***`` / ``---`` / ``* * *``,
# or two blank lines and more.
MAX_HEADING_CHARS = 80
MAX_CJK_HEADING_CHARS = 30
_NUMBER_WORDS = (
    "one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|fifteen|"
    "sixteen|seventeen|eighteen|nineteen|twenty"
)
_MARKDOWN_HEADING_RE = re.compile(r"^#{1,6}\s+\S")
_CJK_HEADING_RE = re.compile(
    r"^(?:第[0-9０-９零〇一二三四五六七八九十百千两]+[章回节卷部篇集幕]|序章|序言|楔子|引子|前言|尾声|后记|番外|终章)"
)
# After the number (or the named part): the line's end, a mark, or a title in capitals.
_LATIN_HEADING_RE = re.compile(
    rf"^(?i:(?:chapter|part|book|act|section)\s+(?:[0-9]+|[ivxlc]+|{_NUMBER_WORDS})"
    r"|prologue|epilogue|preface|foreword|afterword|introduction|interlude)"
    r"(?:$|\s*[.:—–-]|\s+[\"'“‘(\[0-9A-Z])"
)
_SCENE_BREAK_RE = re.compile(r"^\s*(?:(?:\*\s*){3,}|(?:-\s*){3,}|(?:_\s*){3,}|(?:#\s*){3,})$")
_BLANK_LINES_RE = re.compile(r"\n[ \t\u3000\r]*\n[ \t\u3000\r]*\n")


def heading_title(line: str) -> Optional[str]:
    """The title when ``line`` is a chapter heading (Markdown's ``#`` taken off), else None."""
    line = line.strip()
    if not 0 < len(line) <= MAX_HEADING_CHARS:
        return None
    if _MARKDOWN_HEADING_RE.match(line):
        return line.lstrip("#").strip()
    if _LATIN_HEADING_RE.match(line):
        return line
    if _CJK_HEADING_RE.match(line) and len(line) <= MAX_CJK_HEADING_CHARS and line[-1] not in "。！？!?；;":
        return line
    return None


def split_chapters(text: str) -> list[tuple[Optional[str], str]]:
    """``text`` as chapters in order: (the heading's text, or None, and the chapter's text, its
    heading line first and a paragraph of its own). Text before the first heading is a chapter
    of its own (untitled) when it has something to speak; an empty chapter is dropped."""
    chapters: list[tuple[Optional[str], list[str]]] = [(None, [])]
    for block in _BLANK_LINES_RE.split(text):
        if chapters[-1][1]:
            chapters.append((None, []))  # two blank lines and more: a scene break
        for line in block.split("\n"):
            if _SCENE_BREAK_RE.match(line):
                chapters.append((None, []))
            elif (title := heading_title(line)) is not None:
                chapters.append((title, [title, ""]))  # the heading is spoken, as a paragraph of its own
            else:
                chapters[-1][1].append(line)
    out = [(title, "\n".join(lines)) for title, lines in chapters]
    return [(title, body) for title, body in out if is_speakable(body)]


def cut_text(
    text: str,
    seed: int,
    chunk_chars: int,
    paragraph_pause_s: float,
    chapters: Optional[list[tuple[Optional[str], str]]] = None,
    chapter_pause_s: float = 0.0,
) -> list[JobChunk]:
    """The job's chunks in order, each with its seed, its chapter and the silence after it
    (``paragraph_pause_s`` after a paragraph's last chunk, at least ``chapter_pause_s`` after a
    chapter's, none after the job's last). ``chapters``: the text as ``split_chapters`` cut it
    (chunk ``chapter`` indexes it); without, the text is one chapter. Nothing unspeakable (a
    line of asterisks) becomes a chunk."""
    parts = chapters if chapters is not None else [(None, text)]
    texts: list[tuple[str, float, int]] = []
    for index, (_, body) in enumerate(parts):
        for paragraph in _PARAGRAPH_RE.split(body):
            pieces = [p.strip() for p in pack_text(paragraph, chunk_chars)]
            pieces = [p for p in pieces if is_speakable(p)]
            texts += [(p, paragraph_pause_s if i == len(pieces) - 1 else 0.0, index) for i, p in enumerate(pieces)]
        if texts and texts[-1][2] == index:
            texts[-1] = (texts[-1][0], max(texts[-1][1], chapter_pause_s), index)
    chunks = [
        JobChunk(text=t, seed=chunk_seed(seed, k), pause_after=pause, chapter=chapter)
        for k, (t, pause, chapter) in enumerate(texts)
    ]
    if chunks:
        chunks[-1].pause_after = 0.0
    return chunks


def cut_script(
    parts: list[JobPart], seed: int, chunk_chars: int, max_silence_s: Optional[float] = None
) -> list[JobChunk]:
    """An SSML or dialogue job's chunks: its script's parts in order, packed into chunks of at
    most ``chunk_chars`` characters of text (a chunk of several short turns decodes them as
    parallel rows); a longer part is cut as ``cut_text`` cuts a paragraph, its pause before it
    kept by its first piece. The pauses are the script's own (a pause that starts a chunk is that
    chunk's lead-in), so the chunks need none between them. ``max_silence_s``: a chunk's pauses
    together at most (the planner's ``segments.max_silence_seconds``): a new chunk starts
    before a pause that would pass it, so thousands of short turns with long breaks never make
    one chunk of hours of silence (which the runner would hold in memory, and the planner refuse)."""
    pieces: list[JobPart] = []
    for part in parts:
        if len(part.text) <= chunk_chars:
            pieces.append(part)
            continue
        at = 0
        for n, text in enumerate(pack_text(part.text, chunk_chars)):
            offset = None if part.offset is None else part.offset + at
            pieces.append(
                part.model_copy(
                    update={"text": text, "offset": offset, "pause_before": part.pause_before if n == 0 else 0.0}
                )
            )
            at += len(text)
    groups: list[list[JobPart]] = []
    size = 0
    silence = 0.0
    for piece in pieces:
        quiet = max_silence_s is not None and groups and silence + piece.pause_before > max_silence_s
        if not groups or quiet or (piece.text and size + len(piece.text) > chunk_chars):
            groups.append([])
            size = 0
            silence = 0.0
        groups[-1].append(piece)
        size += len(piece.text)
        silence += piece.pause_before
    return [
        JobChunk(text="".join(p.text for p in group), seed=chunk_seed(seed, k), parts=group)
        for k, group in enumerate(groups)
    ]


def estimated_pcm_bytes(chunks: list[JobChunk], speed: float) -> int:
    """The job's audio as PCM from its written text and the pacing rules: a rough figure only
    (numbers read out are several times longer than written). A job reserves from its
    normalised plan instead (``planning.py``)."""
    level = speed_tag_level(speed)
    seconds = sum(
        expected_seconds(c.text, level) + c.pause_after + sum(p.pause_before for p in c.parts or []) for c in chunks
    )
    return int(seconds * SAMPLE_RATE * PCM_BYTES_PER_SAMPLE)


def chapter_first_chunks(chunks: list[JobChunk]) -> list[int]:
    """The index of each chapter's first chunk (chunks of a chapter are consecutive)."""
    return [k for k, c in enumerate(chunks) if k == 0 or c.chapter != chunks[k - 1].chapter]
