"""The waiting queue and admission: which rows join the running batch, and when.

This is the whole rule with ``AcousticConfig.scheduling: fair``. With ``deadline`` (the
default), ``decode/deadline.py`` takes the real-time rows by their slack (``realtime_streams``,
``take``) and shares what they leave between the rows without a listener through
``pop_admissible(realtime=False, ...)``, by the rules below; the queue limits hold for both.

Rows belong to clients (``SegmentRequest.client``: an API key's id, ``ip:<addr>``, or "" for
anonymous). Admission shares the batch between clients:

- **Order.** Between clients: priority level first (a client's next row's priority; the clients
  of one priority share a level, raised by one per ``AGING_SECONDS`` the oldest turn among them
  has waited, so a low priority rises past a high one in time and nothing starves), then round
  robin: the client whose turn began first goes first (a turn begins at the client's last slot,
  or when its row arrived if later), so a client that just got a slot goes to the back. A client
  with 200 rows waiting and one with a single row get slots alternately. Within a client: its
  rows by priority (aged from their own arrival), then arrival.
- **Fair share.** While several clients have rows running or waiting, a client holding its share
  of ``max_rows`` (``max_rows / clients``, rounded up) or more comes after every client under its
  share at the same level: slots that free up go to the clients that have fewer.
- **Slots.** A client's rows take the ``max_rows`` slots; a client with no row running may also
  take one of ``reserved_rows`` slots beyond them, so its first row joins at the next step even
  when another client fills the batch (no running row is ever stopped for it). While another
  client is present (rows waiting or running now, or within ``PRESENCE_SECONDS``; the service's
  own rows, ``INTERNAL_CLIENT``, never count), a client holds
  at most ``max_running_rows_per_client`` rows: every row in a step slows every other row's step
  where a step's time grows with its rows (CPU). A lone client takes every slot.
- **Budget.** A row is admitted while the token budget (sum of prompt + max new tokens over
  running rows) has room; the first row in the order that does not fit stops admission there,
  so small rows cannot overtake a big one forever.
- A later segment of a request (``Row.after``) waits until the request's first segment has sent
  audio; it does not hold up its client's other rows. Rows cancelled while waiting come out at
  once (the engine ends them without decoding).

Queue limits: ``max_queued_rows`` rows waiting in all, ``max_queued_rows_per_client`` per
client; a request's rows are queued all or none (``push_all``).

No torch and no locking: the engine calls it under its own lock.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

from ..config import AcousticConfig
from ..errors import ClientQueueFull, EngineOverloaded, RequestTooLarge
from ..types import INTERNAL_CLIENT, SegmentRequest
from ..voices import sample_frames
from .row import Row

AGING_SECONDS = 2.0  # waiting this long raises a row's priority by one level (no starvation)
# A client counts as present this long after it last had a row waiting or running: the running
# cap (max_running_rows_per_client) holds while another client is present, so a lone client's
# rows are not capped, and a client that comes and goes between requests still counts.
PRESENCE_SECONDS = 10.0


def prompt_len_estimate(req: SegmentRequest) -> int:
    """Prompt tokens of a row before its prefill tells (characters are an upper-ish bound); a
    reference clip adds its transcript and one position per audio code frame."""
    clip = len(req.txt_smp or "") + sample_frames(req.spk_smp) if req.spk_smp is not None else 0
    return len(req.text) + len(req.prompt) + 8 + clip


def client_label(client: str) -> str:
    """A client as error messages name it ("" is anonymous)."""
    return client or "anonymous"


def queue_key(req: SegmentRequest) -> tuple[bool, int]:
    """Where a row waits within its client: real-time or not, then priority (the deadline rule
    takes real-time rows by slack and leaves the others to this module's fair order)."""
    return (req.realtime, req.priority)


def stream_key(row: Row) -> object:
    """The stream a row belongs to: its request's playback clock (or the row's own stream)."""
    return row.stream.playback or row.stream


@dataclass
class _Waiting:
    seq: int  # arrival order, the tie-break
    row: Row

    @property
    def order(self) -> tuple[float, int]:
        """Best first within one client and priority: the longest waiting (highest aged priority)."""
        return (self.row.stream.submitted_at, self.seq)


@dataclass
class _Turn:
    """When a client last got a slot: its next row's turn starts there (round robin)."""

    at: float
    served: int  # admission counter: breaks ties between turns that started at the same time


class Scheduler:
    """Waiting rows per client and priority, each list oldest first: a client's best row is the
    first eligible one of one of its priorities, so admission looks at a few rows per client, not
    at the whole queue (it runs before every decode step)."""

    def __init__(self) -> None:
        # client -> (realtime, priority) -> rows, oldest first
        self._queues: dict[str, dict[tuple[bool, int], list[_Waiting]]] = {}
        # Real-time rows by stream, in segment order: what the deadline rule looks at (decode/deadline.py).
        self._streams: dict[object, list[_Waiting]] = {}
        self._per_client: Counter[str] = Counter()  # waiting rows per client
        self._n = 0
        self._turns: dict[str, _Turn] = {}  # clients with rows waiting that have had a slot
        self._served = 0
        self._seen: dict[str, float] = {}  # client -> last time it had a row waiting or running

    def __len__(self) -> int:
        return self._n

    def _all(self):
        for by_priority in self._queues.values():
            for rows in by_priority.values():
                yield from rows

    # ------------------------------------------------------------------ queueing

    def push(self, row: Row, seq: int, max_queued: int, max_per_client: Optional[int] = None) -> None:
        """Queue one row (see ``push_all``)."""
        self.push_all([(row, seq)], max_queued, max_per_client)

    def push_all(self, rows: Sequence[tuple[Row, int]], max_queued: int, max_per_client: Optional[int] = None) -> None:
        """Queue one request's rows, all or none: ``EngineOverloaded`` when the queue cannot take
        them now, ``ClientQueueFull`` when their client already has too many waiting,
        ``RequestTooLarge`` when the request alone is more than a queue limit (it never fits)."""
        if not rows:
            return
        n = len(rows)
        client = rows[0][0].req.client
        limits = [(max_queued, "max_queued_rows")]
        if max_per_client is not None:
            limits.append((max_per_client, "max_queued_rows_per_client"))
        limit, name = min(limits)
        if n > limit:
            raise RequestTooLarge(
                f"the request is {n} segments; at most {limit} can wait for the acoustic stage ({name})"
            )
        if self._n + n > max_queued:
            raise EngineOverloaded(f"acoustic queue full ({self._n} rows waiting, at most {max_queued})")
        mine = self._per_client.get(client, 0)
        if max_per_client is not None and mine + n > max_per_client:
            raise ClientQueueFull(
                f"too many rows queued for client {client_label(client)}: {mine} waiting, this request adds {n}, "
                f"at most {max_per_client} (max_queued_rows_per_client); retry once some have started"
            )
        for row, seq in rows:
            w = _Waiting(seq, row)
            lst = self._queues.setdefault(row.req.client, {}).setdefault(queue_key(row.req), [])
            if lst and lst[-1].order > w.order:
                bisect.insort(lst, w, key=lambda x: x.order)  # pushed out of order (threads racing)
            else:
                lst.append(w)
            if row.req.realtime:
                self._streams.setdefault(stream_key(row), []).append(w)
            self._per_client[row.req.client] += 1
            self._n += 1

    def aged_priority(self, row: Row, now: float) -> float:
        return row.req.priority + (now - row.stream.submitted_at) / AGING_SECONDS

    def _remove(self, gone: list[_Waiting]) -> None:
        if not gone:
            return
        ids = {w.seq for w in gone}
        for client, key in {(w.row.req.client, queue_key(w.row.req)) for w in gone}:
            by_priority = self._queues[client]
            rows = [w for w in by_priority[key] if w.seq not in ids]
            if rows:
                by_priority[key] = rows
            else:
                del by_priority[key]
                if not by_priority:
                    del self._queues[client]
        for stream in {stream_key(w.row) for w in gone if w.row.req.realtime}:
            rows = [w for w in self._streams[stream] if w.seq not in ids]
            if rows:
                self._streams[stream] = rows
            else:
                del self._streams[stream]
        for w in gone:
            client = w.row.req.client
            self._n -= 1
            self._per_client[client] -= 1
            if self._per_client[client] <= 0:
                del self._per_client[client]
                self._turns.pop(client, None)

    # ------------------------------------------------------------------ admission

    def pop_cancelled(self) -> list[Row]:
        """Remove and return every row cancelled while waiting (the caller ends them)."""
        if not self._n:
            return []
        cancelled = [w for w in self._all() if w.row.stream.cancelled.is_set()]
        self._remove(cancelled)
        return [w.row for w in cancelled]

    def eligible(self, row: Row, cfg: AcousticConfig, hold_groups_at: Optional[int]) -> bool:
        """May ``row`` join now? A later segment waits until its request's first segment has sent
        audio, and while its request's reader is far behind (``StreamGroup.holds``)."""
        group = row.stream.group
        if hold_groups_at is not None and group is not None and group.holds(row.stream, hold_groups_at):
            return False  # its request's reader is far behind: no slot for more of its audio yet
        return not cfg.continuous or row.after is None or row.after.started

    def realtime_streams(self) -> Iterator[list[Row]]:
        """The waiting rows of each real-time stream, in segment order (read-only; the deadline
        rule takes the ones it admits with ``take``)."""
        for rows in self._streams.values():
            yield [w.row for w in rows]

    def take(self, rows: Sequence[Row]) -> None:
        """Remove these waiting rows (the deadline rule admits them)."""
        if not rows:
            return
        ids = {id(r) for r in rows}
        self._remove([w for lst in self._streams.values() for w in lst if id(w.row) in ids])

    def pop_unstarted(self, queued_before: float) -> list[Row]:
        """Remove and return the first rows of the real-time streams queued before
        ``queued_before`` whose first segment is still waiting for room (the caller refuses them;
        their later segments end with their streams)."""
        late = [
            w
            for rows in self._streams.values()
            for w in rows[:1]
            if w.row.req.realtime
            and not w.row.req.ahead_s  # a stream's next request keeps its claim: never refused
            and w.row.after is None
            and w.row.stream.submitted_at < queued_before
        ]
        self._remove(late)
        return [w.row for w in late]

    def oldest(self, realtime: bool) -> Optional[float]:
        """When the longest-waiting row of that kind was queued (None: none waits)."""
        heads = [
            rows[0].row.stream.submitted_at for q in self._queues.values() for k, rows in q.items() if k[0] == realtime
        ]
        return min(heads, default=None)

    def pop_admissible(
        self,
        running: Sequence[Row],
        cfg: AcousticConfig,
        now: float,
        hold_groups_at: Optional[int] = None,
        realtime: Optional[bool] = None,
        occupied: int = 0,
        at_most: Optional[int] = None,
        occupied_budget: int = 0,
        cancelled_popped: bool = False,
    ) -> list[Row]:
        """Remove and return the rows to admit now, in admission order. Every row cancelled while
        waiting comes out too (first): the caller ends them without decoding. ``hold_groups_at``:
        a later segment of a request holding that many unread chunks waits (StreamGroup.holds).

        The deadline rule (decode/deadline.py) shares out what real-time rows leave with
        ``realtime=False``: only rows without a listener take part, ``running`` are those of them in
        the batch (the client shares and caps count them), ``occupied`` the other rows in the batch
        (they take slots and ``occupied_budget`` of the token budget), ``at_most`` the rows it may take,
        ``cancelled_popped`` that it took the cancelled rows out just before (``pop_cancelled``)."""
        self._note_presence(running, now, realtime)
        out = [] if cancelled_popped else self.pop_cancelled()
        if not self._n or (not cfg.continuous and (running or occupied)):
            return out  # window batching: the running batch finishes first
        slots = cfg.max_rows + cfg.reserved_rows
        if at_most is not None:
            slots = min(slots, len(running) + occupied + at_most)
        if len(running) + occupied >= slots:
            return out
        held: Counter[str] = Counter(r.req.client for r in running)
        only_new = len(running) + occupied >= cfg.max_rows  # only reserved slots left: for clients with nothing running
        present = [c for c, t in self._seen.items() if now - t <= PRESENCE_SECONDS]

        def cap_of(client: str) -> Optional[int]:
            """The running cap holds while another client is present (a lone client takes every slot)."""
            alone = all(c == client for c in present)
            return None if alone else cfg.max_running_rows_per_client

        def eligible(w: _Waiting) -> bool:
            return self.eligible(w.row, cfg, hold_groups_at)

        # Per client and queue (realtime, priority), where the next eligible row is (an index into the list).
        cursor: dict[str, dict[tuple[bool, int], int]] = {}
        for client, by_priority in self._queues.items():
            mine = held.get(client, 0)
            cap = cap_of(client)
            if (only_new and mine) or (cap is not None and mine >= cap):
                continue  # no slot this client may take now
            found = {}
            for key, rows in by_priority.items():
                if realtime is not None and key[0] != realtime:
                    continue
                i = next((i for i, w in enumerate(rows) if eligible(w)), None)
                if i is not None:
                    found[key] = i
            if found:
                cursor[client] = found
        if not cursor:
            return out
        share = math.ceil(cfg.max_rows / len(set(held) | set(cursor)))
        total = len(running) + occupied
        used = sum(r.budget for r in running) + occupied_budget
        taken: list[_Waiting] = []
        while cursor and total < slots:
            heads = {c: self._head(c, found, now) for c, found in cursor.items()}
            client = self._next(heads, held, share, now)
            w = heads[client]
            mine = held[client]
            limit = cfg.max_rows + (cfg.reserved_rows if mine == 0 else 0)
            cap = cap_of(client)
            if total >= limit or (cap is not None and mine >= cap):
                del cursor[client]  # no slot this client may take now; the others go on
                continue
            need = prompt_len_estimate(w.row.req) + w.row.req.max_new_tokens
            if used + need > cfg.token_budget and (running or occupied or taken):
                break  # keep order: do not let small rows overtake a big one forever
            used += need
            total += 1
            held[client] += 1
            taken.append(w)
            self._served += 1
            self._turns[client] = _Turn(now, self._served)
            # This client's next eligible row of that queue, after the one taken.
            found = cursor[client]
            key = queue_key(w.row.req)
            rows = self._queues[client][key]
            i = next((i for i in range(found[key] + 1, len(rows)) if eligible(rows[i])), None)
            if i is None:
                del found[key]
                if not found:
                    del cursor[client]
            else:
                found[key] = i
        self._remove(taken)
        return out + [w.row for w in taken]

    def _note_presence(self, running: Sequence[Row], now: float, realtime: Optional[bool] = None) -> None:
        waiting = {c for c, q in self._queues.items() if realtime is None or any(k[0] == realtime for k in q)}
        for client in {r.req.client for r in running} | waiting:
            if client != INTERNAL_CLIENT:  # the service's own rows (warm-up) are nobody's
                self._seen[client] = now
        if len(self._seen) > 64:  # forget clients gone for good
            self._seen = {c: t for c, t in self._seen.items() if now - t <= PRESENCE_SECONDS}

    def _head(self, client: str, found: dict[tuple[bool, int], int], now: float) -> _Waiting:
        """The client's best eligible row: by aged priority, then arrival."""
        by_priority = self._queues[client]
        return min(
            (by_priority[p][i] for p, i in found.items()), key=lambda w: (-self.aged_priority(w.row, now), w.seq)
        )

    def _turn_start(self, client: str, w: _Waiting) -> float:
        """When this client's turn began: its last slot, or its row's arrival if later."""
        turn = self._turns.get(client)
        return w.row.stream.submitted_at if turn is None else max(w.row.stream.submitted_at, turn.at)

    def _next(self, heads: dict[str, _Waiting], held: Counter, share: int, now: float) -> str:
        """The client whose row goes next. A priority's clients share one level: the priority
        plus one per ``AGING_SECONDS`` the oldest turn among them has waited (so a low priority
        rises past a high one in time, while clients of one priority are ordered by fairness, not
        by seconds of waiting). Within a level: clients under their fair share first, then the
        turn that began first, then the client served longest ago."""
        starts = {c: self._turn_start(c, w) for c, w in heads.items()}
        oldest: dict[int, float] = {}
        for c, w in heads.items():
            p = w.row.req.priority
            oldest[p] = min(oldest.get(p, starts[c]), starts[c])

        def key(c: str) -> tuple:
            w = heads[c]
            p = w.row.req.priority
            level = p + math.floor(max(0.0, now - oldest[p]) / AGING_SECONDS)
            turn = self._turns.get(c)
            return (-level, held[c] >= share, starts[c], turn.served if turn is not None else -1, w.seq)

        return min(heads, key=key)

    def drain(self) -> list[Row]:
        """Remove and return every waiting row (the engine is stopping)."""
        waiting = sorted(self._all(), key=lambda w: w.seq)
        self._queues.clear()
        self._streams.clear()
        self._per_client.clear()
        self._n = 0
        self._turns.clear()
        return [w.row for w in waiting]
