"""The pronunciation lexicons API: ``POST/GET /v1/audio/lexicons``, ``GET/DELETE
/v1/audio/lexicons/{id}``, each for the caller's own lexicons (an admin key: every key's).

A create is checked against the key's quota before its body is read; the body (up to
``lexicons.max_upload_bytes``) is parsed, validated and its pinyin checked in the store's bulk
workers, never on the event loop; the listing reads each lexicon's stored summary (no entry is
validated). pypinyin's syllable table is built when the replica starts, not in a request.
"""

from __future__ import annotations

import json
import logging
import threading
from concurrent.futures import Future
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from ..engine.text.pinyin import syllable_table
from ..errors import APIError
from ..protocol.lexicons import CreateLexicon
from ..settings import LexiconStoreConfig
from ..storage.lexicons import LexiconBook, StoredLexicon, check_syllables, make_lexicon_store, parse_create
from ..storage.lexicons import lexicon_not_found as _not_found
from .bodies import read_bounded
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
        # pypinyin's table (~0.5 s) at the replica's start, in a thread of its own: a create that
        # comes sooner waits for it in a worker, never on the loop.
        self.warming: Future = Future()
        self.warming.set_running_or_notify_cancel()
        threading.Thread(target=self._warm, name="lexicons-warmup", daemon=True).start()

    def _warm(self) -> None:
        try:
            syllable_table()
            self.warming.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - a create then says why
            self.warming.set_exception(exc)

    async def _body(self, request: Request) -> bytes:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("application/json", ""):
            raise APIError(
                415, f"unsupported content type {ctype!r}: use application/json", code="unsupported_media_type"
            )
        limit = self.cfg.max_upload_bytes
        return await read_bounded(
            request, limit, lambda: APIError(413, f"a lexicon is at most {limit} bytes of JSON", code="body_too_large")
        )

    def _read(self, raw: bytes, owner: str) -> StoredLexicon:
        """The body as a lexicon, every bound checked (blocking: in a bulk worker)."""
        text = raw.decode("utf-8", errors="replace")
        check_json_depth(text)
        try:
            body = json.loads(text or "null")
        except ValueError:
            raise APIError(400, "request body is not valid JSON", code="invalid_json") from None
        lexicon = parse_create(body, self.cfg, owner)
        self.warming.result()  # pypinyin's table, built at the start
        check_syllables(lexicon)
        return lexicon

    async def create(self, request: Request, caller: Caller) -> Response:
        """A lexicon owned by the caller's key; 409 past the key's quota or the store's (before
        the body is read), 400 naming the bad entry, 413 past the bounds."""
        await self.store.check_room(caller.owner)
        raw = await self._body(request)
        lexicon = await self.store.workers.bulk(self._read, raw, caller.owner)
        await self.store.create(lexicon)
        log.info(json.dumps({"event": "lexicon_created", "id": lexicon.id, "owner": lexicon.owner}))
        return await self._detail(await self._stored(lexicon.id, caller))

    async def list(self, caller: Caller) -> Response:
        """The caller's lexicons' summaries (an admin: every key's), without their entries."""
        data = await self.store.summaries(caller.owner, admin=caller.admin)
        return await self.store.workers.bulk(_json, {"object": "list", "data": data})

    async def get(self, lexicon_id: str, caller: Caller) -> Response:
        return await self._detail(await self._stored(lexicon_id, caller))

    async def _detail(self, found: StoredLexicon) -> Response:
        """One lexicon with its entries, written out in a worker (a ready answer: the route's
        response model does not validate 500 entries again on the loop)."""
        return await self.store.workers.bulk(lambda: _json(found.detail()))

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


def _json(body: Any) -> Response:
    """An answer already in the API's shape (``protocol.lexicons``), as JSON (blocking: in a worker)."""
    return Response(json.dumps(body, ensure_ascii=False).encode(), media_type="application/json")
