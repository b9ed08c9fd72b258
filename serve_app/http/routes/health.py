"""Health (``/healthz``, ``/health``), readiness (``/readyz``) and the web page (``/ui/``)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse

from ..state import state_of
from ..webui import page_response

router = APIRouter()


@router.get("/", include_in_schema=False)
async def root():
    return RedirectResponse("ui/")


@router.get("/ui/{name:path}", include_in_schema=False)
async def ui(name: str):
    return page_response(name)


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


# The same for monitors and clients that probe /health. JSON, never the plain text "OK":
# wyoming-openai takes a server whose /health says exactly that for Speaches.
@router.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request):
    state = state_of(request)
    return state.readiness.answer(state.speech.weights_kind)
