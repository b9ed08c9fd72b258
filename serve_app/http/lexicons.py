"""The pronunciation lexicons API: ``POST/GET /v1/audio/lexicons``, ``GET/DELETE
/v1/audio/lexicons/{id}``, each for the caller's own lexicons (an admin key: every key's)."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from fastapi import Request

from ..errors import APIError
from ..protocol.lexicons import CreateLexicon
from ..settings import LexiconStoreConfig
from ..storage.lexicons import LexiconBook, StoredLexicon, check_syllables, make_lexicon_store, parse_create
from ..storage.lexicons import lexicon_not_found as _not_found
from .jsonlimits import check_json_depth
from .security import Caller

log = logging.getLogger("ray.serve")

LEXICONS_PATH = "/v1/audio/lexicons"
# The create route reads its body itself (bounds before parsing): the schema, its entries by
# reference to the component FastAPI makes for the answers' ``LexiconEntry``.
_CREATE_SCHEMA = CreateLexicon.model_json_schema(ref_template="#/components/schemas/{model}")
_CREATE_SCHEMA.pop("$defs", None)
CREATE_LEXICON_OPENAPI = {
    "requestBody": {"required": True, "content": {"application/json": {"schema": _CREATE_SCHEMA}}}
}


class LexiconsAPI:
    """``cfg``: resolved (``LexiconStoreConfig.resolved``: its backend and place known)."""

    def __init__(self, cfg: LexiconStoreConfig):
        self.cfg = cfg
        self.store = make_lexicon_store(cfg)
        self.book = LexiconBook(self.store)

    async def _body(self, request: Request) -> Any:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise APIError(
                415, f"unsupported content type {ctype!r}: use application/json", code="unsupported_media_type"
            )
        raw = b""
        async for piece in request.stream():
            raw += piece
            if len(raw) > self.cfg.max_upload_bytes:
                raise APIError(
                    413, f"a lexicon is at most {self.cfg.max_upload_bytes} bytes of JSON", code="body_too_large"
                )
        text = raw.decode("utf-8", errors="replace")
        check_json_depth(text)
        try:
            return json.loads(text or "null")
        except ValueError:
            raise APIError(400, "request body is not valid JSON", code="invalid_json") from None

    def _read(self, body: Any, owner: str) -> StoredLexicon:
        lexicon = parse_create(body, self.cfg, owner)
        check_syllables(lexicon)  # builds pinyin's table once: on this worker thread
        return lexicon

    async def create(self, request: Request, caller: Caller) -> dict[str, Any]:
        """A lexicon owned by the caller's key; 400 naming the bad entry, 413 past the bounds,
        409 past the key's quota or the store's."""
        body = await self._body(request)
        lexicon = await asyncio.to_thread(self._read, body, caller.owner)
        await self.store.create(lexicon)
        log.info(json.dumps({"event": "lexicon_created", "id": lexicon.id, "owner": lexicon.owner}))
        return (await self._stored(lexicon.id, caller)).detail()

    async def list(self, caller: Caller) -> dict[str, Any]:
        found = await self.store.list(caller.owner, admin=caller.admin)
        return {"object": "list", "data": [x.summary() for x in found]}

    async def get(self, lexicon_id: str, caller: Caller) -> dict[str, Any]:
        return (await self._stored(lexicon_id, caller)).detail()

    async def delete(self, lexicon_id: str, caller: Caller) -> dict[str, Any]:
        if not await self.store.delete(lexicon_id, caller.owner, admin=caller.admin):
            raise _not_found(lexicon_id)
        log.info(json.dumps({"event": "lexicon_deleted", "id": lexicon_id, "by": caller.owner}))
        return {"id": lexicon_id, "object": "lexicon.deleted", "deleted": True}

    async def _stored(self, lexicon_id: str, caller: Caller) -> StoredLexicon:
        """The caller's lexicon (an admin: anyone's); a 404 alike for another key's and for none."""
        found = await self.store.get(lexicon_id, caller.owner, admin=caller.admin)
        if found is None:
            raise _not_found(lexicon_id)
        return found
