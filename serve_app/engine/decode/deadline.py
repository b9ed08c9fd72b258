"""The deadline rule (``AcousticConfig.scheduling: deadline``): which rows run, least slack first.

A real-time row's slack is how long its listener can go on before it needs that row's next audio
(decode/playback.py): its stream's slack for the segment being played, more for a later segment
(its audio plays after the segments before it), minus the time waited for a stream that has not
sent its first audio yet. Rows without a listener have none. Before every decode step:

1. **Owed slots** (no starvation). A row without a listener that has waited ``background_wait_s``
   (queued, or parked by this rule) takes the next free slot, before any real-time row, while
   fewer than ``background_rows`` such rows run; the ``background_rows`` of them admitted first
   are never parked for real-time rows ("protected").
2. **Urgent real-time rows**, least slack first: rows of streams with less than
   ``resume_ahead_s`` of slack (waiting, or parked by this rule) and new streams (first audio
   pending). Each takes a free place, or parks a running row that is *parkable*: a row without a
   listener beyond the protected ones (newest first), then a real-time row at least
   ``park_ahead_s`` ahead (most ahead first). A free place is a free slot within the replica's
   measured capacity (``Capacity.admit_rows``, decode/capacity.py: the rows whose steps keep each
   at 1x with headroom): more rows would slow every running stream below 1x, so past it an urgent
   row waits for a row to end or to be far enough ahead. Rows between the two thresholds are
   neither parked nor urgent (hysteresis), so a parked row stays out for at least their difference.
   A **new stream** starts only while the started streams not far ahead (less than
   ``park_ahead_s`` of slack, decoding or between two segments) leave room for one more within the
   capacity, less the protected rows (one stream may always start), whether it takes a free place
   or a far-ahead row's: a started stream must find room for its next segment, and streams beyond
   the capacity would all stall.
   A replica whose steps are slower than real time even at one row has no smooth stream to
   protect: there nothing is held back for the capacity, rows are only ordered. Among new
   streams, a client holding its share of the capacity in real-time streams goes after the
   others (one key's streams are not capped while capacity is free).
3. **What is left**, into free places only: real-time rows that are not urgent (least slack
   first, but no later segment whose audio starts more than ``LOOKAHEAD_S`` beyond what its
   request's reader has taken: a stopped reader's long answer is not decoded and set aside
   segment after segment), then rows without a listener (parked ones first, then the queue's fair order between clients:
   ``Scheduler.pop_admissible``). Within the capacity while real-time rows that must
   keep 1x run, every slot otherwise.
4. **Cheaper steps.** While such rows run and the batch is above ``Capacity.park_rows`` (its
   steps slower than one token's audio), parkable rows leave until it is within
   ``Capacity.admit_rows`` (the band between is the hysteresis in rows).

Parking keeps a row's KV (``BatchState.park``) and its tokens do not change (batch invariance,
tests/unit/test_batch_invariance.py). No torch, no locking: the engine calls ``decide`` under its
lock, with its own clock (``now``), so tests drive it with synthetic rows and clocks.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional, Sequence

from ..config import AcousticConfig
from .playback import Playback
from .row import Row
from .scheduler import Scheduler, prompt_len_estimate, stream_key

# A real-time request's later segments join free places only while their audio starts within this
# of what its reader has taken (step 3): a reader that keeps up (1x, or a download) never meets it.
LOOKAHEAD_S = 60.0


@dataclass(frozen=True)
class Capacity:
    """What the batch can carry (rows; None until measured)."""

    admit_rows: Optional[int] = None  # rows with each at >= 1x, with capacity_headroom to spare (0: none)
    park_rows: Optional[int] = None  # rows at exactly 1x: above it, real-time rows fall behind


@dataclass
class Decision:
    park: list[int] = field(default_factory=list)  # indices of running rows to set aside, in order
    resume: list[Row] = field(default_factory=list)  # parked rows to bring back
    admit: list[Row] = field(default_factory=list)  # waiting rows to admit (out of the queue), in order
    ended: list[Row] = field(default_factory=list)  # rows cancelled while waiting (the caller ends them)


def slack_of(row: Row, now: float) -> Optional[float]:
    """The row's slack in seconds (None: no listener)."""
    if not row.req.realtime:
        return None
    pb = row.stream.playback
    if pb is None:
        return row.req.ahead_s - (now - row.stream.submitted_at)
    return pb.row_slack(row.stream.segment, now)


def committing(pb: Playback, now: float, cfg: AcousticConfig) -> bool:
    """A real-time stream that has started, is not finished, and is not far ahead of its listener:
    it holds a claim on the capacity, between two segments too."""
    return pb.realtime and (pb.started or pb.continuing) and not pb.finished and pb.slack(now) < cfg.park_ahead_s


def is_new(row: Row) -> bool:
    """A real-time row of a new stream whose first audio has not left yet (a request that continues
    a stream, ``SegmentRequest.ahead_s``, is not new)."""
    pb = row.stream.playback
    return row.req.realtime and not row.req.ahead_s and (pb is None or not pb.started)


def _need(row: Row, held: bool) -> int:
    return row.budget if held else prompt_len_estimate(row.req) + row.req.max_new_tokens


def decide(
    running: Sequence[Row],
    held: Sequence[Row],
    scheduler: Scheduler,
    cfg: AcousticConfig,
    now: float,
    capacity: Capacity = Capacity(),
    hold_groups_at: Optional[int] = None,
) -> Decision:
    """What to do before the next step. ``running``: the batch's rows (indices as in the batch);
    ``held``: rows this rule parked, ready to come back; waiting rows come from ``scheduler``
    (those admitted are removed from it). See the module's docstring for the rule."""
    out = Decision(ended=scheduler.pop_cancelled())
    slots = cfg.max_rows + cfg.reserved_rows
    slack = {id(r): slack_of(r, now) for r in running}
    # Not even one row at 1x (a slow CPU): no real-time stream can be kept smooth, so the rule only
    # orders rows (least slack first) and holds nothing back for the capacity.
    admit_rows = capacity.admit_rows or None
    park_rows = capacity.park_rows if admit_rows else None

    # Running rows: the protected ones, the parkable ones (in the order they would go), and the
    # real-time rows that must keep 1x (not far ahead).
    nonrt = sorted(
        (i for i, r in enumerate(running) if not r.req.realtime),
        key=lambda i: (running[i].stream.admitted_at or 0.0, i),
    )
    ahead = sorted(
        (i for i, r in enumerate(running) if r.req.realtime and slack[id(r)] >= cfg.park_ahead_s),
        key=lambda i: -slack[id(running[i])],
    )
    parkable = nonrt[cfg.background_rows :][::-1] + ahead
    if len(running) >= slots and not parkable:
        return out  # nothing can join, nothing would leave
    rt_demand = sum(1 for r in running if r.req.realtime and slack[id(r)] < cfg.park_ahead_s)
    kept = min(len(nonrt), cfg.background_rows)  # protected rows in the batch
    # Started streams not far ahead, running or not: each will need a place for its next audio
    # (a stream between two segments holds its claim on the capacity).
    committed = {
        id(pb)
        for r in [*running, *held]
        if r.req.realtime and (pb := r.stream.playback) is not None and committing(pb, now, cfg)
    }
    total = len(running)
    used = sum(r.budget for r in running)
    nonrt_in = [running[i] for i in nonrt]  # rows without a listener in the batch (fair shares count them)
    streams_of = Counter(c for _, c in {(id(stream_key(r)), r.req.client) for r in running if r.req.realtime})

    def park_one() -> None:
        nonlocal total, used
        i = parkable.pop(0)
        out.park.append(i)
        total -= 1
        used -= running[i].budget
        if not running[i].req.realtime:
            nonrt_in.remove(running[i])

    def within() -> int:
        """Rows real-time work may fill: the capacity, or one row beside the protected ones."""
        return slots if admit_rows is None else min(slots, max(admit_rows, kept + 1))

    def claim(need: int, limit: int = slots) -> bool:
        """A place for a row needing ``need`` tokens of budget among ``limit`` rows: a free one, or a
        parkable row's."""
        nonlocal total, used
        if total >= limit:
            if not parkable or (used - running[parkable[0]].budget + need > cfg.token_budget and total > 1):
                return False
            park_one()
        elif used + need > cfg.token_budget and total:
            return False
        total += 1
        used += need
        return True

    def fair(at_most: int) -> list[Row]:
        """Rows without a listener from the queue, in its fair order between clients."""
        got = scheduler.pop_admissible(
            nonrt_in,
            cfg,
            now,
            hold_groups_at,
            realtime=False,
            occupied=total - len(nonrt_in),
            at_most=at_most,
            occupied_budget=used - sum(r.budget for r in nonrt_in),
            cancelled_popped=True,
        )
        out.ended += [r for r in got if r.stream.cancelled.is_set()]
        return [r for r in got if not r.stream.cancelled.is_set()]

    # 1. Owed slots: rows without a listener that have waited background_wait_s.
    held_nonrt = sorted((r for r in held if not r.req.realtime), key=lambda r: r.parked_at or 0.0)
    due = now - cfg.background_wait_s
    while kept < cfg.background_rows:
        if held_nonrt and (held_nonrt[0].parked_at or 0.0) <= due:
            if not claim(held_nonrt[0].budget):
                break
            row = held_nonrt.pop(0)
            out.resume.append(row)
        else:
            oldest = scheduler.oldest(realtime=False)
            if oldest is None or oldest > due or (total >= slots and not parkable):
                break
            full = total >= slots  # a parkable row leaves for it, once the queue has given one
            total -= full
            got = fair(1)
            total += full
            if not got:
                break
            if full:
                park_one()
            row = got[0]
            total += 1
            used += _need(row, False)
            out.admit.append(row)
        nonrt_in.append(row)
        kept += 1

    def room() -> int:
        """Free places for work that is not urgent."""
        return (within() if rt_demand else slots) - total

    if not parkable and total >= within() and room() <= 0:
        return _cheaper_steps(out, running, parkable, rt_demand, total, admit_rows, park_rows, scheduler)

    # Candidates not running, taken lazily: the rows this rule parked, and each real-time stream's
    # next eligible waiting row (its later rows have more slack: one is offered once it is taken).
    # Started streams' in a heap by slack; new streams' (first audio pending) apart, for the share.
    heap: list[tuple[float, int, Row, Optional[list[Row]], int]] = []
    new: list[tuple[float, int, Row]] = []

    def offer(rows: list[Row], pos: int) -> None:
        if pos < len(rows) and scheduler.eligible(rows[pos], cfg, hold_groups_at):
            r = rows[pos]
            if is_new(r):
                new.append((slack_of(r, now), r.stream.row_id, r))
            else:
                heapq.heappush(heap, (slack_of(r, now), r.stream.row_id, r, rows, pos))

    for r in held:
        if r.req.realtime:
            heapq.heappush(heap, (slack_of(r, now), r.stream.row_id, r, None, 0))
    for rows in scheduler.realtime_streams():
        pb = rows[0].stream.playback
        if pb is not None and committing(pb, now, cfg):
            committed.add(id(pb))
        offer(rows, 0)

    def take(entry: tuple) -> None:
        _, _, row, rows, pos = entry
        (out.admit if rows is not None else out.resume).append(row)
        if rows is not None:
            offer(rows, pos + 1)

    # 2. Urgent real-time rows, least slack first; new streams within the capacity.
    clients = {r.req.client for _, _, r in new} | set(streams_of)
    share = math.ceil((admit_rows or slots) / max(1, len(clients)))
    while True:
        best_new = min(new, key=lambda e: (streams_of[e[2].req.client] >= share, e[0], e[1]), default=None)
        first = heap[0] if heap and heap[0][0] < cfg.resume_ahead_s else None
        if best_new is None and first is None:
            break
        picks_new = best_new is not None and (
            first is None or (streams_of[best_new[2].req.client] >= share, *best_new[:2]) < (False, *first[:2])
        )
        if picks_new:
            new.remove(best_new)
            if admit_rows is not None and len(committed) + 1 > max(1, admit_rows - kept):
                new.clear()  # no room for another stream at 1x
                continue
            row = best_new[2]
        else:
            heapq.heappop(heap)
            row = first[2]
        if not claim(_need(row, not picks_new and first[3] is None), within()):
            if total >= within() and not parkable:
                break  # no room for anyone
            continue  # over the token budget: a smaller row may fit
        if picks_new:  # a new stream's first row (its later rows wait for its first audio)
            out.admit.append(row)
            streams_of[row.req.client] += 1
            committed.add(id(stream_key(row)))
        else:
            take(first)
        rt_demand += 1

    # 3. What is left, into free places: real-time rows not urgent, then rows without a listener.
    # Not a later segment whose audio starts more than LOOKAHEAD_S beyond what its request's reader
    # has taken: a reader who stopped (a client gone quiet, its sockets full) would otherwise have
    # every segment of a long answer decoded and set aside with its KV; a reader who takes it
    # faster than 1x (a download) moves the horizon as fast.
    while heap and room() > 0:
        entry = heapq.heappop(heap)
        row, rows = entry[2], entry[3]
        pb = row.stream.playback
        if rows is not None and pb is not None and pb.beyond_reader_s(row.stream.segment) > LOOKAHEAD_S:
            continue  # it stays queued; the stream's later rows are further still
        need = _need(row, rows is None)
        if used + need > cfg.token_budget and total:
            break
        total += 1
        used += need
        take(entry)
    while held_nonrt and room() > 0 and (used + held_nonrt[0].budget <= cfg.token_budget or not total):
        row = held_nonrt.pop(0)
        total += 1
        used += row.budget
        out.resume.append(row)
        nonrt_in.append(row)
    if room() > 0:
        got = fair(room())
        total += len(got)
        out.admit += got

    return _cheaper_steps(out, running, parkable, rt_demand, total, admit_rows, park_rows, scheduler)


def _cheaper_steps(
    out: Decision,
    running: Sequence[Row],
    parkable: list[int],
    rt_demand: int,
    total: int,
    admit_rows: Optional[int],
    park_rows: Optional[int],
    scheduler: Scheduler,
) -> Decision:
    """4. Above the rows whose steps keep 1x, parkable rows leave (down to the rows with headroom:
    the band between keeps them from coming straight back); then the admitted real-time rows
    leave the queue."""
    if rt_demand and park_rows is not None and admit_rows is not None and total > park_rows:
        while total > admit_rows and parkable:
            out.park.append(parkable.pop(0))
            total -= 1
    scheduler.take([r for r in out.admit if r.req.realtime])
    return out
