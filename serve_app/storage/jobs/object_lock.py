"""An owner's lock on an object store (``ObjectLock``), which has no rename and no lock of its own
but creates an object exclusively (a conditional PUT that fails when the key exists).

The lock is a chain of tickets ``<folder>/<n>`` (``n`` zero-padded, so names sort as numbers),
each written once and never changed: ``{"held": true, "until": t}`` when a process took the lock,
``{"held": false}`` when it let go. The newest ticket is the lock's state. To take it, a process
reads the newest ticket ``n`` and, if it is free or its holder's time is up, creates ``n + 1``
exclusively: of any number of processes that try, on any nodes, exactly one creates it. Letting go
creates ``n + 2`` the same way, which fails only if the time was up and another took the lock
meanwhile (logged). Since tickets never change, no two processes ever act on different versions
of one, and no stale lock is ever deleted from under its next holder, which a single lock object
with an expiry would allow. Old tickets are deleted by the next holder.

``until`` is judged by each node's clock: keep them in sync (NTP); ``LOCK_TTL_S`` is far above
what a creation holds the lock for, and a holder that dies blocks its owner's creations (503)
until it runs out.
"""

from __future__ import annotations

import json
import logging
import random
import time
from typing import Optional

from .model import LOCK_TIMEOUT_S
from .objects import Objects

log = logging.getLogger("ray.serve")

LOCK_TTL_S = 30.0
MAX_POLL_S = 0.5
_DIGITS = 16


class ObjectLock:
    def __init__(
        self,
        objects: Objects,
        folder: str,
        ttl_s: float = LOCK_TTL_S,
        timeout_s: float = LOCK_TIMEOUT_S,
        poll_s: float = 0.05,
    ):
        self.objects = objects
        self.folder = folder
        self.ttl_s = ttl_s
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.ticket: Optional[int] = None

    def _key(self, n: int) -> str:
        return f"{self.folder}/{n:0{_DIGITS}d}"

    def _tickets(self) -> list[int]:
        return sorted(
            int(e.name)
            for e in self.objects.ls(self.folder)
            if not e.folder and len(e.name) == _DIGITS and e.name.isdigit()
        )

    def _free(self, n: int) -> Optional[bool]:
        """Whether ticket ``n`` leaves the lock free; None when it is gone (collected meanwhile)."""
        data = self.objects.get(self._key(n))
        if data is None:
            return None
        doc = json.loads(data)
        return not doc.get("held") or float(doc.get("until", 0)) <= time.time()

    def acquire(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        waits = 0
        while True:
            tickets = self._tickets()
            top = tickets[-1] if tickets else -1
            free = True if top < 0 else self._free(top)
            if free:
                doc = json.dumps({"held": True, "until": time.time() + self.ttl_s}).encode()
                if self.objects.put_new(self._key(top + 1), doc):
                    self.ticket = top + 1
                    for n in tickets[:-1]:  # older than the one we followed: nobody reads them now
                        self.objects.delete(self._key(n))
                    return
                continue  # another process took it first: look again at once
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the job store's owner lock {self.folder} is busy")
            # Backing off: waiters' polls are requests too (billed, and in the holder's way).
            time.sleep(min(self.poll_s * 2**waits, MAX_POLL_S) * (0.5 + random.random()))
            waits += 1

    def release(self) -> None:
        if self.ticket is None:
            return
        ticket, self.ticket = self.ticket, None
        if not self.objects.put_new(self._key(ticket + 1), json.dumps({"held": False}).encode()):
            log.warning("jobs: the owner lock %s was held past %.0f s and taken over", self.folder, self.ttl_s)

    def __enter__(self) -> "ObjectLock":
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
