"""The voices API (``/v1/audio/voices``, and ``/v1/voices`` for listing): custom voices owned by
the caller's key (the service: ``http/voices.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ...protocol import VoiceList
from ..middleware import caller_of
from ..state import state_of
from ..voices import CREATE_VOICE_OPENAPI, VOICES_PATH

router = APIRouter()


@router.get("/v1/voices", response_model=VoiceList)
async def voices_listing(request: Request):
    """The voices listing (as ``GET /v1/audio/voices``; built-in voices without a key)."""
    return await state_of(request).voices.list(caller_of(request))


@router.post(VOICES_PATH, openapi_extra=CREATE_VOICE_OPENAPI)
async def create_voice(request: Request):
    """A custom voice from a speaker string, a seed, or a 2-30 s clip and its transcript, owned
    by the caller's key."""
    return await state_of(request).voices.create(request, caller_of(request))


@router.get(VOICES_PATH, response_model=VoiceList)
async def list_voices(request: Request):
    """Built-in voices and the caller's custom ones (an admin key: every key's); without a key
    where keys are on, the built-in voices only (Open WebUI asks so)."""
    return await state_of(request).voices.list(caller_of(request))


@router.get(VOICES_PATH + "/{voice_id}")
async def get_voice(voice_id: str, request: Request):
    """One voice, with its speaker string (and a clip voice's codes and transcript) to keep."""
    return await state_of(request).voices.get(voice_id, caller_of(request))


@router.delete(VOICES_PATH + "/{voice_id}")
async def delete_voice(voice_id: str, request: Request):
    return await state_of(request).voices.delete(voice_id, caller_of(request))
