"""Back-pressure inside the engine: rows whose consumers fall behind leave the batch, with their KV.

(``ParkedRows`` also holds the rows the deadline rule sets aside, decode/deadline.py: the engine
keeps one of each, since they come back by different rules.)

A row whose consumer holds ``max_stream_chunks`` unread chunks (or whose request does, across its
segments: ``StreamGroup``) is parked: what a stream buffers stays bounded, and its slot goes to
rows someone reads. It rejoins once its consumer has read down to half the limit (and its group
lets it), before new rows are admitted, since it was admitted first. Decode thread only, except
the wake-up test (``wakes_loop``), which a consumer's thread runs when it takes a chunk.
"""

from __future__ import annotations

from typing import Callable, Optional

from .batch import Prefilled
from .row import Row
from .streams import RowStream


def falling_behind(rows: list[Row], limit: int) -> list[int]:
    """Indices of the rows whose consumer (or request) holds ``limit`` unread chunks."""
    return [
        i
        for i, row in enumerate(rows)
        if row.stream.backlog >= limit or (row.stream.group is not None and row.stream.group.holds(row.stream, limit))
    ]


def ready_to_resume(stream: RowStream, limit: Optional[int]) -> bool:
    """Its consumer caught up (or went away: a cancelled row leaves the parked rows too)."""
    if stream.cancelled.is_set() or limit is None:
        return True
    group = stream.group
    return stream.backlog <= limit // 2 and (group is None or group.releases(stream, limit))


def wakes_loop(stream: RowStream, limit: Optional[int]) -> bool:
    """Whether a chunk taken from ``stream`` should wake the decode loop: its consumer caught up,
    or it belongs to a request, whose later segments may now join."""
    return limit is None or stream.group is not None or stream.backlog <= limit // 2


class ParkedRows:
    """The rows out of the batch while their consumers catch up, each with its KV (``Prefilled``)."""

    def __init__(self) -> None:
        self._rows: list[Prefilled] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, parked: list[Prefilled], on_taken: Optional[Callable[[RowStream], None]] = None) -> None:
        """Keep rows that just left the batch; their consumers call ``on_taken`` on every chunk read
        (None: their hooks stay as they are)."""
        if on_taken is not None:
            for p in parked:
                p.row.stream.on_taken = on_taken
        self._rows += parked

    def any_ready(self, limit: Optional[int]) -> bool:
        return any(ready_to_resume(p.row.stream, limit) for p in self._rows)

    def take(self, free: int, limit: Optional[int]) -> tuple[list[Prefilled], list[Row]]:
        """The rows to resume (ready ones, ``free`` at most, in the order they were parked) and the
        cancelled ones (finish reason set: they end); the others stay parked."""
        back: list[Prefilled] = []
        cancelled: list[Row] = []
        still: list[Prefilled] = []
        for p in self._rows:
            if p.row.stream.cancelled.is_set():
                p.row.finish_reason = "cancelled"
                cancelled.append(p.row)
            elif ready_to_resume(p.row.stream, limit) and len(back) < free:
                back.append(p)
            else:
                still.append(p)
        self._rows = still
        for p in back:
            if p.row.stream.group is None:  # a request's rows keep waking the loop for their group
                p.row.stream.on_taken = None
        return back, cancelled

    @property
    def rows(self) -> list[Row]:
        return [p.row for p in self._rows]

    def take_rows(self, rows: list[Row]) -> list[Prefilled]:
        """Take these rows out (with their KV), in the order given."""
        by_id = {id(p.row): p for p in self._rows}
        out = [by_id[id(r)] for r in rows if id(r) in by_id]
        gone = {id(p.row) for p in out}
        self._rows = [p for p in self._rows if id(p.row) not in gone]
        return out

    def drain_parked(self) -> list[Prefilled]:
        """Every parked row with its KV, none kept."""
        out, self._rows = self._rows, []
        return out

    def drain(self) -> list[Row]:
        """Every parked row, none kept (the engine stopping)."""
        rows = [p.row for p in self._rows]
        self._rows = []
        return rows
