"""A synthesis stream's lifecycle in the Ingress: it owns its stream slot and its stages' work,
and every way out (the end, an error, a client gone, a cancelled request, a stream nobody ever
read) releases the one and cancels the other.
"""

from __future__ import annotations

import asyncio
import weakref
from functools import partial
from typing import Any, AsyncIterator

import anyio
from fastapi.responses import StreamingResponse

from ..callers import Slot
from .request_log import RequestRecord


class SynthesisStream:
    """A synthesis stream that owns its stream slot and its stages' work: ``aclose()`` (also
    reached through ``async with``) ends both, and so does garbage collection of a stream nobody
    ever read (a client gone between the answer's start and its first byte)."""

    def __init__(self, chain: AsyncIterator[bytes], slot: Slot, gen: Any, rec: RequestRecord):
        self.headers: dict[str, str] = {}  # what the answer says about the script (style, SSML)
        self.plan: Any = None  # the plan it speaks (a Plan), set by the speech service
        self._chain = chain
        self._slot = slot
        self._gen = gen
        self._rec = rec
        self._complete = False
        self._finalizer = weakref.finalize(self, _abandon_later, asyncio.get_running_loop(), slot, gen, rec)

    def __aiter__(self) -> "SynthesisStream":
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self._chain.__anext__()
        except StopAsyncIteration:
            self._complete = True
            raise

    async def aclose(self) -> None:
        self._finalizer.detach()
        try:
            await self._chain.aclose()
        finally:
            if not self._complete:  # never started, or cut: the stages stop too
                _abandon(self._slot, self._gen, self._rec)
            self._slot.release()

    async def __aenter__(self) -> "SynthesisStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _abandon(slot: Slot, gen: Any, rec: RequestRecord) -> None:
    slot.release()
    gen.cancel()
    rec.finish("client_disconnect")  # no-op when the stream's own end recorded it


def _abandon_later(loop: asyncio.AbstractEventLoop, slot: Slot, gen: Any, rec: RequestRecord) -> None:
    """The finalizer's half: garbage collection runs it in whatever thread allocated last, even
    inside Ray's own callbacks, where calling Ray again (the slot counter, the stages' cancel) can
    wedge that caller's actor calls for good. The work itself runs on the replica's loop."""
    try:
        loop.call_soon_threadsafe(_abandon, slot, gen, rec)
    except RuntimeError:  # the loop is closed: the replica is going away with everything it held
        pass


class OwnedStreamResponse(StreamingResponse):
    """A StreamingResponse that watches for the client leaving whatever the ASGI version (Starlette
    stops watching from ASGI 2.4 on, and Serve's proxy stops cancelling a request whose client
    sent ``x-request-disconnect-disabled``), and closes its synthesis stream on every way out: the
    end, an error, a client gone, a cancelled request."""

    def __init__(self, content: AsyncIterator[bytes], owned: Any, **kwargs: Any):
        super().__init__(content, **kwargs)
        self._owned = owned

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def run(part: Any) -> None:
                    await part()
                    group.cancel_scope.cancel()

                group.start_soon(run, partial(self.stream_response, send))
                group.start_soon(run, partial(self.listen_for_disconnect, receive))
        finally:
            aclose = getattr(self._owned, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
