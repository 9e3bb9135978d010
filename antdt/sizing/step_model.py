"""A worker's step time as a fixed part plus a per-sample part, and the batch split that evens it
out.

A step of ``x`` samples takes ``t = scale * (fixed + x)``: ``fixed`` is the
per-step cost (kernel launches, the optimizer, the all-reduce's set-up) in
sample-equivalents, ``scale`` the seconds per sample-equivalent. A slower
device or a noisy neighbour changes ``scale``; ``fixed`` is a property of the
model on that kind of device and is learnt slowly, from the reports on either
side of a batch-size change (the only moments two sizes are seen at one
speed). Until a worker has such evidence it borrows the job's (workers that
share a model and hardware share the fixed part), and without any the fixed
part is 0: proportional sizing, the right first guess.

:func:`balance` then splits a global batch so that the slowest predicted
step is as short as possible (LB-BSP's goal): with a fixed part, a straggler
gets *less* than its share of throughput suggests, since part of its step
does not shrink with its batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class StepWindow:
    """One report's steps: how many, their mean batch and mean compute time (a step-time model's
    data point).

    ``size`` is the batch size the worker was set to; a window is *full* when
    every step had it (a short batch at an epoch's end, or a feed running
    dry, is timed alongside other costs). The *opening* window of an
    incarnation holds its first steps' one-off costs.
    """

    at: datetime
    first_step: int
    last_step: int
    steps: int
    batch: float
    step_s: float
    size: int = 0
    opening: bool = False

    @property
    def full(self) -> bool:
        return abs(self.batch - self.size) < 0.5


#: Reports pooled into a worker's current model (:func:`current_model`).
POOLED_WINDOWS = 4
#: Two reports count as seeing one speed when they are this close in time.
PAIR_GAP_S = 3.0
#: ... and their batch sizes must differ by this fraction of the larger to tell the fixed part
#: apart.
MIN_SPREAD = 0.2
#: Evidence (summed spreads) a worker needs before its own fixed part is trusted over the job's.
OWN_EVIDENCE = 0.5
#: Fixed-part evidence kept per worker (the latest pairs).
EVIDENCE_KEPT = 16


@dataclass(frozen=True)
class StepModel:
    """``step_s(x) = scale * (fixed + x)``; a step of no samples is no step (0 s: the worker
    computes nothing)."""

    scale: float
    fixed: float

    def step_s(self, batch: float) -> float:
        return self.scale * (self.fixed + batch) if batch > 0 else 0.0

    @classmethod
    def through(cls, batch: float, step_s: float, fixed: float) -> StepModel:
        """The model with fixed part ``fixed`` whose line passes through a step of ``batch`` samples
        in ``step_s``."""
        return cls(step_s / (fixed + batch), fixed)


def fixed_part_evidence(windows: Sequence[StepWindow]) -> dict[datetime, tuple[float, float]]:
    """(fixed part, weight) from each pair of consecutive reports at clearly different batch sizes,
    by the later's time.

    From ``t1 = s (A + x1)`` and ``t2 = s (A + x2)`` at one speed ``s``:
    ``A = (t2 x1 - t1 x2) / (t1 - t2)``. The weight is the batch spread: a pair
    of close sizes says little. Only full windows count, and not an
    incarnation's opening one: their step times carry other costs, and a
    wrong fixed part confirms itself (it makes every change look too small
    to be worth making).
    """
    evidence = {}
    for before, after in zip(windows, windows[1:]):
        close = (after.at - before.at).total_seconds() <= PAIR_GAP_S
        clean = before.full and after.full and not before.opening
        found = (
            fixed_part_between(before.batch, before.step_s, after.batch, after.step_s)
            if close and clean
            else None
        )
        if found is not None:
            evidence[after.at] = found
    return evidence


def fixed_part_between(x1: float, t1: float, x2: float, t2: float) -> tuple[float, float] | None:
    """(fixed part, weight) from two steps of ``x1`` and ``x2`` samples at one speed; None if they
    say nothing."""
    spread = abs(x1 - x2) / max(x1, x2)
    if spread < MIN_SPREAD or t1 == t2:
        return None
    fixed = (t2 * x1 - t1 * x2) / (t1 - t2)
    return (fixed, spread) if math.isfinite(fixed) else None


def weighted_median(pairs: Iterable[tuple[float, float]]) -> float | None:
    ordered = sorted(pairs)
    total = sum(w for _, w in ordered)
    if not ordered or total <= 0:
        return None
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= total / 2:
            return value
    return ordered[-1][0]


def fixed_parts(evidence: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """Each worker's fixed part: its own evidence when it has enough, else the job's, else 0 (never
    negative)."""
    pooled = weighted_median(pair for pairs in evidence.values() for pair in pairs)
    parts = {}
    for worker, pairs in evidence.items():
        own = weighted_median(pairs) if sum(w for _, w in pairs) >= OWN_EVIDENCE else None
        chosen = own if own is not None else pooled
        parts[worker] = max(0.0, chosen or 0.0)
    return parts


def current_model(windows: Sequence[StepWindow], since_step: int, fixed: float) -> StepModel | None:
    """The worker's model now: ``scale`` from its last :data:`POOLED_WINDOWS` reports with a step
    from ``since_step`` on, pooled; None while it has none.

    A report that straddles a batch change is as good as any: its mean batch
    and mean step time lie on the same line, and so do pooled means.
    Pooled, because one second of compute on a busy machine is one stretch
    of contention. The opening report never counts: its steps carry the
    incarnation's one-off costs. On one report, the opening one, two equal
    ranks sharing two cores with the services differed by more than a move
    gains, and DD moved them apart (docs/torchrun.md).
    """
    recent = [w for w in windows if not w.opening and w.last_step >= since_step]
    recent = recent[-POOLED_WINDOWS:]
    if not recent:
        return None
    steps = sum(w.steps for w in recent)
    batch = sum(w.batch * w.steps for w in recent) / steps
    step_s = sum(w.step_s * w.steps for w in recent) / steps
    return StepModel.through(batch, step_s, fixed)


def balance(total: int, models: Sequence[StepModel], low: int, high: int) -> list[int] | None:
    """Integer batch sizes in [low, high] summing to ``total`` with the shortest slowest step; None
    if impossible.

    The real-valued optimum gives every worker the step time ``T`` at which
    ``sum(clamp(T / scale - fixed, low, high)) == total`` (found by
    bisection); the sizes are then floored and the samples left over handed
    out one at a time, each to the worker whose step stays shortest with it
    (which keeps the integer split optimal).
    """
    n = len(models)
    if (
        n == 0
        or n * low > total
        or n * high < total
        or any(m.scale <= 0 or m.fixed < 0 for m in models)
    ):
        return None

    def sizes_at(level: float) -> list[float]:
        return [min(high, max(low, level / m.scale - m.fixed)) for m in models]

    lo, hi = 0.0, max(m.step_s(high) for m in models)
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(sizes_at(mid)) < total else (lo, mid)
    sizes = [min(math.floor(x + 1e-9), high) for x in sizes_at(hi)]
    while sum(sizes) > total:  # the bisection's level can overshoot by a hair
        worst = max(
            (i for i in range(n) if sizes[i] > low), key=lambda i: models[i].step_s(sizes[i])
        )
        sizes[worst] -= 1
    while sum(sizes) < total:
        best = min(
            (i for i in range(n) if sizes[i] < high), key=lambda i: models[i].step_s(sizes[i] + 1)
        )
        sizes[best] += 1
    return sizes


def slowest_step_s(models: Sequence[StepModel], sizes: Sequence[int]) -> float:
    return max(m.step_s(x) for m, x in zip(models, sizes))


def worth_moving(
    models: Sequence[StepModel],
    current: Sequence[int],
    split: Sequence[int],
    min_gain: float,
    step_s: float = 0.0,
) -> bool:
    """Move to ``split``: the current sizes miss the global batch, or the slowest step shortens by
    ``min_gain`` of the step.

    The step is the modelled one, or the measured whole step ``step_s``
    (compute, data and waits) where that is longer: on a short step spent
    mostly in the all-reduce, a split that gains 10 % of the compute gains
    2 % of the step, and moving batches costs more than it wins (measured on
    the user-style job, docs/torchrun.md: a healthy run moved 32/32 to 37/27
    on a 5 % difference of compute and its steps got 9 % longer).
    """
    if sum(current) != sum(split):
        return True
    then_s = slowest_step_s(models, split)
    return slowest_step_s(models, current) - then_s > min_gain * max(then_s, step_s)
