"""HTTP requests to the service and its OpenAI-shaped errors."""

from __future__ import annotations

import uuid

import httpx

ERROR_KEYS = {"message", "type", "param", "code"}


def speech_body(text: str, **extra) -> dict:
    """A ``/v1/audio/speech`` body (wav) with a fresh seed unless one is given: a synthesis, not
    a cache replay of another test's request."""
    seed = extra.pop("seed", None)
    return {
        "model": "chattts",
        "input": text,
        "response_format": "wav",
        "seed": uuid.uuid4().int % 10**9 if seed is None else seed,
        **extra,
    }


def speech(url: str, timeout: float = 120, headers: dict | None = None, **body) -> httpx.Response:
    """``POST /v1/audio/speech`` with ``body`` (model ``chattts`` unless given)."""
    body.setdefault("model", "chattts")
    return httpx.post(url + "/v1/audio/speech", json=body, headers=headers, timeout=timeout)


def is_error_body(resp: httpx.Response) -> bool:
    """The body is OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    try:
        err = resp.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return (
        isinstance(err, dict)
        and isinstance(err.get("message"), str)
        and bool(err["message"])
        and ERROR_KEYS <= set(err)
    )


def is_error_head(resp: httpx.Response) -> bool:
    """An error answer to HEAD: no body (RFC 9110), the JSON type its GET's error body has."""
    kind = resp.headers.get("content-type") or ""
    kind = kind[0] if isinstance(kind, list) and kind else kind  # schemathesis: a list per header
    return not resp.content and str(kind).startswith("application/json")


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    """``resp`` is ``status`` with exactly OpenAI's error body (and ``code``); returns the error."""
    assert resp.status_code == status, f"expected {status}, got {resp.status_code}: {resp.text[:300]}"
    assert resp.headers["content-type"].startswith("application/json")
    body = resp.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert ERROR_KEYS == set(err), err
    assert isinstance(err["message"], str) and err["message"].strip(), err
    assert isinstance(err["type"], str) and err["type"], err
    if code is not None:
        assert err["code"] == code, err
    return err
