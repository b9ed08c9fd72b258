"""Stream slots counted across every Ingress replica, so a per-key stream limit is one limit for
the whole application, not one per replica.

One small detached Ray actor per application (``SlotCounter``, no CPU) holds the slots. Each slot
is a lease: the replica holding it renews all of its slots every ``lease_s / 3``, so the slots of
a replica that dies are freed within ``lease_s``, and a restarted counter (empty) learns the live
slots back from the next renewals. When the counter cannot be reached, a replica counts in its own
process (``LocalSlots``): the limit then holds per replica until the counter is back.

Two Ray behaviours shape the calls. Serve cancels a request whose client left, and Ray cancels
the actor calls that request made with it (recursively); an actor that runs its calls in order
then waits forever for the cancelled call's place in the sequence, and every later call of that
replica hangs. So the counter is an async actor (no ordering, nothing to wait for), and releases
are sent from the replica's own background task, never from inside a request that may be
cancelled before the release is delivered.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import Optional

from serve_app.callers import Caller, LocalSlots, Slot, too_many_streams

log = logging.getLogger("ray.serve")

LEASE_S = 30.0
CALL_TIMEOUT_S = 2.0


class SlotTable:
    """The counter's state, plain Python: client -> {token: lease expiry}."""

    def __init__(self, lease_s: float = LEASE_S):
        self.lease_s = lease_s
        self._by_client: dict[str, dict[str, float]] = {}
        self._client_of: dict[str, str] = {}

    def _drop(self, token: str) -> None:
        client = self._client_of.pop(token, None)
        if client is None:
            return
        held = self._by_client.get(client, {})
        held.pop(token, None)
        if not held:
            self._by_client.pop(client, None)

    def _expire(self, client: str, now: float) -> None:
        for token, expiry in list(self._by_client.get(client, {}).items()):
            if expiry < now:
                self._drop(token)

    def held(self, client: str, now: float) -> int:
        self._expire(client, now)
        return len(self._by_client.get(client, {}))

    def acquire(self, client: str, limit: int, token: str, now: float) -> bool:
        if limit and self.held(client, now) >= limit:
            return False
        self._by_client.setdefault(client, {})[token] = now + self.lease_s
        self._client_of[token] = client
        return True

    def release(self, token: str) -> None:
        self._drop(token)

    def renew(self, tokens: dict[str, str], now: float) -> None:
        """Extend the leases of ``tokens`` (token -> client); slots this table lost (a restart)
        are taken back as they are, whatever the limit: they are streams running now."""
        for token, client in tokens.items():
            self._by_client.setdefault(client, {})[token] = now + self.lease_s
            self._client_of[token] = client
        for client in list(self._by_client):  # sweep clients that stopped asking
            self._expire(client, now)


class SlotCounter:
    """The Ray actor around a ``SlotTable``: async, so its calls run on one event loop (one at a
    time, none awaits) with no ordering to wedge."""

    def __init__(self, lease_s: float = LEASE_S):
        self.table = SlotTable(lease_s)

    async def acquire(self, client: str, limit: int, token: str) -> bool:
        return self.table.acquire(client, limit, token, time.monotonic())

    async def release(self, token: str) -> None:
        self.table.release(token)

    async def renew(self, tokens: dict[str, str]) -> None:
        self.table.renew(tokens, time.monotonic())

    async def held(self, client: str) -> int:
        return self.table.held(client, time.monotonic())


class SharedSlots:
    """``StreamSlots`` over the application's ``SlotCounter`` actor (created by the first replica
    that asks for it, found by name by the others)."""

    def __init__(self, name: str, lease_s: float = LEASE_S):
        import ray

        self.local = LocalSlots()
        self.lease_s = lease_s
        actor = ray.remote(num_cpus=0, max_restarts=-1)(SlotCounter)
        self._actor = actor.options(
            name=name, namespace="chattts_serve", lifetime="detached", get_if_exists=True
        ).remote(lease_s)
        self._held: dict[str, str] = {}  # token -> client, this replica's slots
        self._releases: asyncio.Queue[str] = asyncio.Queue()
        loop = asyncio.get_event_loop()
        self._background = [loop.create_task(self._renew_forever()), loop.create_task(self._release_forever())]

    async def _call(self, method: str, *args):
        return await asyncio.wait_for(getattr(self._actor, method).remote(*args), CALL_TIMEOUT_S)

    async def acquire(self, caller: Caller) -> Slot:
        if not caller.max_streams:
            return Slot()
        token = uuid.uuid4().hex
        try:
            ok = await self._call("acquire", caller.id, caller.max_streams, token)
        except asyncio.CancelledError:
            self._releases.put_nowait(token)  # it may have been taken
            raise
        except Exception as exc:  # noqa: BLE001 - the counter is down or slow: count here meanwhile
            log.warning("stream slot counter unreachable (%s): counting in this replica", exc.__class__.__name__)
            return await self.local.acquire(caller)
        if not ok:
            raise too_many_streams(caller.max_streams)
        self._held[token] = caller.id
        return Slot(lambda: self._release(token))

    def _release(self, token: str) -> None:
        self._held.pop(token, None)
        self._releases.put_nowait(token)

    async def _release_forever(self) -> None:
        while True:
            token = await self._releases.get()
            self._actor.release.remote(token)  # fire and forget: a lost release expires with its lease

    async def _renew_forever(self) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            if self._held:
                try:
                    await self._call("renew", dict(self._held))
                except Exception as exc:  # noqa: BLE001 - next round; leases are 3 rounds long
                    log.warning("stream slot renewal failed: %s", exc.__class__.__name__)

    async def held(self, client: str) -> Optional[int]:
        try:
            return await self._call("held", client)
        except Exception:  # noqa: BLE001
            return None
