"""AntDT-ND: mitigation for non-dedicated, shared clusters.

Dynamic sharding already makes a slow worker pull fewer shards; the policy
sharpens that and replaces what will not recover:

| verdict | commands |
|---|---|
| STRAGGLER, TRANSIENT or DETERMINISTIC | SET_SHARD_QUOTA ``straggler_quota`` (a slower machine keeps its smaller share) |
| STRAGGLER, PERSISTENT | MARK_NODE_DEGRADED (a placement hint) and ``persistent_action`` (RESTART or EVICT), within the budgets; otherwise the quota only |
| LEADER | SET_SHARD_QUOTA ``leader_quota`` |
| any verdict on a parameter-server shard | no quota (it pulls no shards); PERSISTENT: MARK_NODE_DEGRADED and ``persistent_action``, as for a worker |
| CLEARED | SET_SHARD_QUOTA ``default_quota``, if the quota was changed |

A persistent straggler less than ``min_restart_ratio`` (1.5) times slower than the job median keeps
the quota only: a restart stalls it for seconds and may land on a node no better. Budgets for
RESTART/EVICT: at most ``max_restarts_per_hour`` per job; at most ``max_acted_fraction`` of the
job's workers restarted-and-not-back at once (always at least one is allowed); no action on a worker
within ``worker_cooldown_s`` of the last one, nor on a node within ``node_cooldown_s``. A refused
action is reported in ``Decision.skipped``.
"""  # noqa: E501 (a markdown table: a row cannot be wrapped)

from __future__ import annotations

import math
from datetime import datetime, timedelta

from antdt.schemas.models import WORKER_ROLE, StragglerClass, StragglerVerdict, VerdictKind
from antdt.schemas.models import CommandAction as A
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.policy import NOTHING, Decision, Event, Intent, register
from antdt.services.controller.state import JobView


class NonDedicatedPolicy:
    name = "antdt-nd"

    def decide(
        self, job: JobView, event: Event, config: ControllerConfig, now: datetime
    ) -> Decision:
        if not isinstance(event, StragglerVerdict):
            return NOTHING
        verdict = event
        if verdict.kind is VerdictKind.CLEARED:
            return self._restore(job, verdict, config)
        if verdict.kind is VerdictKind.LEADER:
            return _quota(
                job,
                verdict,
                config.leader_quota,
                "leader: faster than the job, give it more shards",
            )
        if verdict.classification is StragglerClass.PERSISTENT:
            return self._replace(job, verdict, config, now)
        return _quota(
            job,
            verdict,
            config.straggler_quota,
            f"{verdict.classification.value.lower()} straggler: pull fewer shards until cleared",
        )

    def _restore(
        self, job: JobView, verdict: StragglerVerdict, config: ControllerConfig
    ) -> Decision:
        current = job.worker(verdict.worker_id).quota
        if current is None or current == config.default_quota:
            return NOTHING
        return Decision(
            (
                Intent(
                    A.SET_SHARD_QUOTA,
                    verdict.worker_id,
                    "cleared: back to the default quota",
                    shard_quota=config.default_quota,
                ),
            )
        )

    def _replace(
        self, job: JobView, verdict: StragglerVerdict, config: ControllerConfig, now: datetime
    ) -> Decision:
        refusal = budget_refusal(job, verdict, config, now)
        quota = _quota(
            job, verdict, config.straggler_quota, "persistent straggler: pull fewer shards"
        )
        if refusal is not None:
            return Decision(
                quota.intents,
                (f"{config.persistent_action} {verdict.worker_id} refused: {refusal}",),
            )
        intents = list(quota.intents)
        node = verdict.node_id or job.worker(verdict.worker_id).node_id
        if node:
            intents.append(
                Intent(
                    A.MARK_NODE_DEGRADED,
                    verdict.worker_id,
                    f"node {node} hosts a persistent straggler: place the replacement elsewhere",
                    parameters={"node": node},
                )
            )
        intents.append(
            Intent(A(config.persistent_action), verdict.worker_id, _persistent_reason(verdict))
        )
        return Decision(tuple(intents))


def _persistent_reason(verdict: StragglerVerdict) -> str:
    lasted = (
        f" for {(verdict.issued_at - verdict.episode_start).total_seconds():.0f} s"
        if verdict.episode_start
        else ""
    )
    return f"persistent straggler{lasted} at {verdict.speed_ratio:.2f}x the job median"


def _quota(job: JobView, verdict: StragglerVerdict, quota: int, reason: str) -> Decision:
    view = job.worker(verdict.worker_id)
    if view.quota == quota or view.role != WORKER_ROLE:  # a parameter-server shard pulls no shards
        return NOTHING
    return Decision((Intent(A.SET_SHARD_QUOTA, verdict.worker_id, reason, shard_quota=quota),))


def budget_refusal(
    job: JobView, verdict: StragglerVerdict, config: ControllerConfig, now: datetime
) -> str | None:
    """Why a RESTART/EVICT of the verdict's worker is not allowed now, or None."""
    if verdict.speed_ratio < config.min_restart_ratio:
        return (
            f"{verdict.speed_ratio:.2f}x the job median is under "
            f"min_restart_ratio {config.min_restart_ratio:g}: "
            "moving it would cost more than it can win"
        )
    hour_ago = now - timedelta(hours=1)
    if len(job.disruptive_since(hour_ago)) >= config.max_restarts_per_hour:
        return f"budget of {config.max_restarts_per_hour} restarts per hour spent"
    acting = job.acted_on(now, timedelta(seconds=config.action_timeout_s))
    allowed = max(1, math.floor(config.max_acted_fraction * max(len(job.workers), 1)))
    if len(acting) >= allowed:
        return f"{len(acting)} of {len(job.workers)} workers already being replaced (cap {allowed})"
    last_worker = job.last_action_on(worker_id=verdict.worker_id)
    if last_worker is not None and now - last_worker < timedelta(seconds=config.worker_cooldown_s):
        return f"worker cooldown: acted on {(now - last_worker).total_seconds():.0f} s ago"
    node = verdict.node_id or job.worker(verdict.worker_id).node_id
    last_node = job.last_action_on(node_id=node) if node else None
    if last_node is not None and now - last_node < timedelta(seconds=config.node_cooldown_s):
        return f"node cooldown: {node} acted on {(now - last_node).total_seconds():.0f} s ago"
    return None


register(NonDedicatedPolicy())
