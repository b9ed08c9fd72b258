"""The pronunciation lexicons API (``/v1/audio/lexicons``; the service: ``http/lexicons.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...protocol.lexicons import LexiconDeleted, LexiconDetail, LexiconList
from ..lexicons import CREATE_LEXICON_OPENAPI, LEXICONS_PATH
from ..middleware import caller_of
from ..state import state_of

router = APIRouter()


@router.post(LEXICONS_PATH, response_model=LexiconDetail, openapi_extra=CREATE_LEXICON_OPENAPI)
async def create_lexicon(request: Request):
    """A pronunciation lexicon owned by the caller's key: entries {text, alias} or {text, pinyin}."""
    return await state_of(request).lexicons.create(request, caller_of(request))


@router.get(LEXICONS_PATH, response_model=LexiconList)
async def list_lexicons(request: Request):
    """The caller's lexicons (an admin key: every key's), without their entries."""
    return await state_of(request).lexicons.list(caller_of(request))


@router.get(LEXICONS_PATH + "/{lexicon_id}", response_model=LexiconDetail)
async def get_lexicon(lexicon_id: str, request: Request):
    return await state_of(request).lexicons.get(lexicon_id, caller_of(request))


@router.delete(LEXICONS_PATH + "/{lexicon_id}", response_model=LexiconDeleted)
async def delete_lexicon(lexicon_id: str, request: Request):
    return await state_of(request).lexicons.delete(lexicon_id, caller_of(request))
