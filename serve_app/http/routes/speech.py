"""Speech and dialogue (``/v1/audio/speech``, ``/v1/audio/dialogue``, with timestamps) and the
model ids: each request gets its record (one log line) and the speech service's answer."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ...errors import APIError
from ...pipeline.flow import ACKS_HEADER
from ...protocol import (
    MODEL_IDS,
    AudioModelList,
    DialogueRequest,
    ModelCard,
    ModelList,
    SpeechRequest,
    TimedSpeech,
    TimedSpeechRequest,
)
from ..errors import error_response
from ..middleware import caller_of
from ..request_log import RequestRecord
from ..state import state_of

router = APIRouter()


@router.post("/v1/audio/speech", response_class=StreamingResponse)
async def speech(body: SpeechRequest, request: Request):
    return await _answer(body, request)


@router.post("/v1/audio/speech/with-timestamps", response_model=TimedSpeech)
async def timed_speech(body: TimedSpeechRequest, request: Request):
    """The whole audio (base64) with where each segment lies in it, and captions on request."""
    return await _answer(body, request, timed=True)


@router.post("/v1/audio/dialogue", response_class=StreamingResponse)
async def dialogue(body: DialogueRequest, request: Request):
    """Turns in several voices, decoded together, spoken in turn order with a pause between."""
    return await _answer(body, request)


@router.post("/v1/audio/dialogue/with-timestamps", response_model=TimedSpeech)
async def timed_dialogue(body: DialogueRequest, request: Request):
    return await _answer(body, request, timed=True)


async def _answer(body: SpeechRequest, request: Request, timed: bool = False):
    state = state_of(request)
    service = state.speech
    rec = RequestRecord.start(body, state.request_id(), client="http", log_text=service.settings.log_text)
    rec.since_arrival(getattr(request.state, "t_in", None))
    cache_control = request.headers.get("cache-control", "")
    try:
        if timed:
            return await service.timed(body, rec, caller_of(request), cache_control)
        flow_acks = request.headers.get(ACKS_HEADER) == "1"
        return await service.respond(body, rec, caller_of(request), cache_control, flow_acks=flow_acks)
    except APIError as exc:
        rec.finish(str(exc.status))
        return error_response(exc)


@router.get("/v1/models", response_model=ModelList)
async def models() -> ModelList:
    return ModelList(data=[ModelCard(id=m) for m in MODEL_IDS])


@router.get("/v1/audio/models", response_model=AudioModelList)
async def audio_models() -> AudioModelList:
    """The speech model ids, without a key (Open WebUI reads ``models``)."""
    cards = [ModelCard(id=m) for m in MODEL_IDS]
    return AudioModelList(data=cards, models=cards)
