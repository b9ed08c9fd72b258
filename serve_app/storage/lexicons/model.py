"""A stored pronunciation lexicon and the rules every backend keeps: ids, owners, bounds, the
default lexicon of an owner, and the errors they answer with."""

from __future__ import annotations

import json
import re
import secrets
import time
from functools import cached_property
from pathlib import Path
from typing import Any, Optional

from pydantic import Field, ValidationError

from ...engine.strict import StrictModel
from ...engine.text.lexicon import MAX_ENTRIES, LexiconEntry, Pronunciations, entries_hash
from ...errors import APIError
from ...settings import LexiconStoreConfig
from ..records import ANONYMOUS, MAX_OWNER_CHARS, Index
from ..voices.model import default_voices_dir

# As voice ids: lower-case hex, \A..\Z (no "$" before a final newline).
LEXICON_ID_RE = re.compile(r"\Alex_[0-9a-f]{24}\Z")
LEXICON_ID_PATTERN = r"^lex_[0-9a-f]{24}$"
MAX_NAME_CHARS = 64

__all__ = [
    "ANONYMOUS",
    "LEXICON_ID_RE",
    "MAX_NAME_CHARS",
    "StoredLexicon",
    "default_lexicons_dir",
    "lexicon_not_found",
    "new_lexicon_id",
    "parse_create",
    "read_index",
    "summary_of",
    "write_index",
]


def default_lexicons_dir(cfg: LexiconStoreConfig) -> Path:
    """``path``, else ``lexicons/`` in the voices' default directory."""
    return Path(cfg.path).expanduser() if cfg.path else default_voices_dir() / "lexicons"


# A summary's fields as the document keeps them (``summary_of`` reads them without the entries),
# all before the entries, the document's last field.
_SUMMARY_FIELDS = ("id", "name", "owner", "created_at", "default", "entry_count", "content_hash")
_ENTRIES_KEY = ',"entries":'


class StoredLexicon(StrictModel):
    """One lexicon as stored: its entries, its owner (the API key id that made it, or
    ``anonymous``) and whether it is the owner's default (applied when a request names none).
    ``entry_count`` and ``content_hash`` are written when it is made, so a listing reads them
    without validating the entries (documents stored before have none: computed then)."""

    id: str = Field(pattern=LEXICON_ID_PATTERN)
    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    owner: str = Field(default=ANONYMOUS, min_length=1, max_length=MAX_OWNER_CHARS)
    created_at: int
    default: bool = False
    entry_count: Optional[int] = Field(default=None, ge=0)
    content_hash: Optional[str] = Field(default=None, max_length=64)
    entries: tuple[LexiconEntry, ...] = Field(max_length=MAX_ENTRIES)

    @cached_property
    def _pronunciations(self) -> Pronunciations:
        return Pronunciations.stored(self.entries, self.content_hash)

    def pronunciations(self) -> Pronunciations:
        """The entries as a request carries them (one object per parsed document: its hash is
        the stored one, computed at most once)."""
        return self._pronunciations

    def summary(self) -> dict[str, Any]:
        """What the list answer shows (no entries: they may be many)."""
        return {
            "id": self.id,
            "object": "lexicon",
            "name": self.name,
            "owner": self.owner,
            "created_at": self.created_at,
            "default": self.default,
            "entry_count": len(self.entries),
            "content_hash": self.pronunciations().content_hash,
        }

    def detail(self) -> dict[str, Any]:
        return {**self.summary(), "entries": [e.model_dump(exclude_none=True) for e in self.entries]}

    def to_json(self) -> str:
        return self.model_dump_json(exclude_none=True)


class _CreateBody(StrictModel):
    """``POST /v1/audio/lexicons``'s body."""

    name: str = Field(min_length=1, max_length=MAX_NAME_CHARS)
    entries: list[dict[str, Any]] = Field(min_length=1)
    default: bool = False


def _invalid(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_lexicon")


def parse_create(body: Any, cfg: LexiconStoreConfig, owner: str) -> StoredLexicon:
    """A create request's body read into a lexicon, every bound checked before any entry is
    parsed (400 naming the field; a pinyin syllable is checked against the table later)."""
    if not isinstance(body, dict):
        raise _invalid("send a JSON object: {name, entries: [{text, alias | pinyin}], default}", "body")
    entries = body.get("entries")
    if isinstance(entries, list) and len(entries) > cfg.max_entries:
        raise APIError(
            413,
            f"lexicon has {len(entries)} entries; the limit is {cfg.max_entries}",
            param="entries",
            code="lexicon_too_large",
        )
    try:
        parsed = _CreateBody.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        raise _invalid(f"{where}: {err['msg']}", where) from None
    name = parsed.name
    if name != name.strip() or not name.isprintable():
        raise _invalid("name: printable characters without leading or trailing spaces", "name")
    if parsed.default and owner == ANONYMOUS:
        raise _invalid(
            "default: a default lexicon needs an API key (without keys every caller shares one owner, and a "
            "default would change everyone's speech); name the lexicon in each request instead",
            "default",
        )
    out: list[LexiconEntry] = []
    seen: set[str] = set()
    for i, raw in enumerate(parsed.entries):
        where = f"entries.{i}"
        text, reading = raw.get("text"), raw.get("alias", raw.get("pinyin"))
        if isinstance(text, str) and len(text) > cfg.max_entry_chars:
            raise _invalid(f"{where}.text: at most {cfg.max_entry_chars} characters", where)
        if isinstance(reading, str) and len(reading) > cfg.max_alias_chars:
            raise _invalid(f"{where}: alias or pinyin at most {cfg.max_alias_chars} characters", where)
        try:
            entry = LexiconEntry.model_validate(raw)
        except ValidationError as exc:
            raise _invalid(f"{where}: {exc.errors()[0]['msg']}", where) from None
        if entry.text.lower() in seen:
            raise _invalid(f"{where}: {entry.text!r} is in the lexicon twice", where)
        seen.add(entry.text.lower())
        out.append(entry)
    entries = tuple(out)
    return StoredLexicon(
        id=new_lexicon_id(),
        name=name,
        owner=owner,
        created_at=int(time.time()),
        default=parsed.default,
        entry_count=len(entries),
        content_hash=entries_hash(entries),
        entries=entries,
    )


def summary_of(record_id: str, doc: str | bytes) -> dict[str, Any]:
    """A stored document's summary (``StoredLexicon.summary``): read from the fields written when
    it was made, which come before its entries (``model_dump_json`` keeps the fields' order), so
    only that head is parsed: the entries are neither parsed, validated nor hashed (a listing of
    20 lexicons of 500 pinyin entries was ~200 ms of pydantic; parsing their JSON alone, ~10,000
    objects a listing for the collector). A document stored before those fields is parsed whole.
    Blocking: in a worker."""
    text = doc.decode() if isinstance(doc, bytes) else doc
    head: Any = None
    cut = text.find(_ENTRIES_KEY)  # a quote inside a string is escaped: this is the field itself
    if cut > 0:
        try:
            head = json.loads(text[:cut] + "}")
        except ValueError:
            head = None
    if not isinstance(head, dict) or head.get("id") != record_id or head.get("entry_count") is None:
        return StoredLexicon.model_validate_json(text).summary()
    if not head.get("content_hash"):
        return StoredLexicon.model_validate_json(text).summary()
    out = {k: head.get(k, False if k == "default" else None) for k in _SUMMARY_FIELDS}
    return {"id": out.pop("id"), "object": "lexicon", **out}


def new_lexicon_id() -> str:
    return "lex_" + secrets.token_hex(12)


def lexicon_not_found(lexicon_id: Optional[str], status: int = 404) -> APIError:
    """Another owner's lexicon answers exactly as a missing one."""
    shown = (lexicon_id or "")[:40]
    return APIError(status, f"no lexicon with id {shown!r}", param="lexicon", code="lexicon_not_found")


def read_index(raw: dict) -> Index:
    """``index.json``: ``{"ids": {id: owner tag}, "defaults": {owner tag: id}}`` (creation order kept)."""
    return Index(ids=dict(raw.get("ids", {})), pointers=dict(raw.get("defaults", {})))


def write_index(index: Index) -> dict:
    return {"ids": index.ids, "defaults": index.pointers}
