"""AntDT-DD: per-worker batch sizes for dedicated clusters with synchronous all-reduce (LB-BSP style).

In synchronous training every step waits for the slowest worker, so the
controller gives each worker a batch proportional to its measured compute
throughput (samples per compute-second) and all workers finish a step at
about the same time. Gradients are averaged with weights proportional to the
local batch sizes (:class:`antdt.worker.ddp.WeightedGradientAverager`), so
the update equals that of the global batch.

* **global batch constant**: the sizes always sum to the global batch
  (``global_batch_size``, or the workers' sum when the job is first seen),
  by exact integer allocation (largest remainder) within
  ``[min_batch_size, max_batch_size]`` (:func:`allocate`).
* **damping**: each worker moves ``gain`` of the way to its target; the gain
  halves when the worker's change reverses direction and doubles back
  towards 1 while it keeps its direction, so a noisy estimate does not make
  batch sizes oscillate.
* **one switch step**: all changed workers switch at the same
  ``effective_step``, ahead of the most advanced worker by
  ``switch_lead_s`` of steps (plus one), so every command arrives before any
  worker reaches it.
* changes smaller than ``min_relative_change`` are not sent, and the job is
  rebalanced at most every ``rebalance_interval_s``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from antdt.schemas.models import CommandAction
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.policy import NOTHING, Decision, Event, Intent, register
from antdt.services.controller.state import JobView


def allocate(total: int, weights: list[float], low: int, high: int) -> list[int] | None:
    """Integers proportional to ``weights`` within [low, high] that sum to ``total``; None if impossible.

    Finds the level ``x`` at which ``sum(clamp(x * w, low, high)) == total``:
    the sum is piecewise linear and growing in ``x``, with breaks where a share
    reaches a bound, so the level is solved exactly on the right piece. Then
    the floors are taken and the remainder handed out, one each, to the
    largest fractional parts. A zero weight counts as a vanishing one (it
    takes only what the others cannot), and all-zero weights share equally.
    """
    n = len(weights)
    if n == 0 or n * low > total or n * high < total or any(w < 0 or math.isnan(w) for w in weights):
        return None
    top = max(weights) or 1.0
    weights = [max(w / top, 1e-12) for w in weights] if any(weights) else [1.0] * n

    def spread(level: float) -> list[float]:
        return [min(high, max(low, level * w)) for w in weights]

    exact = spread(_level(total, weights, low, high, spread))
    sizes = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: exact[i] - sizes[i], reverse=True)
    short = total - sum(sizes)
    for i in order:
        if short <= 0:
            break
        if sizes[i] < high:
            sizes[i] += 1
            short -= 1
    return sizes if short == 0 and all(low <= x <= high for x in sizes) else None


def _level(total: int, weights: list[float], low: int, high: int, spread) -> float:
    breaks = sorted({0.0, *(bound / w for w in weights if w > 0 for bound in (low, high))})
    previous, reached = 0.0, sum(spread(0.0))
    for point in breaks:
        value = sum(spread(point))
        if value >= total:
            if value == reached:
                return point
            return previous + (total - reached) * (point - previous) / (value - reached)
        previous, reached = point, value
    return breaks[-1]


@dataclass
class Damping:
    """What DD remembers per job."""

    gains: dict[str, float] = field(default_factory=dict)
    directions: dict[str, int] = field(default_factory=dict)
    last_rebalance: datetime | None = None


class DedicatedPolicy:
    name = "antdt-dd"

    def decide(self, job: JobView, event: Event, config: ControllerConfig, now: datetime) -> Decision:
        memo: Damping = job.memo.get(self.name) or Damping()
        if memo.last_rebalance is not None and (now - memo.last_rebalance).total_seconds() < config.rebalance_interval_s:
            return NOTHING
        workers = sorted((w for w in job.workers.values() if w.samples_per_s and w.batch_size and w.last_step is not None),
                         key=lambda w: w.worker_id)
        if len(workers) < 2 or len(workers) < len(job.workers):
            return NOTHING  # wait until every worker has reported
        current = [w.batch_size for w in workers]
        total = config.global_batch_size or job.global_batch_size or sum(current)
        target = allocate(total, [w.samples_per_s for w in workers], config.min_batch_size, config.max_batch_size)
        if target is None:
            return Decision(skipped=(f"global batch {total} cannot be split over {len(workers)} workers within "
                                     f"[{config.min_batch_size}, {config.max_batch_size}]",))
        gains, directions = dict(memo.gains), dict(memo.directions)
        proposed = []
        for worker, now_size, goal in zip(workers, current, target):
            direction = (goal > now_size) - (goal < now_size)
            gain = gains.get(worker.worker_id, 1.0)
            if direction and directions.get(worker.worker_id, 0) == -direction:
                gain /= 2
            elif direction:
                gain = min(1.0, gain * 2)
            gains[worker.worker_id] = gain
            if direction:
                directions[worker.worker_id] = direction
            proposed.append(max(now_size + gain * (goal - now_size), 1e-9))
        sizes = allocate(total, proposed, config.min_batch_size, config.max_batch_size) or target
        changed = [(w, old, new) for w, old, new in zip(workers, current, sizes) if new != old]
        biggest = max((abs(new - old) / old for _, old, new in changed), default=0.0)
        if not changed or (biggest < config.min_relative_change and sum(current) == total):
            return NOTHING
        step = switch_step(workers, config.switch_lead_s)
        intents = tuple(
            Intent(CommandAction.ADJUST_BATCH_SIZE, w.worker_id,
                   f"batch {old} -> {new}: {w.samples_per_s:.0f} samples/s of the job's "
                   f"{sum(x.samples_per_s for x in workers):.0f}, global batch {total}",
                   batch_size=new, global_batch_size=total, effective_step=step)
            for w, old, new in changed
        )
        return Decision(intents, memo=Damping(gains, directions, now))


def switch_step(workers, lead_s: float) -> int:
    """A step every worker is still before: the most advanced one's, plus ``lead_s`` worth of steps, plus one."""
    ahead = max(w.last_step for w in workers)
    rate = max((w.steps_per_s or 0.0) for w in workers)
    return ahead + math.ceil(rate * lead_s) + 1


register(DedicatedPolicy())
