"""A Starlette request built in-process: a service's handler called without a server."""

from __future__ import annotations

from starlette.requests import Request


def job_submission(body: bytes, ctype: str = "application/json") -> Request:
    """``POST /v1/audio/jobs`` with ``body`` sent whole, then the client's disconnect."""
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/audio/jobs",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", ctype.encode())],
    }
    return Request(scope, receive)
