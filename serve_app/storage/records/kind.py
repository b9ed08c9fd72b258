"""What a kind of owner-scoped record is to the generic stores: its id, its document model, where
its backends keep it, and the errors it answers with; and the owners every kind shares."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ...errors import APIError
from ..faults import failure

log = logging.getLogger(__name__)

MAX_OWNER_CHARS = 128


def owner_tag(owner: str) -> str:
    """An owner as the backends name it (a hash: an owner never becomes a path or key)."""
    return hashlib.sha256(b"owner\0" + owner.encode()).hexdigest()[:16]


@dataclass
class Index:
    """The directory backend's index, read: every record's id and its owner's tag (creation order),
    and the pointers (field -> id: a voice's name, an owner's default lexicon)."""

    ids: dict[str, str] = field(default_factory=dict)
    pointers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RecordKind:
    """One kind of record. A record is a pydantic document with ``id``, ``owner``, ``created_at``
    and ``to_json()``; a pointer is a field that names one record (``unique_pointers``: a second
    record under a taken field is refused, else the newest wins)."""

    noun: str  # "voice": in error messages and codes
    id_re: re.Pattern
    model: Any  # the document's pydantic class
    key_letter: str  # Redis: the document under <prefix>:<key_letter>:<id>
    pointer_hash: str  # Redis: the pointers under <prefix>:<pointer_hash>
    index_file: str  # directory: the index's file name
    read_index: Callable[[Any], Index]  # directory: the index file's JSON, read
    write_index: Callable[[Index], Any]  # directory: the index as its file keeps it
    unique_pointers: bool = False
    track_owners: bool = False  # Redis: every owner's tag in <prefix>:owners (a voice store's adoption)
    taken: Optional[Callable[[Any], APIError]] = None  # the 409 for a taken unique pointer
    owned_plural: str = ""  # what a key owns its limit of ("custom voices"; default: the plural)

    @property
    def plural(self) -> str:
        return self.noun + "s"

    def parse(self, doc: str | bytes) -> Any:
        return self.model.model_validate_json(doc)

    def check_id(self, record_id: str) -> str:
        """``record_id`` before it becomes a path or a key: ids are generated and checked, never
        user text (a raise, not an assert: python -O)."""
        if not self.id_re.fullmatch(record_id):
            raise ValueError(f"not a {self.noun} id: {record_id[:64]!r}")
        return record_id

    def quota_reached(self, limit: int) -> APIError:
        return APIError(
            409,
            f"this API key owns its limit of {self.owned_plural or self.plural} ({limit}); delete one first",
            code=f"{self.noun}_quota_exceeded",
        )

    def store_full(self, limit: int) -> APIError:
        return APIError(
            409,
            f"the {self.noun} store is full ({limit} {self.plural}); delete one first",
            code=f"too_many_{self.plural}",
        )

    def failed(self, exc: BaseException) -> APIError:
        """What a backend failure answers: 507 out of space, else 503 (retry shortly)."""
        log.warning("%s store failed: %s: %s", self.noun, exc.__class__.__name__, exc)
        return failure(self.noun, exc)

    def check_room(self, owned: int, total: int, max_owned: int, max_total: int) -> None:
        """409 unless the owner (holding ``owned``) and the store (``total``) have room for one more."""
        if owned >= max_owned:
            raise self.quota_reached(max_owned)
        if total >= max_total:
            raise self.store_full(max_total)
