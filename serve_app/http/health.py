"""``/healthz`` (the process answers) and ``/readyz`` (warmed up through every stage). A failed
warm-up says only "failed": its cause goes to the replica's log, never to the caller."""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable, Union

from fastapi.responses import JSONResponse

log = logging.getLogger("ray.serve")


class Readiness:
    def __init__(self, warmup: Callable[[], Awaitable[None]]):
        self._ready = asyncio.Event()
        self._failed = False
        self._task = asyncio.get_event_loop().create_task(self._run(warmup))

    async def _run(self, warmup: Callable[[], Awaitable[None]]) -> None:
        try:
            await warmup()
            self._ready.set()
        except Exception:  # noqa: BLE001 - /readyz reports it
            self._failed = True
            log.exception("warm-up failed")

    def answer(self, weights_kind: str) -> Union[dict, JSONResponse]:
        if self._ready.is_set():
            return {"status": "ready", "weights": weights_kind}
        status = "failed" if self._failed else "warming_up"
        return JSONResponse({"status": status}, status_code=503, headers={"Retry-After": "2"})
