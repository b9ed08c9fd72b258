"""The pronunciation lexicons API's shapes: ``/v1/audio/lexicons`` (storage: ``storage/lexicons``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from ..engine.strict import StrictModel
from ..engine.text.lexicon import LexiconEntry


class CreateLexicon(StrictModel):
    """``POST /v1/audio/lexicons``: entries map written text to an ``alias`` ("SQL" -> "sequel")
    or, for Chinese, to ``pinyin`` with tone numbers, one syllable per character (银行 ->
    "yin2 hang2": 行 is hang2 there). ``default``: applied to this key's requests that name no
    lexicon (the newest default wins; ``"lexicon": "none"`` in a request turns it off)."""

    name: str = Field(min_length=1, max_length=64)
    entries: list[LexiconEntry] = Field(min_length=1)
    default: bool = False


class LexiconCard(BaseModel):
    id: str
    object: Literal["lexicon"] = "lexicon"
    name: str
    owner: str
    created_at: int
    default: bool
    entry_count: int
    content_hash: str = Field(description="Of the entries: what the response cache keys.")


class LexiconDetail(LexiconCard):
    entries: list[LexiconEntry]


class LexiconList(BaseModel):
    object: Literal["list"] = "list"
    data: list[LexiconCard]


class LexiconDeleted(BaseModel):
    id: str
    object: Literal["lexicon.deleted"] = "lexicon.deleted"
    deleted: bool = True
