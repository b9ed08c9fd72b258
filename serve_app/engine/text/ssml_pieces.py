"""What ``parse_ssml`` returns: a document's pieces in order (``SsmlText``, text to speak;
``SsmlBreak``, a silence) and the ``SsmlDocument`` that holds them.

A module of their own so that the parser's event handler (``ssml_handler.py``), which makes them,
and ``ssml.py``, which exports them with ``parse_ssml``, do not import each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple, Union

Span = Tuple[int, int]


@dataclass(frozen=True)
class SsmlText:
    text: str
    span: Span
    voice: Optional[str] = None
    rate: float = 1.0
    boundary_before: bool = True


@dataclass(frozen=True)
class SsmlBreak:
    seconds: float
    span: Span


SsmlPiece = Union[SsmlText, SsmlBreak]


@dataclass(frozen=True)
class SsmlDocument:
    pieces: Tuple[SsmlPiece, ...]
    unsupported: Tuple[str, ...] = ()

    @property
    def break_seconds(self) -> float:
        return sum(p.seconds for p in self.pieces if isinstance(p, SsmlBreak))

    @property
    def texts(self) -> Tuple[SsmlText, ...]:
        return tuple(p for p in self.pieces if isinstance(p, SsmlText))
