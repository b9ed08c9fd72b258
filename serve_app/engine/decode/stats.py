"""What the decode loop counts (``AcousticEngine.stats``): steps, rows in and out, time spent."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineStats:
    steps: int = 0  # decode steps (one forward of the running batch)
    row_steps: int = 0  # sum over steps of rows in the batch
    admissions: int = 0  # times one or more rows joined the batch
    rows_admitted: int = 0
    rows_finished: int = 0
    rows_cancelled: int = 0
    rows_failed: int = 0
    rows_parked: int = 0  # times a row left the batch because its consumer fell behind
    rows_resumed: int = 0
    # The deadline rule (decode/deadline.py): times a row was set aside for a more urgent one or a
    # cheaper step, and brought back; the time its copies took (a park copies the row's KV; a
    # resume is a merge, which re-packs the batch, rows joining in the same merge included).
    deadline_parked: int = 0
    deadline_resumed: int = 0
    park_seconds: float = 0.0
    resume_seconds: float = 0.0
    capacity_refusals: int = 0  # new real-time streams refused: no room within capacity_wait_s
    max_rows: int = 0
    graph_steps: int = 0  # decode steps run by the static path (CUDA graphs, cuda_graphs=True)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0

    @property
    def mean_rows(self) -> float:
        return self.row_steps / self.steps if self.steps else 0.0
