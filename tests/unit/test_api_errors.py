"""How a failed call to another stage becomes the client's answer (``serve_app.errors.as_api_error``):
the status comes from the error's type, never from its text, also when Ray wraps it."""

from __future__ import annotations

import logging

import pytest
from ray.exceptions import RayTaskError
from ray.serve.exceptions import BackPressureError

from serve_app.engine.errors import EmptyInputError, EngineOverloaded, InvalidClipError, UnknownVoiceError
from serve_app.errors import as_api_error


def test_a_full_stage_queue_is_503_with_retry_after():
    err = as_api_error(BackPressureError(num_queued_requests=5, max_queued_requests=5), "x failed", "x_failed")
    assert (err.status, err.code, err.headers.get("Retry-After")) == (503, "overloaded", "1")


@pytest.mark.parametrize(
    "exc, status, code",
    [
        (UnknownVoiceError("unknown voice 'zz'"), 400, "voice_not_found"),
        (InvalidClipError("the clip is silent"), 400, "invalid_audio"),
        (EmptyInputError("input is empty after normalisation"), 400, "empty_input"),
        (EngineOverloaded("queue full"), 503, "overloaded"),
    ],
)
@pytest.mark.parametrize("wrapped", [False, True], ids=["raw", "ray-wrapped"])
def test_known_errors_keep_their_status_through_ray(exc, status, code, wrapped):
    raised = RayTaskError("plan", "Traceback ...", exc) if wrapped else exc
    err = as_api_error(raised, "x failed", "x_failed")
    assert (err.status, err.code, err.message) == (status, code, str(exc))


def test_anything_else_is_a_logged_500_without_the_traceback(caplog):
    with caplog.at_level(logging.ERROR, logger="ray.serve"):
        err = as_api_error(
            RuntimeError("CUDA error: secret internals"), "voice encoding failed", "voice_encoding_failed"
        )
    assert (err.status, err.type, err.code) == (500, "server_error", "voice_encoding_failed")
    assert "secret" not in err.message and err.message == "voice encoding failed"
    assert any(r.exc_info and "secret internals" in str(r.exc_info[1]) for r in caplog.records)


@pytest.mark.parametrize("body", [{"input": ""}, {"input": "  \n"}, {}], ids=["empty", "blank", "missing"])
def test_a_blank_job_input_names_input(body):
    """As /v1/audio/speech answers it: 400 invalid_value, param "input" (the model's own check had
    no field path: param null). Turns that fail still name turns."""
    from pydantic import ValidationError

    from serve_app.errors import invalid_value
    from serve_app.protocol import JobRequest

    with pytest.raises(ValidationError) as exc:
        JobRequest.model_validate(body)
    err = invalid_value(exc.value.errors())
    assert (err.status, err.code, err.param) == (400, "invalid_value", "input"), err.message
    with pytest.raises(ValidationError) as exc:
        JobRequest.model_validate({"turns": []})
    assert invalid_value(exc.value.errors()).param == "turns"
    assert JobRequest.model_validate({"turns": [{"voice": "alloy", "input": "Hi"}]}).input == ""


def _documented_errors() -> dict[str, tuple[str, str]]:
    """docs/architecture.md's "Errors by type": error type -> (status cell, code cell)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "architecture.md").read_text()
    section = text.split("## Errors by type", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].split("`")[1]] = (cells[1], cells[2])
    return rows


def test_every_error_of_the_table_is_documented_with_its_status_and_code():
    """errors._ERRORS (what a client gets) and the docs' table say the same, row for row."""
    from serve_app.errors import _ERRORS

    documented = _documented_errors()
    for kind, status, _type, code, param, headers in _ERRORS:
        assert kind.__name__ in documented, f"{kind.__name__} has no row in docs/architecture.md's 'Errors by type'"
        said_status, said_code = documented[kind.__name__]
        expected = f"{status}" + "".join(f" + `{k}: {v}`" for k, v in headers.items())
        assert said_status.startswith(expected), (kind.__name__, said_status, expected)
        assert said_code.startswith(f"`{code}`"), (kind.__name__, said_code, code)
        assert param is None or f"param `{param}`" in said_code, (kind.__name__, said_code, param)
    stale = set(documented) - {k.__name__ for k, *_ in _ERRORS} - {"EngineError"}
    assert not stale, f"rows for errors the table does not hold: {stale}"
