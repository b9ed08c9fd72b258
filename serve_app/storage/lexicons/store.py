"""The lexicon store's interface (``LexiconStore``) and its one-process backend (``memory``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Optional

from ...errors import APIError
from ...settings import LexiconStoreConfig
from .model import ANONYMOUS, LEXICON_ID_RE, StoredLexicon, check_room, store_unavailable


class LexiconStore(ABC):
    """Every read and delete takes ``owner`` (whose lexicons it may find) and ``admin`` (every
    owner's). An owner's default lexicon is a pointer beside its lexicons: the newest made with
    ``default: true`` (deleting it leaves the owner without one)."""

    def __init__(self, cfg: LexiconStoreConfig):
        self.cfg = cfg

    async def create(self, lexicon: StoredLexicon) -> StoredLexicon:
        """Store a new lexicon; 409 when its owner holds its quota or the store is full, 503 when
        the backend fails."""
        await self._guard(self._create, lexicon, lexicon.to_json())
        return lexicon

    async def get(self, lexicon_id: str, owner: str = ANONYMOUS, admin: bool = False) -> Optional[StoredLexicon]:
        """``owner``'s lexicon with this id (an admin: anyone's); another owner's reads as None."""
        if not LEXICON_ID_RE.fullmatch(lexicon_id or ""):
            return None
        found = await self._guard(self._get, lexicon_id, None if admin else owner)
        if found is None or not (admin or found.owner == owner):
            return None
        return (await self._marked([found], found.owner))[0]

    async def default_of(self, owner: str) -> Optional[StoredLexicon]:
        """``owner``'s default lexicon, if it has one."""
        lexicon_id = await self._guard(self._default_id, owner)
        return await self.get(lexicon_id, owner) if lexicon_id else None

    async def list(self, owner: str = ANONYMOUS, admin: bool = False) -> list[StoredLexicon]:
        """``owner``'s lexicons (an admin: everyone's), oldest first."""
        found = await self._guard(self._list, None if admin else owner)
        if not admin:
            found = [x for x in found if x.owner == owner]
        out = []
        for who in dict.fromkeys(x.owner for x in found):
            out += await self._marked([x for x in found if x.owner == who], who)
        return sorted(out, key=lambda x: x.created_at)  # stable: the backend's order within a second

    async def delete(self, lexicon_id: str, owner: str = ANONYMOUS, admin: bool = False) -> bool:
        """Delete ``owner``'s lexicon (an admin: anyone's); False for another owner's, as for a missing one."""
        if not LEXICON_ID_RE.fullmatch(lexicon_id or ""):
            return False
        return await self._guard(self._delete, lexicon_id, None if admin else owner)

    async def close(self) -> None:
        return None

    async def _marked(self, lexicons: list[StoredLexicon], owner: str) -> list[StoredLexicon]:
        """``default`` as the owner's pointer says (a document keeps the flag it was made with)."""
        default = await self._guard(self._default_id, owner)
        return [x.model_copy(update={"default": x.id == default}) for x in lexicons]

    async def _guard(self, fn, *args):
        try:
            return await fn(*args)
        except APIError:
            raise
        except Exception as exc:  # noqa: BLE001 - disk or network trouble: the caller gets a 503
            raise store_unavailable(exc) from None

    def _check_room(self, owned: int, total: int) -> None:
        check_room(owned, total, self.cfg.max_lexicons_per_key, self.cfg.max_lexicons)

    @abstractmethod
    async def _create(self, lexicon: StoredLexicon, doc: str) -> None:
        """Atomically: the owner's quota, the store's limit, the write, the default pointer."""

    @abstractmethod
    async def _get(self, lexicon_id: str, owner: Optional[str]) -> Optional[StoredLexicon]:
        """The lexicon if it exists and ``owner`` (None: anyone) owns it."""

    @abstractmethod
    async def _default_id(self, owner: str) -> Optional[str]: ...

    @abstractmethod
    async def _list(self, owner: Optional[str]) -> list[StoredLexicon]: ...

    @abstractmethod
    async def _delete(self, lexicon_id: str, owner: Optional[str]) -> bool:
        """Delete it (and the owner's default pointer if it points at it)."""


class MemoryLexiconStore(LexiconStore):
    """One process's lexicons (tests, one replica). Each method runs without awaiting in between:
    atomic on the replica's event loop."""

    def __init__(self, cfg: LexiconStoreConfig):
        super().__init__(cfg)
        self._docs: dict[str, str] = {}  # id -> JSON (a copy, as the other backends keep)
        self._owned: dict[str, dict[str, None]] = {}  # owner -> its ids, in creation order
        self._defaults: dict[str, str] = {}  # owner -> id

    async def _create(self, lexicon: StoredLexicon, doc: str) -> None:
        self._check_room(len(self._owned.get(lexicon.owner, ())), len(self._docs))
        self._docs[lexicon.id] = doc
        self._owned.setdefault(lexicon.owner, {})[lexicon.id] = None
        if lexicon.default:
            self._defaults[lexicon.owner] = lexicon.id

    async def _get(self, lexicon_id: str, owner: Optional[str]) -> Optional[StoredLexicon]:
        if owner is not None and lexicon_id not in self._owned.get(owner, ()):
            return None
        doc = self._docs.get(lexicon_id)
        return StoredLexicon.model_validate_json(doc) if doc is not None else None

    async def _default_id(self, owner: str) -> Optional[str]:
        return self._defaults.get(owner)

    async def _list(self, owner: Optional[str]) -> list[StoredLexicon]:
        ids = self._docs if owner is None else self._owned.get(owner, {})
        return [StoredLexicon.model_validate_json(self._docs[i]) for i in ids if i in self._docs]

    async def _delete(self, lexicon_id: str, owner: Optional[str]) -> bool:
        found = await self._get(lexicon_id, owner)
        if found is None:
            return False
        del self._docs[lexicon_id]
        self._owned.get(found.owner, {}).pop(lexicon_id, None)
        if self._defaults.get(found.owner) == lexicon_id:
            del self._defaults[found.owner]
        return True
