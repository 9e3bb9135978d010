"""In-band batch sizing for synchronous training: LB-BSP at every step, inside the step's
all-reduce.

Each step every rank puts its sample count and its compute time into its own
two slots of the all-reduce's integer counters (:meth:`InBandSizer.encode`);
afterwards every rank holds the same figures for every rank, runs the same
pure sizing on them (:func:`~antdt.sizing.step_model.balance` on each
rank's step-time model) and so reaches the same split, which takes effect
at the very next step. No round trip to a controller and no switch step to
agree on: a rank that slows down is resized one step after its first slow
step, and the global batch stays the same at every step.

The models are those of :mod:`~antdt.sizing.step_model`: ``scale`` from the
rank's latest step with samples, the fixed part from consecutive full steps at
clearly different sizes (not from a rank's first step, whose one-off costs
would pass for a fixed part: it only sets the first split, which the next
step corrects). A split is adopted only if it shortens the predicted step by at
least ``min_gain``, so step-to-step jitter does not move batches.

A rank may be sized to 0 (``low`` 0, the default): when its fixed part
alone outlasts the others' balanced step, the job is faster without it, and
it sits steps out (joining the all-reduce with nothing). Its model then
goes stale, so every :data:`PROBE_EVERY` steps it is given one sample, and
the step after shows whether it is still too slow to take part.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from antdt.sizing.step_model import (
    EVIDENCE_KEPT,
    StepModel,
    balance,
    fixed_part_between,
    fixed_parts,
    slowest_step_s,
    worth_moving,
)

#: Compute times travel as integers of this many seconds (exact in the all-reduce's float32 up to
#: hours).
TICK_S = 1e-4
#: Steps a rank sits out before it gets one sample again, to time it (module docstring).
PROBE_EVERY = 20


class InBandSizer:
    """Every rank's next batch size from every rank's last step; identical on every rank (module
    docstring)."""

    def __init__(
        self,
        world: int,
        rank: int,
        sizes: Sequence[int],
        low: int = 0,
        high: int | None = None,
        min_gain: float = 0.05,
    ):
        if len(sizes) != world or not 0 <= rank < world:
            raise ValueError(f"need one size per rank of {world}, and rank {rank} among them")
        self.world, self.rank = world, rank
        self.sizes = list(sizes)
        self.total = sum(sizes)
        self.low, self.high = low, high if high is not None else self.total
        self.min_gain = min_gain
        self.resizes = 0
        # how much the last decision's split shortens the modelled slowest step (0: no move)
        self.saving_s = 0.0
        self._steps = 0
        self._seen = [0] * world  # full steps seen per rank (the first one is not evidence)
        # (samples, seconds) of the rank's latest step
        self._last: list[tuple[int, float] | None] = [None] * world
        self._last_at = [0] * world  # ... and which step that was
        self._idle = [0] * world  # steps sat out in a row
        self._evidence = [deque(maxlen=EVIDENCE_KEPT) for _ in range(world)]

    @property
    def size(self) -> int:
        """This rank's batch size for the next step."""
        return self.sizes[self.rank]

    def encode(self, samples: int, compute_s: float) -> list[int]:
        """This rank's counters for the step's all-reduce: zeros except its own (samples, compute
        ticks)."""
        slots = [0] * (2 * self.world)
        slots[2 * self.rank], slots[2 * self.rank + 1] = samples, max(0, round(compute_s / TICK_S))
        return slots

    def decide(self, sums: Sequence[int]) -> int:
        """Take in every rank's step (the summed counters); returns this rank's size for the next
        step."""
        self._steps += 1
        for rank in range(self.world):
            self._observe(rank, sums[2 * rank], sums[2 * rank + 1] * TICK_S)
        if any(last is None for last in self._last):
            return self.size
        fixed = fixed_parts({rank: list(found) for rank, found in enumerate(self._evidence)})
        models = [StepModel.through(x, t, fixed[r]) for r, (x, t) in enumerate(self._last)]
        split = balance(self.total, models, self.low, self.high)
        self.saving_s = 0.0
        if split and split != self.sizes and worth_moving(models, self.sizes, split, self.min_gain):
            self.saving_s = slowest_step_s(models, self.sizes) - slowest_step_s(models, split)
            self.sizes = split
            self.resizes += 1
        self._probe_idle_ranks()
        return self.size

    def _probe_idle_ranks(self) -> None:
        """A rank that has sat out PROBE_EVERY steps gets one sample, from the largest batch."""
        for rank in range(self.world):
            self._idle[rank] = self._idle[rank] + 1 if self.sizes[rank] == 0 else 0
            if self._idle[rank] >= PROBE_EVERY:
                donor = max(range(self.world), key=lambda r: self.sizes[r])
                self.sizes[donor] -= 1
                self.sizes[rank], self._idle[rank] = 1, 0

    def _observe(self, rank: int, samples: int, step_s: float) -> None:
        """A step with samples updates the rank's model (its compute time excludes waiting for data,
        so a short batch times true); only full steps, after the first, count as fixed-part
        evidence."""
        if samples == 0 or step_s <= 0:
            return
        full = samples == self.sizes[rank]
        self._seen[rank] += full
        last = self._last[rank]
        # (not across steps sat out)
        consecutive = last is not None and self._last_at[rank] == self._steps - 1
        # not against the first step
        if full and consecutive and last[0] != samples and self._seen[rank] > 2:
            found = fixed_part_between(last[0], last[1], samples, step_s)
            if found is not None:
                self._evidence[rank].append(found)
        self._last[rank], self._last_at[rank] = (samples, step_s), self._steps

    def restore(self, sizes: Sequence[int]) -> None:
        """The sizes a checkpoint kept (the models are learnt again in a few steps)."""
        if len(sizes) != self.world or sum(sizes) != self.total:
            raise ValueError(
                f"a checkpoint's sizes {list(sizes)} are not {self.world} summing to {self.total}"
            )
        self.sizes = list(sizes)
