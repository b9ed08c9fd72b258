"""Who is calling, and what they may do: API keys, per-key grants, stream slots.

Keys come from an environment variable (comma-separated) and/or a file (one key per line,
``#`` comments); the file path is configuration, never user input. A key is checked against
every configured key with ``hmac.compare_digest`` (constant time per key), so a wrong key takes
as long to reject wherever it first differs. With ``security.auth: required`` a replica without
keys refuses to start: authentication fails closed, never silently off.

A caller is known by its key's id (a fingerprint, never the key) or, without keys, by its
address. That id is what limits count (stream slots, the engine's fair admission); custom
voices belong to the key id (``anonymous`` without keys).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol

from ..errors import APIError
from ..settings import KeyGrants, SecuritySettings

log = logging.getLogger("ray.serve")

ANONYMOUS = "anonymous"


def key_id(key: str) -> str:
    """The non-secret id of a key: what logs, limits, grants (``security.keys``) and voices use."""
    return hashlib.sha256(key.strip().encode()).hexdigest()[:12]


def load_api_keys(settings: SecuritySettings) -> list[bytes]:
    keys: list[str] = []
    if settings.api_keys_env:
        keys += [k.strip() for k in os.environ.get(settings.api_keys_env, "").split(",")]
    if settings.api_keys_file:
        for line in Path(settings.api_keys_file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return [k.encode() for k in keys if k]


@dataclass(frozen=True)
class Caller:
    id: str  # key id, or "ip:<address>" without keys: what limits and fair admission count
    owner: str  # whose custom voices: the key id, or "anonymous" without keys
    max_priority: int
    max_streams: int  # 0 = unlimited
    max_voices: Optional[int]  # None: the voice store's per-key default
    admin: bool = False


class APIKeyAuth:
    """Bearer-token check and each caller's grants; open (anonymous callers) only when keys are
    optional and none is configured."""

    def __init__(self, settings: SecuritySettings):
        self.settings = settings
        self._keys = load_api_keys(settings)
        if settings.auth == "required" and not self._keys:
            where = " or ".join(
                filter(None, [f"${settings.api_keys_env}" if settings.api_keys_env else None, settings.api_keys_file])
            )
            raise RuntimeError(
                f"security.auth is 'required' but no API key was loaded (from {where or 'nowhere: set api_keys_env or api_keys_file'})"
            )

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def _grants(self, kid: Optional[str]) -> Caller:
        s = self.settings
        g = s.keys.get(kid, KeyGrants()) if kid else KeyGrants()
        return Caller(
            id=kid or "",
            owner=kid or ANONYMOUS,
            max_priority=g.max_priority if g.max_priority is not None else s.max_priority,
            max_streams=g.max_streams if g.max_streams is not None else s.max_streams_per_key,
            max_voices=g.max_voices,
            admin=g.admin,
        )

    def identify(self, authorization: Optional[str], address: str) -> Caller:
        """The caller behind an ``Authorization`` header (and its address); 401 otherwise."""
        if not self.enabled:
            caller = self._grants(None)
            return Caller(**{**caller.__dict__, "id": f"ip:{address}"})
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise APIError(
                401,
                "missing API key: send 'Authorization: Bearer <key>'",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
        given = token.strip().encode()
        ok = False
        for key in self._keys:  # no early exit: time does not tell which key matched
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise APIError(
                401, "incorrect API key provided", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"}
            )
        return self._grants(hashlib.sha256(given).hexdigest()[:12])


def check_priority(caller: Caller, priority: int) -> None:
    if priority > caller.max_priority:
        raise APIError(
            403,
            f"priority {priority} is above what this key may ask for ({caller.max_priority})",
            type="permission_error",
            param="priority",
            code="priority_not_allowed",
        )


# ------------------------------------------------------------------ stream slots


def too_many_streams(limit: int) -> APIError:
    return APIError(
        429,
        f"too many concurrent streams for this client (limit {limit})",
        type="rate_limit_error",
        code="too_many_streams",
        headers={"Retry-After": "1"},
    )


class Slot:
    """One held stream slot. ``release()`` is idempotent and safe from any exit path."""

    def __init__(self, on_release=None):
        self._on_release = on_release

    def release(self) -> None:
        on_release, self._on_release = self._on_release, None
        if on_release is not None:
            on_release()


class StreamSlots(Protocol):
    async def acquire(self, caller: Caller) -> Slot:
        """A slot for one stream of ``caller`` (429 when it holds its limit already)."""
        ...


class LocalSlots:
    """Stream slots counted in this process (one Ingress replica; also the fallback when the
    cluster-wide counter is unreachable)."""

    def __init__(self) -> None:
        self._active: dict[str, int] = {}
        self._lock = threading.Lock()

    def held(self, client: str) -> int:
        return self._active.get(client, 0)

    def try_acquire(self, client: str, limit: int) -> bool:
        with self._lock:
            n = self._active.get(client, 0)
            if limit and n >= limit:
                return False
            self._active[client] = n + 1
            return True

    def release_one(self, client: str) -> None:
        with self._lock:
            n = self._active.get(client, 0) - 1
            if n <= 0:
                self._active.pop(client, None)
            else:
                self._active[client] = n

    async def acquire(self, caller: Caller) -> Slot:
        if not caller.max_streams:
            return Slot()
        if not self.try_acquire(caller.id, caller.max_streams):
            raise too_many_streams(caller.max_streams)
        return Slot(lambda: self.release_one(caller.id))


async def hold_slot(slots: StreamSlots, caller: Caller) -> Slot:
    """``slots.acquire`` that never leaks: a cancellation while the slot is being taken gives it back."""
    task = asyncio.ensure_future(slots.acquire(caller))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        task.add_done_callback(lambda t: t.result().release() if not t.cancelled() and t.exception() is None else None)
        raise
