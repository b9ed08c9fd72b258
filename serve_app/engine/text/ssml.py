"""A subset of SSML (Speech Synthesis Markup Language) -> ordered pieces the planner speaks.

``parse_ssml(text)`` reads a ``<speak>`` document into an ``SsmlDocument``:

* ``pieces``: ``SsmlText`` and ``SsmlBreak`` in document order.

  - ``SsmlText(text, span, voice, rate, boundary_before)``: text to speak, whitespace collapsed,
    ``say-as`` and ``sub`` already resolved to speakable words (numbers elsewhere are left to the
    text front end, which reads them as it reads plain input). ``span = (start, end)``: the
    character offsets in the original input the piece came from (``input[start:end]``, from its
    first to its last non-blank character, markup inside it included). ``voice``: the innermost
    ``<voice name>`` around it, passed through as written (None: the request's voice).
    ``rate``: the speed factor of the ``<prosody rate>`` elements around it, multiplied, within
    the service's speed range (1.0: unchanged). ``boundary_before``: a ``speak``/``p``/``s``
    boundary lies between this piece and the previous text piece (True for the first one);
    False when it continues the same sentence and was cut off only by a voice or rate change or
    a break.
  - ``SsmlBreak(seconds, span)``: silence of exactly ``seconds``, ``span`` its ``<break>`` tag.

  Every piece is spoken as its own segments: two pieces are never joined into one segment
  (their voice or rate differ, a break or a sentence boundary lies between them).
* ``unsupported``: what was read but not acted on, once each in order of appearance: element
  names (``emphasis``, ``audio``, ``mark``, ``lang``, anything unknown; their text
  is spoken, except ``desc``/``meta``/``metadata``/``lexicon``, whose content is not speech),
  ``element@attribute`` for attributes ignored on a supported element (``prosody@pitch``), and
  ``say-as:<value>`` for an interpretation not listed below (its text is read as plain input).

Supported: ``speak`` (the root), ``p``/``s`` (each a segment boundary), ``break`` (``time`` as
``500ms``/``1.5s``, else ``strength``, default ``medium``; at most ``MAX_BREAK_SECONDS`` each and
``max_break_total_s`` in all), ``prosody rate`` (``x-slow`` .. ``x-fast``, ``80%``, ``+20%``/
``-20%``, a number multiplier; nested rates multiply), ``voice name``, ``say-as interpret-as``
(``characters``/``spell-out``, ``cardinal``/``number``, ``ordinal``, ``digits``, ``date`` with
``format`` ymd/mdy/dmy/ym/my/md/dm/y/m/d, ``telephone``), ``sub alias``, ``phoneme`` with
``alphabet="pinyin"`` (``ph``: one toned syllable per character, ``hang2``; the piece's text then
holds a marker the planner resolves: ``lexicon.py``; another alphabet is reported as
``phoneme@alphabet=<name>`` and its content read as written). ``xml:lang`` (on any
element, the innermost wins) picks the language say-as content is read in; without it the
``lang`` argument, else the language of the piece's own text.

Safety: the input length is checked before parsing (``max_chars``), the parser is defusedxml's
(a DTD, entity declarations and external references are refused), and the nesting depth is
counted as elements open (``max_depth``), with no recursion and no tree built: pieces are made
as the parser streams its events. Errors are ``InvalidSSMLError`` naming the element and its
line and column (1-based), or ``RequestTooLarge`` for an input or a total of breaks over its
limit.

The parts: ``ssml_handler.py`` (the parser's event handler: elements, positions, pieces),
``ssml_attributes.py`` (attribute values and their bounds), ``ssml_say_as.py`` (the say-as
readings) and ``ssml_pieces.py`` (the pieces returned, exported here).
"""

from __future__ import annotations

import re
from typing import Optional

from defusedxml.common import DefusedXmlException
from defusedxml.ElementTree import DefusedXMLParser, ParseError

from ..errors import RequestTooLarge
from .lang import Lang, check_lang
from .ssml_attributes import MAX_BREAK_SECONDS
from .ssml_handler import _Handler
from .ssml_pieces import SsmlBreak, SsmlDocument, SsmlPiece, SsmlText

__all__ = [
    "MAX_BREAK_SECONDS",
    "MAX_SSML_CHARS",
    "SsmlBreak",
    "SsmlDocument",
    "SsmlPiece",
    "SsmlText",
    "looks_like_ssml",
    "parse_ssml",
]

# The Ingress refuses input over ingress.max_input_chars (4096) before this is reached; this
# bound is for other callers, and the caller passes its own limit as ``max_chars``.
MAX_SSML_CHARS = 16_384
MAX_DEPTH = 32
# Silence costs no GPT work but is audio to encode and send: a 4096-character input could hold
# ~450 ten-second breaks.
MAX_BREAK_TOTAL_SECONDS = 120.0


_SPEAK_START_RE = re.compile(r"\ufeff?\s*(?:<\?xml[^>]*\?>\s*)?<speak[\s>/]")


def looks_like_ssml(text: str) -> bool:
    """Whether ``text`` is an SSML document: it starts with ``<speak`` (after blanks, a byte
    order mark or an XML declaration)."""
    return _SPEAK_START_RE.match(text) is not None


def parse_ssml(
    text: str,
    *,
    lang: Optional[Lang] = None,
    max_chars: int = MAX_SSML_CHARS,
    max_depth: int = MAX_DEPTH,
    max_break_total_s: float = MAX_BREAK_TOTAL_SECONDS,
) -> SsmlDocument:
    """Read an SSML document (see the module docstring). ``lang``: the request's language, for
    say-as content where no ``xml:lang`` says it. ``max_chars``: the longest input read (the
    Ingress passes ``ingress.max_input_chars``); ``max_depth``: the deepest nesting;
    ``max_break_total_s``: the most silence all breaks together may ask for.

    Raises ``InvalidSSMLError`` (400) for what cannot be read, ``RequestTooLarge`` (413) for an
    input or breaks over their limits."""
    if not isinstance(text, str):
        raise TypeError(f"SSML must be str, got {type(text).__name__}")
    check_lang(lang)
    if len(text) > max_chars:
        raise RequestTooLarge(f"SSML input is {len(text)} characters; the limit is {max_chars}")
    # Blanks and a byte order mark before the document are not XML: parse from its first "<",
    # and count offsets from the caller's input.
    base = len(text) - len(text.lstrip("\ufeff \t\r\n"))
    handler = _Handler(text, base, lang, max_depth, max_break_total_s)
    # The encoding is fixed: the text is a str already, whatever its XML declaration says.
    parser = DefusedXMLParser(
        target=handler, encoding="utf-8", forbid_dtd=True, forbid_entities=True, forbid_external=True
    )
    expat = parser.parser
    expat.buffer_text = False  # each text chunk as it comes, at its own position
    handler.expat = expat
    try:
        parser.feed(handler.encoded)
        return parser.close()
    except ParseError as exc:
        message = str(exc).split(":", 1)[0]  # expat's reason; the position is ours (characters)
        offset = handler.char_offset(expat.ErrorByteIndex)
        if handler.source.startswith("</", offset - 2):  # expat points at a mismatched end tag's name
            offset -= 2
        raise handler.error(f"not well-formed SSML: {message}", offset) from None
    except DefusedXmlException:
        doctype = handler.source.find("<!DOCTYPE")
        offset = doctype if doctype >= 0 else handler.char_offset(expat.CurrentByteIndex)
        raise handler.error("DTDs and entity declarations are not allowed in SSML", offset) from None
