"""AntDT-DD: per-worker batch sizes for dedicated clusters with synchronous all-reduce (LB-BSP
style).

In synchronous training every step waits for the slowest worker, so the
controller sizes each worker's batch so that all finish a step together.
Gradients are averaged with weights proportional to the local batch sizes
(:class:`antdt.worker.ddp_hook.WeightedReduce`, inside DDP's own all-reduce),
so the update equals that of the global batch.

* **a step-time model**: each worker's step is a fixed part plus a per-sample part
  (:mod:`step_model`), measured from its reports; the split minimises the slowest predicted step and
  keeps the global batch (``global_batch_size``, or the workers' sum when the job is first seen)
  within ``[min_batch_size, max_batch_size]``.
* **one decision, one command**: a rebalance names one switch step for every changed worker (and how
  many they are, so that synchronous ranks can agree to switch together however late a command
  arrives: :mod:`antdt.worker.elastic.resize`), ahead of the most advanced one by ``switch_lead_s``
  of steps (plus one), and the next rebalance waits until every worker has reported a step from it
  on: no decision is taken on figures from before the last one took effect, so nothing is sent
  twice.
* **no chasing noise**: a rebalance is sent only if it shortens the predicted step by at least
  ``min_relative_change`` of the whole measured step (waits included), and at most every
  ``rebalance_interval_s``.
* **membership**: a worker silent for ``silent_after_s`` has left (an evicted node of an elastic
  job); the global batch is split over those present, once they are as many as the group's size the
  workers report. A restarted worker (new incarnation) counts its steps again from its checkpoint,
  so the last switch step is forgotten.

With ``batch_sizing = "in-band"`` the workers size their batches themselves
at every step, inside the all-reduce (:mod:`antdt.sizing.inband`: the same
model, without a round trip or a switch step), and the policy sends nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime

from antdt.schemas.models import RANKS_CHANGED, CommandAction
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.policy import NOTHING, Decision, Event, Intent, register
from antdt.services.controller.state import JobView, WorkerView, group_size
from antdt.sizing.step_model import (
    EVIDENCE_KEPT,
    StepModel,
    balance,
    current_model,
    fixed_part_evidence,
    fixed_parts,
    slowest_step_s,
    worth_moving,
)

#: With the workers' sizes short of the global batch, the job is taken as whole once no new worker
#: came for this long.
MEMBERSHIP_SETTLE_S = 5.0


@dataclass
class Rebalances:
    """What DD remembers per job: the last switch step, the fixed-part evidence, the members (id,
    incarnation)."""

    switch_step: int = 0
    last_rebalance: datetime | None = None
    evidence: dict[str, dict[datetime, tuple[float, float]]] = field(default_factory=dict)
    members: frozenset = frozenset()
    members_since: datetime | None = None

    def learn(self, workers: list[WorkerView]) -> dict[str, list[tuple[float, float]]]:
        """Fold the pairs in the workers' recent reports into the evidence; each worker's pairs."""
        for worker in workers:
            kept = self.evidence.setdefault(worker.worker_id, {})
            kept.update(fixed_part_evidence(list(worker.windows)))
            for stale in sorted(kept)[:-EVIDENCE_KEPT]:
                del kept[stale]
        return {w.worker_id: list(self.evidence.get(w.worker_id, {}).values()) for w in workers}


class DedicatedPolicy:
    name = "antdt-dd"

    def decide(
        self, job: JobView, event: Event, config: ControllerConfig, now: datetime
    ) -> Decision:
        if config.batch_sizing == "in-band":
            return NOTHING  # the workers size every step themselves
        memo: Rebalances = job.memo.get(self.name) or Rebalances()
        if (
            memo.last_rebalance is not None
            and (now - memo.last_rebalance).total_seconds() < config.rebalance_interval_s
        ):
            return NOTHING
        present = job.present(now, config.silent_after_s)
        workers = sorted(
            (w for w in present if w.batch_size and w.last_step is not None and w.windows),
            key=lambda w: w.worker_id,
        )
        if (
            len(workers) < 2
            or len(workers) < len(present)
            or group_size(present) not in (None, len(present))
        ):
            return NOTHING  # wait until every rank has reported (and a rank gone has fallen silent)
        members = frozenset((w.worker_id, w.incarnation) for w in workers)
        since = memo.members_since if members == memo.members else now
        # A restarted group counts its steps again from its checkpoint: the last switch step means
        # nothing now.
        switch = memo.switch_step if members == memo.members else 0
        memo = Rebalances(
            switch,
            memo.last_rebalance,
            {k: dict(v) for k, v in memo.evidence.items()},
            members,
            since,
        )
        current = [w.batch_size for w in workers]
        total = config.global_batch_size or job.global_batch_size or sum(current)
        if sum(current) != total and (now - since).total_seconds() < MEMBERSHIP_SETTLE_S:
            # some worker has not reported yet: a split now would be wild
            return Decision(memo=memo)
        fixed = fixed_parts(memo.learn(workers))
        models = [current_model(w.windows, memo.switch_step, fixed[w.worker_id]) for w in workers]
        if any(m is None for m in models):
            return Decision(memo=memo)  # the last rebalance is not measured everywhere yet
        sizes = balance(total, models, config.min_batch_size, config.max_batch_size)
        if sizes is None:
            return Decision(
                skipped=(
                    f"global batch {total} cannot be split over {len(workers)} workers within "
                    f"[{config.min_batch_size}, {config.max_batch_size}]",
                ),
                memo=memo,
            )
        # the whole step, as the ranks live it (in lockstep: the slowest rate is everyone's)
        step_s = max((1 / w.steps_per_s for w in workers if w.steps_per_s), default=0.0)
        if not worth_moving(models, current, sizes, config.min_relative_change, step_s):
            return Decision(memo=memo)
        now_s, then_s = slowest_step_s(models, current), slowest_step_s(models, sizes)
        step = switch_step(workers, config.switch_lead_s)
        changed = sum(new != old for old, new in zip(current, sizes))
        intents = tuple(
            Intent(
                CommandAction.ADJUST_BATCH_SIZE,
                w.worker_id,
                _reason(m, old, new, now_s, then_s, total),
                batch_size=new,
                global_batch_size=total,
                effective_step=step,
                parameters={RANKS_CHANGED: str(changed)},
            )
            for w, m, old, new in zip(workers, models, current, sizes)
            if new != old
        )
        return Decision(intents, memo=Rebalances(step, now, memo.evidence, members, since))


def _reason(model: StepModel, old: int, new: int, now_s: float, then_s: float, total: int) -> str:
    return (
        f"batch {old} -> {new}: its step {1e3 * model.step_s(old):.2f} -> "
        f"{1e3 * model.step_s(new):.2f} ms (fixed part {model.fixed:.1f} samples); the job's "
        f"{1e3 * now_s:.2f} -> {1e3 * then_s:.2f} ms, "
        f"global batch {total}"
    )


def switch_step(workers, lead_s: float) -> int:
    """A step every worker is still before: the most advanced one's, plus ``lead_s`` worth of steps,
    plus one."""
    ahead = max(w.last_step for w in workers)
    rate = max((w.steps_per_s or 0.0) for w in workers)
    return ahead + math.ceil(rate * lead_s) + 1


register(DedicatedPolicy())
