"""Every error the API reports, and the one place that maps an exception to it.

An ``APIError`` is an HTTP status plus OpenAI's error body; HTTP answers it as JSON with that
status, a WebSocket session as an ``error`` event and close code ``4000 + status``. Exceptions
map to it by their type, never by their message (``to_api_error``), also when Ray wraps them:
errors raised in a replica reach the caller as Ray's wrapper, which subclasses the original type
and keeps it as ``.cause``. Light on purpose (pydantic and the engine's torch-free errors only):
the Ingress, the WebSocket sessions and the storage layer all use it.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

from pydantic import ValidationError

from .engine.errors import (
    CapacityExhausted,
    ClientQueueFull,
    EmptyInputError,
    EngineOverloaded,
    InvalidClipError,
    InvalidInstructionsError,
    InvalidSSMLError,
    InvalidVoiceError,
    JobNotReady,
    JobQuotaExceeded,
    RefineBusy,
    RequestTooLarge,
    TooManyJobs,
    UnknownJobError,
    UnknownVoiceError,
)

# Serve's own logger: a failure's traceback lands in the replica's log beside the request's line.
log = logging.getLogger("ray.serve")


class APIError(Exception):
    """An error the API reports with an OpenAI-style body and a status code."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: Optional[str] = None,
        code: Optional[str] = None,
        headers: Optional[dict[str, str]] = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def __reduce__(self):  # picklable across Ray processes with all its fields
        return (APIError, (self.status, self.message, self.type, self.param, self.code, self.headers))


def error_body(
    message: str, type: str = "invalid_request_error", param: Optional[str] = None, code: Optional[str] = None
) -> dict[str, Any]:
    return APIError(0, message, type, param, code).body()


# (type, status, OpenAI error type, code, param, headers): first match wins.
_ERRORS: tuple[tuple[type, int, str, Optional[str], Optional[str], dict[str, str]], ...] = (
    # A voice a request names that is not there (or is another key's: the same answer) is a bad
    # field of that request, 400 with param "voice", as OpenAI answers one (its SDKs raise
    # BadRequestError). Looking a voice resource up by id (GET/DELETE /v1/audio/voices/{id}) is
    # a 404 of its own, in http/voices.py.
    (UnknownVoiceError, 400, "invalid_request_error", "voice_not_found", "voice", {}),
    (InvalidVoiceError, 400, "invalid_request_error", "invalid_voice", "voice", {}),
    (EmptyInputError, 400, "invalid_request_error", "empty_input", "input", {}),
    (InvalidSSMLError, 400, "invalid_request_error", "invalid_ssml", "input", {}),
    (InvalidInstructionsError, 400, "invalid_request_error", "invalid_value", "instructions", {}),
    (InvalidClipError, 400, "invalid_request_error", "invalid_audio", "audio", {}),
    (RequestTooLarge, 413, "invalid_request_error", "request_too_large", "input", {}),
    (ClientQueueFull, 429, "rate_limit_error", "too_many_queued_rows", None, {"Retry-After": "2"}),
    (CapacityExhausted, 503, "server_error", "capacity_exhausted", None, {"Retry-After": "2"}),
    (RefineBusy, 503, "server_error", "refine_busy", None, {"Retry-After": "2"}),
    (EngineOverloaded, 503, "server_error", "overloaded", None, {"Retry-After": "1"}),
    (UnknownJobError, 404, "invalid_request_error", "job_not_found", "job_id", {}),
    (TooManyJobs, 429, "rate_limit_error", "too_many_jobs", None, {"Retry-After": "30"}),
    (JobQuotaExceeded, 409, "invalid_request_error", "job_quota_exceeded", None, {}),
    (JobNotReady, 409, "invalid_request_error", "job_not_ready", "job_id", {}),
)


def overloaded() -> APIError:
    """A stage's queue is full (Serve's ``max_queued_requests``): 503, the client may retry."""
    return APIError(
        503,
        "server overloaded: a stage's queue is full; retry shortly",
        type="server_error",
        code="overloaded",
        headers={"Retry-After": "1"},
    )


def invalid_value(errors: Sequence[dict[str, Any]], skip: tuple[str, ...] = ("body",)) -> APIError:
    """The 400 for pydantic's (or FastAPI's) validation errors: the first one, named by its path
    (``skip``: path parts that are framing, FastAPI's ``body``)."""
    first = errors[0] if errors else {}
    param = ".".join(str(p) for p in first.get("loc", ()) if p not in skip) or None
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(400, "request body is not valid JSON", code="invalid_json")
    if kind == "missing":
        return APIError(400, f"missing required parameter: {param}", param=param, code="missing_required_parameter")
    return APIError(400, f"invalid value for {param}: {first.get('msg', 'invalid')}", param=param, code="invalid_value")


def _is_backpressure(exc: BaseException) -> bool:
    """Serve's ``BackPressureError`` (a handle's queue is full), known by its name so that this
    module stays below the Ray layer."""
    return any(c.__name__ == "BackPressureError" and c.__module__.startswith("ray.") for c in type(exc).__mro__)


def to_api_error(exc: BaseException) -> Optional[APIError]:
    """The APIError for ``exc`` (itself if it is one), or None when it is not a known error."""
    cause = getattr(exc, "cause", None)  # Ray's wrapper keeps the replica's exception here
    for candidate in (exc, cause):
        if isinstance(candidate, APIError):
            return candidate
    for candidate in (exc, cause):
        if isinstance(candidate, ValidationError):
            return invalid_value(candidate.errors())
    for kind, status, err_type, code, param, headers in _ERRORS:
        for candidate in (exc, cause):
            if isinstance(candidate, kind):
                message = candidate.args[0] if candidate.args and isinstance(candidate.args[0], str) else str(candidate)
                return APIError(status, message, type=err_type, param=param, code=code, headers=dict(headers))
    return None


def as_api_error(exc: BaseException, failed: str = "synthesis failed", code: str = "synthesis_failed") -> APIError:
    """What to answer for ``exc`` raised by a stage call or a session: a full Serve queue is 503,
    a known error keeps its status, anything else is logged here and answered 500 "``failed``"
    with ``code`` (the client never sees internals or a traceback)."""
    known = to_api_error(exc)
    if known is not None:
        return known
    if _is_backpressure(exc):
        return overloaded()
    log.error("%s", failed, exc_info=exc)
    return APIError(500, failed, type="server_error", code=code)
