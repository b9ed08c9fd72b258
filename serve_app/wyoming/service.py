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


class KeyRefused(RuntimeError):
    """The server's API key is an admin key: any client on the network would list and speak with
    every key's voices through it. The server does not start (or, found later, speaks no more)."""


ADMIN_KEY = (
    "the API key is an admin key (it sees and speaks with every key's custom voices, and any client on the "
    "network would, through this server): give the Wyoming server a key of its own"
)


def key_refused() -> APIError:
    return APIError(403, ADMIN_KEY, type="server_error", code="admin_key_refused")


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
        self.refused = False  # the service said the key is an admin's: nothing is spoken through it
        self.verified = False  # the service said the key is not an admin's

    async def aclose(self) -> None:
        await self._speech.aclose()
        await self._sessions.aclose()
        await self._http.aclose()

    async def check_key(self) -> None:
        """At the server's start: ``KeyRefused`` if the service lists every key's voices for this
        key (an admin's). A service that cannot be asked now is asked again at each listing."""
        try:
            await self._listing()
        except KeyRefused:
            raise
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            log.warning(
                "could not ask %s about the API key (%s); asking again at each voice listing", self.base_url, exc
            )

    async def _listing(self) -> list[dict[str, Any]]:
        """``GET /v1/audio/voices``' cards; ``KeyRefused`` (and nothing spoken from then on) when
        the listing is every key's."""
        resp = await self._http.get("/v1/audio/voices")
        resp.raise_for_status()
        body = resp.json()
        if body.get("every_owner") is True:
            self.refused = True
            raise KeyRefused(ADMIN_KEY)
        cards = [c for c in body["data"] if isinstance(c, dict) and isinstance(c.get("name"), str)]
        self._voices, self._voices_at, self.verified = cards, time.monotonic(), True
        return cards

    async def ensure_key(self) -> None:
        """Before a synthesis: the key known not to be an admin's (asked now if the start could
        not ask); 403 ``admin_key_refused`` if it is. A listing that fails otherwise (a wrong key,
        the service down) leaves the synthesis to fail with the service's own answer: whatever
        refuses the listing refuses it too, and a store that cannot list has no voice to lend."""
        if not self.verified and not self.refused:
            try:
                await self._listing()
            except KeyRefused:
                log.error("%s: refusing every synthesis", ADMIN_KEY)
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
                log.debug("voice listing from %s failed before a synthesis: %s", self.base_url, exc)
        self.check_refused()

    def check_refused(self) -> None:
        if self.refused:
            raise key_refused()

    async def voices(self) -> list[dict[str, Any]]:
        """The voices this key may use (``GET /v1/audio/voices``: built-in and its own), reused for
        ``voices_ttl_s``; the built-in ones while the service cannot be asked, so a client can
        still be set up (its syntheses then say why they fail), or once the key turned out an
        admin's."""
        if self.refused:
            return builtin_cards()
        if self._voices is not None and time.monotonic() - self._voices_at < self._voices_ttl_s:
            return self._voices
        try:
            return await self._listing()
        except KeyRefused:
            log.error("%s: refusing every synthesis", ADMIN_KEY)
            return builtin_cards()
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as exc:
            log.warning("voice listing from %s failed (%s); offering the built-in voices", self.base_url, exc)
            return builtin_cards()

    def speak(self, text: str, options: SpeechOptions) -> AsyncIterator[bytes]:
        """s16le 24 kHz mono as the service sends it. Closing the iterator closes the HTTP
        stream, which cancels the synthesis in the service."""
        self.check_refused()
        return self._speech.stream(text, options.voice, "pcm", **options.http_fields())

    def session(self, options: SpeechOptions):
        """``async with``: a WebSocket session (``SpeechSession``) sending pcm; leaving it closes
        the socket, which cancels whatever the service has not spoken yet."""
        self.check_refused()
        return self._sessions.session(options.voice, "pcm", api_key=self._key, **options.session_fields())
