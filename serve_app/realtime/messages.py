"""A WebSocket session's edges: the interfaces it runs over (``SpeechBackend``, ``Transport``),
its limits and stats, the client's messages parsed and bounded, and the events sent back."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, AsyncIterator, Optional, Protocol, Union

from pydantic import BaseModel, ValidationError

from ..engine.config import SegmentConfig
from ..engine.types import Plan, StreamSummary, SynthesisOptions
from ..errors import APIError, invalid_value
from ..http.jsonlimits import check_json_depth
from ..protocol import (
    CLIENT_MESSAGES,
    ErrorEvent,
    ErrorObject,
)
from ..settings import IngressConfig

NORMAL_CLOSURE = 1000


def close_code(status: int) -> int:
    """The close code after an error event: 4000 + the HTTP status the same error gets."""
    return 4000 + status


class SpeechBackend(Protocol):
    async def plan(self, text: str, options: SynthesisOptions) -> Plan: ...

    def audio(self, plan: Plan, response_format: str) -> AsyncIterator[Union[bytes, StreamSummary]]:
        """Encoded audio of the plan, then a ``StreamSummary``. Closing the iterator early (task
        cancelled) must stop the synthesis."""
        ...


class Transport(Protocol):
    """What a session needs of a WebSocket (Starlette's has it): ASGI receive messages."""

    async def receive(self) -> dict[str, Any]: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def send_text(self, data: str) -> None: ...

    async def close(self, code: int = NORMAL_CLOSURE, reason: Optional[str] = None) -> None: ...


_INGRESS = IngressConfig()


@dataclass(frozen=True)
class SessionLimits:
    """The Ingress's limits as a session applies them (``graph.session_limits``)."""

    max_text_chars: int = _INGRESS.max_input_chars  # text ahead of the audio: buffered, or cut and not yet sent
    max_message_bytes: int = _INGRESS.max_body_bytes
    segment_timeout_s: float = (
        _INGRESS.request_timeout_s
    )  # a segment's audio must be complete this long after it starts
    max_chars: int = SegmentConfig().max_chars  # an unfinished sentence longer than this is cut (see split_unfinished)
    first_message_s: float = _INGRESS.websocket.first_message_s  # session.start must come this soon
    idle_s: float = _INGRESS.websocket.idle_s  # nothing to speak and no message this long: closed
    max_pending_cuts: int = _INGRESS.websocket.max_pending_cuts  # cuts being planned at once
    # Segments of one session decoding at once: the one being sent and the next. More would decode
    # further ahead, but every row slows every decode step of the batch, and so other sessions'
    # first audio.
    decoding_segments: int = 2


@dataclass
class SessionStats:
    status: str = "pending"  # done, client_disconnect, or the status of the error that ended it
    chars: int = 0  # text received
    segments: int = 0  # sent whole
    cancelled_segments: int = 0
    audio_seconds: float = 0.0
    first_audio_s: Optional[float] = None  # from the session's start
    # Its listener playing the session's audio at 1x (engine/playback.py), as the session infers it.
    stall_s: Optional[float] = None
    min_slack_s: Optional[float] = None


# ------------------------------------------------------------------ messages


async def receive_message(transport: Transport, limits: SessionLimits) -> Optional[BaseModel]:
    """The client's next message, validated; None once the client has gone. Raises APIError for
    a message the protocol does not allow (the session then ends with an error event)."""
    message = await transport.receive()
    return parse_message(message, limits)


def json_object(message: dict[str, Any], limits: SessionLimits, what: str = "a JSON object") -> Optional[dict]:
    """A client's text frame as a JSON object, bounded before it is parsed (its size, its
    nesting); None once the client has gone. Every socket door reads its messages with this."""
    if message["type"] == "websocket.disconnect":
        return None
    text = message.get("text")
    if text is None:
        raise APIError(400, "binary frames are not accepted: send JSON text frames", code="invalid_message")
    if len(text.encode()) > limits.max_message_bytes:
        raise APIError(413, f"message exceeds {limits.max_message_bytes} bytes", code="message_too_large")
    check_json_depth(text)
    try:
        obj = json.loads(text)
    except ValueError:
        raise APIError(400, "message is not valid JSON", code="invalid_json") from None
    if not isinstance(obj, dict):
        raise APIError(400, f"a message must be {what}", code="invalid_message")
    return obj


def parse_message(message: dict[str, Any], limits: SessionLimits) -> Optional[BaseModel]:
    obj = json_object(message, limits, 'a JSON object with a "type"')
    if obj is None:
        return None
    model = CLIENT_MESSAGES.get(obj.get("type"))  # type: ignore[arg-type]
    if model is None:
        raise APIError(
            400,
            f"unknown message type {str(obj.get('type'))[:40]!r}; expected one of {', '.join(CLIENT_MESSAGES)}",
            param="type",
            code="unknown_type",
        )
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise invalid_value(exc.errors()) from None


async def send_event(transport: Transport, event: BaseModel) -> None:
    await transport.send_text(event.model_dump_json())


async def send_error(transport: Transport, exc: APIError) -> None:
    """The error event, then the close code for its status (the client may be gone already)."""
    try:
        await send_event(transport, ErrorEvent(error=ErrorObject(**exc.body()["error"])))
        await transport.close(close_code(exc.status), exc.code or "")
    except Exception:  # noqa: BLE001 - nobody left to tell
        pass
