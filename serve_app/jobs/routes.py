"""The jobs API's router (``/v1/audio/jobs``; the service: ``service.py``)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from ..http.middleware import caller_of
from ..http.state import state_of
from ..protocol import AudioJob, AudioJobDeleted, AudioJobList
from .request import CREATE_JOB_OPENAPI
from .service import JOBS_PATH

router = APIRouter()


def _root(request: Request) -> str:
    return request.scope.get("root_path", "")


@router.post(JOBS_PATH, status_code=202, response_model=AudioJob, openapi_extra=CREATE_JOB_OPENAPI)
async def create_job(request: Request):
    """A long text (JSON, text/plain or a file) spoken in the background into one file: 202 and the job."""
    return await state_of(request).jobs.create(request, caller_of(request))


@router.get(JOBS_PATH, response_model=AudioJobList)
async def list_jobs(request: Request):
    """The caller's jobs, newest first (an admin key: every key's)."""
    return await state_of(request).jobs.list(caller_of(request), _root(request))


@router.get(JOBS_PATH + "/{job_id}", response_model=AudioJob)
async def get_job(job_id: str, request: Request):
    """A job's status and progress (chunks, characters, audio seconds so far, an ETA)."""
    return await state_of(request).jobs.get(job_id, caller_of(request), _root(request))


@router.api_route(JOBS_PATH + "/{job_id}/audio", methods=["GET", "HEAD"])
async def job_audio(job_id: str, request: Request):
    """A succeeded job's file; Range requests answer 206 (players seek)."""
    return await state_of(request).jobs.audio(job_id, caller_of(request))


@router.api_route(JOBS_PATH + "/{job_id}/captions", methods=["GET", "HEAD"])
async def job_captions(job_id: str, request: Request):
    """A succeeded job's captions (made with ``captions``: SRT or WebVTT)."""
    return await state_of(request).jobs.captions(job_id, caller_of(request))


@router.post(JOBS_PATH + "/{job_id}/cancel", response_model=AudioJob)
async def cancel_job(job_id: str, request: Request):
    """Stop the job and keep it as ``cancelled`` (DELETE stops it and deletes it)."""
    return await state_of(request).jobs.cancel(job_id, caller_of(request), _root(request))


@router.api_route(JOBS_PATH + "/{job_id}/chapters/{chapter}/audio", methods=["GET", "HEAD"])
async def job_chapter_audio(job_id: str, chapter: int, request: Request):
    """One chapter's file of a succeeded job made with ``chapters``; Range requests work."""
    return await state_of(request).jobs.chapter_audio(job_id, chapter, caller_of(request))


@router.api_route(JOBS_PATH + "/{job_id}/chapters/{chapter}/captions", methods=["GET", "HEAD"])
async def job_chapter_captions(job_id: str, chapter: int, request: Request):
    """One chapter's captions, timed on its own file (made with ``chapters`` and ``captions``)."""
    return await state_of(request).jobs.chapter_captions(job_id, chapter, caller_of(request))


@router.delete(JOBS_PATH + "/{job_id}", response_model=AudioJobDeleted)
async def delete_job(job_id: str, request: Request):
    """Cancel the job (its running chunks stop at once) and delete its files."""
    return await state_of(request).jobs.delete(job_id, caller_of(request))
