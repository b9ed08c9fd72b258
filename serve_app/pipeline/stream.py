"""A synthesis stream and its end, written once for every pipeline: whatever way its reader
leaves it (its last item, an error, a cancel, a timeout, an early exit), the stages' work ends."""

from __future__ import annotations

from typing import Any, Protocol


class Source(Protocol):
    """What a pipeline streams from: an async iterable (a Serve streaming call's generator) that
    ``cancel()`` stops (every stage behind it) and ``close()`` ends after its last item (optional)."""

    def __aiter__(self) -> Any: ...

    def cancel(self) -> None: ...


class AudioStream:
    """A pipeline's stream of audio items. An item that fails or is cancelled while awaited
    cancels the source; the end of the items closes it. ``async with`` (or ``aclose()``) cancels
    it unless it was read to its end, so a reader that stops early (a timeout, a client gone, a
    barge-in) stops every stage's work. ``cancel()`` and ``close()`` act once."""

    def __init__(self, source: Source):
        self._source = source
        self._items = source.__aiter__()
        self.ended = False  # read to its end
        self._over = False  # closed or cancelled

    def __aiter__(self) -> "AudioStream":
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._items.__anext__()
        except StopAsyncIteration:
            self.ended = True
            self.close()
            raise
        except BaseException:
            self.cancel()
            raise

    def cancel(self) -> None:
        if not self._over:
            self._over = True
            self._source.cancel()

    def close(self) -> None:
        if not self._over:
            self._over = True
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    async def aclose(self) -> None:
        if not self.ended:
            self.cancel()

    async def __aenter__(self) -> "AudioStream":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()
