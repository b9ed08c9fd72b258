"""API keys and per-client stream limits of the HTTP API.

Keys come from an environment variable (comma-separated) and/or a file (one key per line,
``#`` comments); the file path is configuration, never user input. A key is checked against
every configured key with ``hmac.compare_digest`` (constant time per key), so a wrong key takes
as long to reject wherever it first differs.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import threading
from pathlib import Path
from typing import Optional



from ..errors import APIError
from ..settings import SecuritySettings


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


class APIKeyAuth:
    """Bearer-token check; disabled when no key is configured."""

    def __init__(self, keys: list[bytes]):
        self._keys = keys

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def check(self, authorization: Optional[str]) -> str:
        """Returns a stable, non-secret id of the caller's key; raises 401 otherwise."""
        if not self.enabled:
            return "anonymous"
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key",
                           headers={"WWW-Authenticate": "Bearer"})
        given = token.strip().encode()
        ok = False
        for key in self._keys:  # no early exit: time does not tell which key matched
            ok |= hmac.compare_digest(given, key)
        if not ok:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
        return hashlib.sha256(given).hexdigest()[:12]


class StreamLimiter:
    """At most ``limit`` concurrent streams per client id (0 = unlimited)."""

    def __init__(self, limit: int):
        self.limit = limit
        self._active: dict[str, int] = {}
        self._lock = threading.Lock()

    def acquire(self, client: str) -> None:
        if not self.limit:
            return
        with self._lock:
            n = self._active.get(client, 0)
            if n >= self.limit:
                raise APIError(429, f"too many concurrent streams for this client (limit {self.limit})",
                               type="rate_limit_error", code="too_many_streams", headers={"Retry-After": "1"})
            self._active[client] = n + 1

    def release(self, client: str) -> None:
        if not self.limit:
            return
        with self._lock:
            n = self._active.get(client, 0) - 1
            if n <= 0:
                self._active.pop(client, None)
            else:
                self._active[client] = n
