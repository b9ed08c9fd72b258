"""What a caller gets of a stored job: its view (``AudioJob``: progress, ETA, chapters, URLs) and
its files (audio, captions, a chapter's) with Range requests, through store calls kept off the
event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, Optional

from fastapi.responses import FileResponse, Response

from ..engine.audio import SAMPLE_RATE
from ..engine.errors import JobError, UnknownJobError
from ..errors import APIError, as_api_error
from ..http.ranged import RangedResponse
from ..protocol import AudioJob, JobChapter, JobFailure, JobProgress
from ..storage.faults import failure
from ..storage.jobs import JobStore, StoredJob

log = logging.getLogger("ray.serve")

JOBS_PATH = "/v1/audio/jobs"


def not_found(job_id: str) -> UnknownJobError:
    return UnknownJobError(f"no job with id {job_id[:64]!r}")


async def store_call(fn: Any, *args: Any) -> Any:
    """A store call, off the event loop; a refusal keeps its own status, a write with no room is a
    507 (nothing was stored: a creation's files are taken back), any other failure a 503."""
    try:
        return await asyncio.to_thread(fn, *args)
    except (APIError, JobError):
        raise
    except Exception as exc:  # noqa: BLE001
        log.warning("jobs: store failed: %s: %s", exc.__class__.__name__, exc)
        raise failure("job", exc) from None


async def file_response(store: JobStore, job: StoredJob, name: str, media_type: str, filename: str) -> Response:
    """One of ``job``'s stored files (``name``: the store's own name for it, never user text),
    with Range requests. A local file (the directory backend, ``file://``) is Starlette's
    ``FileResponse``: one range 206 with Content-Range, several a multipart/byteranges 206, a
    start past the end 416 with ``Content-Range: bytes */<size>``, ``If-Range`` with its ETag or
    Last-Modified. A file in an object store is a ``RangedResponse``: the same for one range
    (several get the whole file), streamed by ranged reads from the store."""
    headers = {"Cache-Control": "private, max-age=0"}
    path = await store_call(store.local_path, job, name)
    if path is not None:
        return FileResponse(
            path, media_type=media_type, filename=filename, content_disposition_type="inline", headers=headers
        )
    stat = await store_call(store.stat, job, name)
    if stat is None:
        raise as_api_error(not_found(job.id))
    return RangedResponse(
        stat,
        functools.partial(store.read_range, job, name),
        media_type=media_type,
        filename=filename,
        content_disposition_type="inline",
        headers=headers,
    )


def _stamp(t: Optional[float]) -> Optional[int]:
    return int(t) if t is not None else None


def job_view(job: StoredJob, root: str = "") -> AudioJob:
    """What a caller sees of a stored job: progress with an ETA, chapters, the URLs of what is done
    (``root``: the app's root path, joined before each URL)."""
    eta = None
    made = job.chars_done - job.run_chars_start
    if job.active and job.run_started_at is not None and made > 0:
        # The rate of the runner's current run, up to now: it falls while a chunk takes long.
        rate = made / max(1e-3, time.time() - job.run_started_at)
        eta = round((job.chars_total - job.chars_done) / rate, 1)
    elif job.status == "succeeded":
        eta = 0.0
    progress = JobProgress(
        chunks_done=job.chunks_done,
        chunks_total=job.chunks_total,
        characters_done=job.chars_done,
        characters_total=job.chars_total,
        audio_seconds=round(job.audio_samples / SAMPLE_RATE, 3),
        eta_seconds=eta,
    )
    chapters = None
    if job.chapter_titles:
        done = job.status == "succeeded" and len(job.chapter_times) == len(job.chapter_titles)
        chapters = [
            JobChapter(
                index=n,
                title=title,
                chunks_total=end - first,
                chunks_done=sum(1 for k in range(first, end) if job.chunk_samples[k] >= 0),
                start_seconds=job.chapter_times[n][0] if done else None,
                duration_seconds=job.chapter_times[n][1] if done else None,
                audio_url=f"{root}{JOBS_PATH}/{job.id}/chapters/{n}/audio" if done else None,
                captions_url=f"{root}{JOBS_PATH}/{job.id}/chapters/{n}/captions" if done and job.captions else None,
            )
            for n, (title, (first, end)) in enumerate(zip(job.chapter_titles, job.chapter_spans()))
        ]
    return AudioJob(
        id=job.id,
        status=job.status,
        created_at=int(job.created_at),
        started_at=_stamp(job.started_at),
        finished_at=_stamp(job.finished_at),
        expires_at=_stamp(job.expires_at),
        model=job.model,
        voice=job.voice_name,
        response_format=job.response_format,
        progress=progress,
        bytes=job.bytes,
        error=JobFailure(**job.error) if job.error else None,
        owner=job.owner,
        audio_url=f"{root}{JOBS_PATH}/{job.id}/audio" if job.status == "succeeded" else None,
        captions_url=f"{root}{JOBS_PATH}/{job.id}/captions" if job.status == "succeeded" and job.captions else None,
        chapters=chapters,
    )
