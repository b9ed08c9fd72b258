"""Who is calling, and what they may do: API keys and per-key grants (the ``Caller`` and its stream
slots are ``callers.py``'s).

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

import hashlib
import hmac
import logging
import os
from pathlib import Path
from typing import Optional

# Caller and the stream slots live in callers.py (deployments/slots.py counts them too); importers here keep working.
from ..callers import (  # noqa: F401 - the HTTP layer's names for them
    ANONYMOUS,
    Caller,
    LocalSlots,
    Slot,
    StreamSlots,
    check_priority,
    hold_slot,
    too_many_streams,
)
from ..errors import APIError
from ..settings import KeyConfig, SecurityConfig

log = logging.getLogger("ray.serve")


def key_id(key: str) -> str:
    """The non-secret id of a key: what logs, limits, grants (``security.keys``) and voices use."""
    return hashlib.sha256(key.strip().encode()).hexdigest()[:12]


def load_api_keys(settings: SecurityConfig) -> list[bytes]:
    keys: list[str] = []
    if settings.api_keys_env:
        keys += [k.strip() for k in os.environ.get(settings.api_keys_env, "").split(",")]
    if settings.api_keys_file:
        for line in Path(settings.api_keys_file).read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                keys.append(line)
    return [k.encode() for k in keys if k]


class APIKeyAuth:
    """Bearer-token check and each caller's grants; open (anonymous callers) only when keys are
    optional and none is configured."""

    def __init__(self, settings: SecurityConfig):
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
        g = s.keys.get(kid, KeyConfig()) if kid else KeyConfig()
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
