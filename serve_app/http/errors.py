"""OpenAI-style error answers for the FastAPI app: every failure becomes ``errors.APIError``'s body
with its status (the mapping itself is ``serve_app/errors.py``, shared with the WebSocket)."""

from __future__ import annotations

import logging
from typing import Any, Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..errors import APIError, error_body, invalid_value

log = logging.getLogger("chattts_serve.http")


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(invalid_value(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, APIError):  # FastAPI wraps errors raised while reading the
            return error_response(exc.__cause__)  # body (the chunked body limit) as a plain 400
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return JSONResponse(
            error_body(str(exc.detail), type=kind, code=str(exc.status_code)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return JSONResponse(error_body("internal error", type="server_error", code="internal_error"), status_code=500)


async def read_form(request: Request, what: str, max_fields: int, max_part_size: Optional[int] = None) -> Any:
    """The request's form (at most one file and ``max_fields`` fields): the body limit's own
    error as it is, a malformed body a 400 ``invalid_form`` (the parser's words, which describe
    its internals, not the request, stay in the log under ``what``)."""
    limits: dict[str, Any] = {"max_files": 1, "max_fields": max_fields}
    if max_part_size is not None:
        limits["max_part_size"] = max_part_size
    try:
        return await request.form(**limits)
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - malformed multipart (Starlette raises several kinds)
        if isinstance(exc.__cause__, APIError):  # the body limit, raised while the form was read
            raise exc.__cause__ from None
        logging.getLogger("ray.serve").debug("%s: could not read the form: %s: %s", what, exc.__class__.__name__, exc)
        raise APIError(400, "could not read the form", code="invalid_form") from None
