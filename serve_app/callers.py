"""Who is calling (``Caller``: the key's id and grants, or the address without keys) and the
stream slots a caller holds (``Slot``, ``StreamSlots``, ``LocalSlots``).

Neutral ground (no Ray, no HTTP framework): the Ingress's HTTP layer (``http/security.py``
makes callers from API keys) and the cluster-wide slot counter (``deployments/slots.py``) both build
on it without importing each other.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from typing import Optional, Protocol

from .errors import APIError

# The owner of what is made without API keys (a caller's ``owner``, a record's), and of records
# stored before they had owners.
ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Caller:
    id: str  # key id, or "ip:<address>" without keys: what limits and fair admission count
    owner: str  # whose custom voices: the key id, or ANONYMOUS without keys
    max_priority: int
    max_streams: int  # 0 = unlimited
    max_voices: Optional[int]  # None: the voice store's per-key default
    admin: bool = False


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


def check_priority(caller: Caller, priority: int) -> None:
    if priority > caller.max_priority:
        raise APIError(
            403,
            f"priority {priority} is above what this key may ask for ({caller.max_priority})",
            type="permission_error",
            param="priority",
            code="priority_not_allowed",
        )
