"""Aggregating step timings into one report (pure).

The training thread only appends one small tuple per step; everything else
(sorting for percentiles, building the message) happens here, on the
reporter thread, once per report interval.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields

from antdt.schemas.models import StepTimeStats

ZERO_STATS = StepTimeStats(sum_s=0.0, min_s=0.0, max_s=0.0, p50_s=0.0, p90_s=0.0)


def settle_device(device: int | None = None) -> None:
    """Wait for the CUDA work queued on ``device``'s current stream (default: the current device).

    CUDA calls return before their kernels run: a clock read right after
    them would move the kernels' time into whatever is timed next. A process
    that never initialised CUDA (or never imported torch) pays nothing.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        torch.cuda.current_stream(device).synchronize()


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One finished step: its number, time split, samples and batch size."""

    step: int
    compute_s: float
    data_wait_s: float
    sync_wait_s: float
    samples: int
    batch_size: int


@dataclass(frozen=True)
class StepSummary:
    """What one report interval's steps add up to."""

    step_count: int
    first_step: int | None
    last_step: int | None
    compute: StepTimeStats
    data_wait_s: float
    sync_wait_s: float
    samples: int

    def report_fields(self) -> dict:
        """The summary as a metrics report's fields (one mapping for the agent and the load
        generator, whose reports must read alike)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}


def _percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(records: list[StepRecord]) -> StepSummary:
    """Sum, min, max, p50, p90 of compute; totals of waits and samples."""
    if not records:
        return StepSummary(0, None, None, ZERO_STATS, 0.0, 0.0, 0)
    compute = sorted(max(0.0, r.compute_s) for r in records)
    stats = StepTimeStats(
        sum_s=sum(compute),
        min_s=compute[0],
        max_s=compute[-1],
        p50_s=_percentile(compute, 0.5),
        p90_s=_percentile(compute, 0.9),
    )
    return StepSummary(
        step_count=len(records),
        first_step=records[0].step,
        last_step=records[-1].step,
        compute=stats,
        data_wait_s=sum(r.data_wait_s for r in records),
        sync_wait_s=sum(r.sync_wait_s for r in records),
        samples=sum(r.samples for r in records),
    )
