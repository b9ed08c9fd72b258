"""A job submission's request: its body read as a ``JobRequest`` (JSON, ``text/plain`` with the
options in the query, or a multipart form), and the route's OpenAPI schema.

A body may be megabytes (a book, 100,000 dialogue turns): a JSON body is read in a thread one
value at a time and its turns validated a thousand at a time, because one ``json.loads`` or one
pydantic call over all of it holds the GIL, and so the Ingress's event loop, for seconds.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any, Optional

from fastapi import Request
from pydantic import TypeAdapter, ValidationError

from ..errors import APIError, invalid_value
from ..http.errors import read_form
from ..protocol import MAX_JOB_TURNS, DialogueTurn, JobRequest

_FORM_FIELDS = set(JobRequest.model_fields) | {"file"}


def _inlined(schema: dict) -> dict:
    """A pydantic JSON schema with its ``$defs`` written in place: refs to ``#/$defs/...`` mean
    nothing inside the OpenAPI document it goes into."""
    defs = schema.pop("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref", "")
            if ref.startswith("#/$defs/"):
                return walk(defs[ref.rsplit("/", 1)[1]])
            return {k: walk(v) for k, v in node.items()}
        return [walk(x) for x in node] if isinstance(node, list) else node

    return walk(schema)


# The create route reads its body itself (JSON, text or a form), so FastAPI cannot infer this.
CREATE_JOB_OPENAPI = {
    "requestBody": {
        "content": {
            "application/json": {"schema": _inlined(JobRequest.model_json_schema())},
            "text/plain": {"schema": {"type": "string", "description": "The text; the options as query parameters."}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {"type": "string", "format": "binary", "description": "The text, UTF-8."},
                        "voice": {"type": "string"},
                        "response_format": {"type": "string"},
                        "seed": {"type": "integer"},
                        "speed": {"type": "number"},
                    },
                }
            },
        }
    }
}


def bad(message: str, param: Optional[str] = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _validated(fields: dict[str, Any]) -> JobRequest:
    try:
        return JobRequest.model_validate(fields)
    except ValidationError as exc:
        raise invalid_value(exc.errors()) from None


SMALL_BODY = 64 * 1024  # parsed in one call (a few ms at most)
TURNS_PER_PIECE = 1000  # turns validated per pydantic call (~20 ms, the GIL held throughout)
_TURNS = TypeAdapter(list[DialogueTurn])


def _validated_in_pieces(fields: dict[str, Any]) -> JobRequest:
    """``_validated``, a long dialogue's turns a piece at a time: one call over 100,000 turns holds
    the GIL (and so the Ingress's loop, even from a thread) for seconds. Blocking: in a thread."""
    turns = fields.get("turns")
    if not isinstance(turns, list) or len(turns) <= TURNS_PER_PIECE:
        return _validated(fields)
    if len(turns) > MAX_JOB_TURNS:  # counted before any is read
        raise APIError(
            400,
            f"a job has at most {MAX_JOB_TURNS} turns; this one has {len(turns)}",
            param="turns",
            code="invalid_value",
        )
    req = _validated({**fields, "turns": turns[:1]})
    out: list[DialogueTurn] = []
    for start in range(0, len(turns), TURNS_PER_PIECE):
        try:
            out += _TURNS.validate_python(turns[start : start + TURNS_PER_PIECE])
        except ValidationError as exc:
            errors = [{**e, "loc": ("turns", start + e["loc"][0], *e["loc"][1:])} for e in exc.errors()]
            raise invalid_value(errors) from None
    req.turns = out
    return req


_WS = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _ws(text: str, i: int) -> int:
    m = _WS.match(text, i)
    return m.end() if m else i


def loads_object(text: str) -> dict[str, Any]:
    """``json.loads`` of a JSON object, its arrays read element by element: one ``json.loads`` of
    a body of 100,000 turns holds the GIL for half a second (the C scanner never lets go), from
    any thread. Each call here reads one value (one turn, one string), then lets the GIL go
    round. ``ValueError`` for what is not a JSON object. Blocking: in a thread."""
    i = _ws(text, 0)
    if not text.startswith("{", i):
        raise ValueError("not an object")
    out: dict[str, Any] = {}
    i = _ws(text, i + 1)
    if text.startswith("}", i):
        i += 1
    else:
        while True:
            if not text.startswith('"', i):
                raise ValueError("expected a key")
            key, i = _DECODER.raw_decode(text, i)
            i = _ws(text, i)
            if not text.startswith(":", i):
                raise ValueError("expected ':'")
            i = _ws(text, i + 1)
            if text.startswith("[", i):
                items: list[Any] = []
                i = _ws(text, i + 1)
                if text.startswith("]", i):
                    i += 1
                else:
                    while True:
                        value, i = _DECODER.raw_decode(text, i)
                        items.append(value)
                        i = _ws(text, i)
                        if text.startswith(",", i):
                            i = _ws(text, i + 1)
                        elif text.startswith("]", i):
                            i += 1
                            break
                        else:
                            raise ValueError("expected ',' or ']'")
                out[key] = items
            else:
                out[key], i = _DECODER.raw_decode(text, i)
            i = _ws(text, i)
            if text.startswith(",", i):
                i = _ws(text, i + 1)
            elif text.startswith("}", i):
                i += 1
                break
            else:
                raise ValueError("expected ',' or '}'")
    if _ws(text, i) != len(text):
        raise ValueError("extra data")
    return out


def parse_body(raw: bytes) -> JobRequest:
    """A JSON body as a ``JobRequest`` (blocking: in a thread)."""
    body: Any = None
    try:
        if raw.lstrip()[:1] == b"{":
            body = loads_object(raw.decode("utf-8"))
        elif raw.strip() and len(raw) <= SMALL_BODY:  # not an object: is it JSON at all?
            body = json.loads(raw)
    except (UnicodeDecodeError, ValueError, IndexError):
        raise bad("request body is not valid JSON", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad(
            "send a JSON object with 'input' and the speech options, text/plain, or a multipart form with a 'file' part"
        )
    return _validated_in_pieces(body)


def _text(raw: bytes, param: str) -> str:
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise bad("the text must be UTF-8", param=param, code="invalid_text") from None


async def read_job_request(request: Request, max_upload_bytes: int) -> JobRequest:
    """The job's text and options from JSON (read off the loop, piece by piece), a text body
    (options in the query) or a form."""
    ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if ctype in ("application/json", ""):
        return await asyncio.to_thread(parse_body, await request.body())
    if ctype == "text/plain":
        params = dict(request.query_params)
        if "input" in params:
            raise bad("with text/plain the body is the input", param="input")
        return _validated({**params, "input": _text(await request.body(), "input")})
    if ctype in ("multipart/form-data", "application/x-www-form-urlencoded"):
        return _validated(await _form(request, max_upload_bytes))
    raise APIError(
        415,
        f"unsupported content type {ctype!r}: use application/json, text/plain or multipart/form-data",
        code="unsupported_media_type",
    )


async def _form(request: Request, max_upload_bytes: int) -> dict[str, Any]:
    form = await read_form(request, "jobs", len(_FORM_FIELDS), max_upload_bytes)
    try:
        fields: dict[str, Any] = {}
        for key, value in form.multi_items():
            if key not in _FORM_FIELDS:
                raise bad(f"unknown field {key[:40]!r}", param=key[:40])
            if key in fields:
                raise bad(f"field {key!r} given twice", param=key)
            if key == "file":
                if isinstance(value, str):
                    raise bad("'file' must be a file part", param="file")
                fields["input"] = _text(await value.read(), "file")
            elif isinstance(value, str):
                fields[key] = value
            else:
                raise bad(f"'{key}' must be a text field", param=key)
        if "file" in form and "input" in {k for k, _ in form.multi_items()}:
            raise bad("give the text once: a 'file' part or an 'input' field", param="input")
        return fields
    finally:
        await form.close()
