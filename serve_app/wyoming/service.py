"""The service as the Wyoming server uses it, over its public API: the voice listing, one text
as a pcm HTTP stream, a text stream as a WebSocket session (``serve_app/client.py`` underneath), and
whatever went wrong on the way as an ``APIError`` carrying the service's own message and code."""

from __future__ import annotations

import logging
import time
from typing import Any, AsyncIterator, Optional

import httpx

from ..client import AsyncSpeechClient, SpeechError
from ..engine.voices import OPENAI_VOICES
from ..errors import APIError, to_api_error
from .config import WyomingConfig
from .events import SpeechOptions

log = logging.getLogger("chattts_serve.wyoming")

# Connecting fails fast (the service is down: say so at once); a stream may take its time, as the
# service bounds it itself (its request timeout).
TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=30.0, pool=30.0)
LISTING_TIMEOUT = httpx.Timeout(5.0)


def builtin_cards() -> list[dict[str, Any]]:
    """The built-in voices as the service lists them: what ``info`` offers while it is down."""
    return [{"id": name, "name": name, "kind": "builtin"} for name in OPENAI_VOICES]


def service_error(exc: BaseException, base_url: str) -> APIError:
    """``exc``, raised while asking the service, as the error the Wyoming client gets."""
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, SpeechError):
        err = exc.body.get("error") if isinstance(exc.body, dict) else None
        if isinstance(err, dict) and err.get("message"):
            status = exc.status if 400 <= exc.status < 600 else 502
            return APIError(
                status, err["message"], err.get("type") or "server_error", err.get("param"), err.get("code")
            )
        return APIError(502, f"the speech service ended the stream ({exc})", "server_error", code="service_error")
    if isinstance(exc, InvalidStatus):  # a refused WebSocket handshake
        status = exc.response.status_code
        return APIError(
            status, f"the speech service refused the session ({status})", "server_error", code="service_error"
        )
    if isinstance(exc, httpx.TimeoutException):
        return APIError(504, f"the speech service at {base_url} did not answer in time", "server_error", code="timeout")
    if isinstance(exc, (httpx.ConnectError, ConnectionRefusedError, InvalidHandshake)) or (
        isinstance(exc, OSError) and not isinstance(exc, (BrokenPipeError, ConnectionResetError))
    ):
        return APIError(
            503, f"the speech service at {base_url} is unreachable: {exc}", "server_error", code="service_unavailable"
        )
    if isinstance(exc, (httpx.HTTPError, ConnectionClosed, ConnectionResetError, BrokenPipeError)):
        return APIError(502, f"the speech service broke off the stream: {exc}", "server_error", code="service_error")
    return unexpected(exc)


def unexpected(exc: BaseException) -> APIError:
    """A known error keeps its status (errors.py's table); anything else is logged here and
    answered 500 without internals. (``errors.as_api_error`` would also ask Ray about its
    back-pressure error: this process has no Ray to ask.)"""
    known = to_api_error(exc)
    if known is not None:
        return known
    log.error("synthesis failed", exc_info=exc)
    return APIError(500, "synthesis failed", type="server_error", code="synthesis_failed")


class ServiceClient:
    """One per server process: its HTTP connections are shared by every Wyoming client."""

    def __init__(self, settings: WyomingConfig):
        self.base_url = settings.base_url
        self._voices_ttl_s = settings.voices_ttl_s
        key = settings.key
        self._key = key
        self._speech = AsyncSpeechClient(settings.base_url, api_key=key, timeout=TIMEOUT)
        # Sessions carry the key in session.start, not the handshake: a refused handshake says
        # only "403", a refused session.start says why (the service's error event and code).
        self._sessions = AsyncSpeechClient(settings.base_url, timeout=TIMEOUT)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.AsyncClient(base_url=settings.base_url, headers=headers, timeout=LISTING_TIMEOUT)
        self._voices: Optional[list[dict[str, Any]]] = None
        self._voices_at = 0.0

    async def aclose(self) -> None:
        await self._speech.aclose()
        await self._sessions.aclose()
        await self._http.aclose()

    async def voices(self) -> list[dict[str, Any]]:
        """The voices this key may use (``GET /v1/audio/voices``: built-in and its own), reused for
        ``voices_ttl_s``; the built-in ones while the service cannot be asked, so a client can
        still be set up (its syntheses then say why they fail)."""
        if self._voices is not None and time.monotonic() - self._voices_at < self._voices_ttl_s:
            return self._voices
        try:
            resp = await self._http.get("/v1/audio/voices")
            resp.raise_for_status()
            cards = [c for c in resp.json()["data"] if isinstance(c, dict) and isinstance(c.get("name"), str)]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning("voice listing from %s failed (%s); offering the built-in voices", self.base_url, exc)
            return builtin_cards()
        self._voices, self._voices_at = cards, time.monotonic()
        return cards

    def speak(self, text: str, options: SpeechOptions) -> AsyncIterator[bytes]:
        """s16le 24 kHz mono as the service sends it. Closing the iterator closes the HTTP
        stream, which cancels the synthesis in the service."""
        return self._speech.stream(text, options.voice, "pcm", **options.http_fields())

    def session(self, options: SpeechOptions):
        """``async with``: a WebSocket session (``SpeechSession``) sending pcm; leaving it closes
        the socket, which cancels whatever the service has not spoken yet."""
        return self._sessions.session(options.voice, "pcm", api_key=self._key, **options.session_fields())
