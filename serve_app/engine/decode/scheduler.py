"""The waiting queue and admission: which rows join the running batch, and when.

Order: priority (higher first), raised by one level per ``AGING_SECONDS`` of waiting so nothing
starves, then arrival. A row is admitted while the batch has a free slot (``max_rows``) and the
token budget (sum of prompt + max new tokens over running rows) has room; a row that does not
fit stops admission there, so small rows cannot overtake a big one forever. A later segment of
a request (``Row.after``) waits until the request's first segment has sent audio.

No torch and no locking: the engine calls it under its own lock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..config import AcousticConfig
from ..errors import EngineOverloaded
from ..types import SegmentRequest
from ..voices import sample_frames
from .row import Row

AGING_SECONDS = 2.0  # waiting this long raises a row's priority by one level (no starvation)


def prompt_len_estimate(req: SegmentRequest) -> int:
    """Prompt tokens of a row before its prefill tells (characters are an upper-ish bound); a
    reference clip adds its transcript and one position per audio code frame."""
    clip = len(req.txt_smp or "") + sample_frames(req.spk_smp) if req.spk_smp is not None else 0
    return len(req.text) + len(req.prompt) + 8 + clip


@dataclass
class _Waiting:
    seq: int  # arrival order, the tie-break
    row: Row


class Scheduler:
    def __init__(self) -> None:
        self._waiting: list[_Waiting] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, row: Row, seq: int, max_queued: int) -> None:
        if len(self._waiting) >= max_queued:
            raise EngineOverloaded(f"acoustic queue full ({max_queued} rows waiting)")
        self._waiting.append(_Waiting(seq, row))

    def aged_priority(self, row: Row, now: float) -> float:
        return row.req.priority + (now - row.stream.submitted_at) / AGING_SECONDS

    def pop_admissible(self, running: Sequence[Row], cfg: AcousticConfig, now: float) -> list[Row]:
        """Remove and return the rows to admit now, best first. Rows cancelled while waiting are
        among them (in order, within the free slots): the caller ends them without decoding."""
        if not self._waiting:
            return []
        if not cfg.continuous and running:
            return []  # window batching: the running batch finishes first
        entries = sorted(self._waiting, key=lambda w: (-self.aged_priority(w.row, now), w.seq))
        free = cfg.max_rows - len(running)
        used = sum(r.budget for r in running)
        taken: list[_Waiting] = []
        for w in entries:
            if len(taken) >= free:
                break
            if w.row.stream.cancelled.is_set():
                taken.append(w)
                continue
            if cfg.continuous and w.row.after is not None and not w.row.after.started:
                continue  # a later segment: its request's first segment has no audio out yet
            need = prompt_len_estimate(w.row.req) + w.row.req.max_new_tokens
            if used + need > cfg.token_budget and (running or taken):
                break  # keep order: do not let small rows overtake a big one forever
            used += need
            taken.append(w)
        ids = {w.seq for w in taken}
        self._waiting = [w for w in self._waiting if w.seq not in ids]
        return [w.row for w in taken]

    def drain(self) -> list[Row]:
        """Remove and return every waiting row (the engine is stopping)."""
        waiting, self._waiting = self._waiting, []
        return [w.row for w in waiting]
