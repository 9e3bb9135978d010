"""Turning a policy's intents into commands an agent will trust, and keeping the controller from
thrashing.

* **ids**: a command's id is a hash of its job, cause (the verdict id, or
  the switch step of a DD rebalance), action, target and parameters, so a
  verdict processed twice (a controller restart, a redelivery) yields the same
  id and agents reject the second copy as a duplicate.
* **epoch**: every command carries the controller's epoch; agents reject
  epochs older than the highest they have seen, which fences a replaced
  controller.
* **signature**: HMAC-SHA256 with the shared key (:mod:`antdt.control.signing`).
* **dry run**: commands are published flagged; agents acknowledge them as
  IGNORED and do nothing.
* **rate limit**: a token bucket per job (``max_commands_per_minute``); a
  decision is published whole or not at all.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from antdt.control.signing import sign
from antdt.schemas.models import Evidence, MitigationCommand, StragglerVerdict
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.policy import Intent


def command_id(job_id: str, cause: str, intent: Intent) -> str:
    """Deterministic id: the same cause and intent always give the same id."""
    parts = (
        job_id,
        cause,
        intent.action.value,
        intent.target_worker,
        str(intent.shard_quota),
        str(intent.batch_size),
        str(intent.global_batch_size),
        str(intent.effective_step),
        repr(sorted(intent.parameters.items())),
    )
    return "cmd-" + hashlib.sha256("|".join(parts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class Stamp:
    """What the controller adds to every command."""

    epoch: int
    signing_key: bytes | None = None


def build_command(
    intent: Intent,
    job_id: str,
    verdict: StragglerVerdict | None,
    policy: str,
    config: ControllerConfig,
    stamp: Stamp,
    now: datetime,
) -> MitigationCommand:
    cause = verdict.verdict_id if verdict is not None else f"step-{intent.effective_step}"
    evidence: list[Evidence] = list(verdict.evidence) if verdict is not None else []
    command = MitigationCommand(
        command_id=command_id(job_id, cause, intent),
        job_id=job_id,
        target_worker=intent.target_worker,
        action=intent.action,
        batch_size=intent.batch_size,
        global_batch_size=intent.global_batch_size,
        shard_quota=intent.shard_quota,
        parameters=dict(intent.parameters),
        effective_step=intent.effective_step,
        reason=intent.reason,
        verdict_id=verdict.verdict_id if verdict is not None else None,
        evidence=evidence,
        policy=policy,
        issued_at=now,
        expires_at=now + timedelta(seconds=config.command_ttl_s),
        controller_epoch=stamp.epoch,
        dry_run=config.dry_run,
    )
    return sign(command, stamp.signing_key) if stamp.signing_key else command


@dataclass
class RateLimiter:
    """Token bucket per job: ``per_minute`` commands, refilled continuously."""

    buckets: dict[str, tuple[float, datetime]] = field(default_factory=dict)

    def allow(self, job_id: str, count: int, per_minute: int, now: datetime) -> bool:
        tokens, at = self.buckets.get(job_id, (float(per_minute), now))
        tokens = min(float(per_minute), tokens + (now - at).total_seconds() * per_minute / 60.0)
        if count > tokens:
            self.buckets[job_id] = (tokens, now)
            return False
        self.buckets[job_id] = (tokens - count, now)
        return True
