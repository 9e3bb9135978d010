"""Every synchronous step of a demo worker, one CSV line each: where the step's time went, and the
loss.

``<out>/steps/<worker>.csv`` holds, per step: when it began (seconds since
the start signal), the samples this rank trained, the step's global batch,
the seconds spent waiting for data, computing (paced), in the all-reduce and
in the rest (optimizer, commit, checkpoints), and the global batch's mean
training loss (the same on every rank: it travels in the step's
all-reduce). The report overlays the loss per step of two plans from these
files, and they show where a slow run lost its time.
"""

from __future__ import annotations

import csv
from pathlib import Path

COLUMNS = (
    "step",
    "t_s",
    "samples",
    "global_batch",
    "data_s",
    "compute_s",
    "allreduce_s",
    "other_s",
    "loss",
)
#: The loss travels as an integer (thousandths of a sample's loss) among the all-reduce's counters.
LOSS_SCALE = 1000


def trace_path(out: Path, worker: str) -> Path:
    return out / "steps" / f"{worker}.csv"


class StepTrace:
    """Appends one line per step; lines reach the file every ``flush_every`` steps and at close."""

    def __init__(self, path: Path, flush_every: int = 20):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a", newline="")
        self._writer = csv.writer(self._file)
        if path.stat().st_size == 0:
            self._writer.writerow(COLUMNS)
        self._flush_every, self._pending = flush_every, 0

    def write(
        self,
        step: int,
        t_s: float,
        samples: int,
        global_batch: int,
        data_s: float,
        compute_s: float,
        allreduce_s: float,
        other_s: float,
        loss: float | None,
    ) -> None:
        self._writer.writerow(
            (
                step,
                f"{t_s:.4f}",
                samples,
                global_batch,
                f"{data_s:.4f}",
                f"{compute_s:.4f}",
                f"{allreduce_s:.4f}",
                f"{other_s:.4f}",
                "" if loss is None else f"{loss:.5f}",
            )
        )
        self._pending += 1
        if self._pending >= self._flush_every:
            self._file.flush()
            self._pending = 0

    def close(self) -> None:
        self._file.close()


def read_trace(path: Path) -> list[dict[str, float]]:
    """The trace's rows as numbers (an empty loss is None)."""
    with path.open(newline="") as file:
        return [
            {k: (float(v) if v != "" else None) for k, v in row.items()}
            for row in csv.DictReader(file)
        ]
