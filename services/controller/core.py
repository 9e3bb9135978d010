"""The controller's decisions, without Kafka: events in, signed commands out.

:class:`ControllerCore` keeps a :class:`JobView` per job, asks the job's
policy (per-job configuration from the control topic) what to do about each
verdict and worker report, applies the safety rules of :mod:`safety` and
returns the commands to publish. A verdict id seen before is ignored (input
is at-least-once), and a command's effects on the view (quotas, batch sizes,
budgets) are recorded as it is returned.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from antdt.control.topic import ConfigLayers
from antdt.schemas.models import (
    ControlComponent,
    ControlConfig,
    MitigationCommand,
    StragglerVerdict,
    WorkerMetrics,
)
from antdt.services.controller import dd, nd  # noqa: F401 - registers the built-in policies
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.policy import Decision, load_policy
from antdt.services.controller.safety import RateLimiter, Stamp, build_command
from antdt.services.controller.state import JobView

REMEMBERED_VERDICTS = 100_000


@dataclass(frozen=True)
class Outcome:
    commands: tuple[MitigationCommand, ...] = ()
    skipped: tuple[str, ...] = ()


class ControllerCore:
    """Policies plus safety, per job (see the module docstring)."""

    def __init__(self, defaults: ControllerConfig | None = None, stamp: Stamp | None = None):
        self.config = ConfigLayers(
            ControlComponent.CONTROLLER, defaults or ControllerConfig(), check=validate_policy
        )
        validate_policy(self.config.defaults)
        self.stamp = stamp or Stamp(epoch=1)
        self.jobs: dict[str, JobView] = {}
        self.rate = RateLimiter()
        self._seen_verdicts: OrderedDict[str, None] = OrderedDict()

    def job(self, job_id: str) -> JobView:
        if job_id not in self.jobs:
            self.jobs[job_id] = JobView(job_id)
        return self.jobs[job_id]

    def recall(self, commands: Iterable[MitigationCommand]) -> int:
        """Take in commands issued before (by a predecessor): their effects and their verdicts.
        Returns the count."""
        count = 0
        for command in commands:
            self.job(command.job_id).on_issued(command)
            if command.verdict_id:
                self._remember(command.verdict_id)
            count += 1
        return count

    def forget(self, job_ids: Iterable[str]) -> None:
        """Drop jobs another controller took over: if they come back, their commands are recalled
        afresh."""
        for job_id in list(job_ids):
            self.jobs.pop(job_id, None)
            self.rate.buckets.pop(job_id, None)

    def _remember(self, verdict_id: str) -> None:
        self._seen_verdicts[verdict_id] = None
        while len(self._seen_verdicts) > REMEMBERED_VERDICTS:
            self._seen_verdicts.popitem(last=False)

    def on_verdict(self, verdict: StragglerVerdict, now: datetime) -> Outcome:
        if verdict.verdict_id in self._seen_verdicts:
            return Outcome(skipped=(f"verdict {verdict.verdict_id} seen before",))
        self._remember(verdict.verdict_id)
        job = self.job(verdict.job_id)
        job.on_verdict(verdict)
        return self._decide(job, verdict, now)

    def on_metrics(self, report: WorkerMetrics, now: datetime) -> Outcome:
        job = self.job(report.job_id)
        job.on_metrics(report)
        return self._decide(job, report, now)

    def apply(self, control: ControlConfig) -> bool:
        """Apply a control record meant for the controller; ConfigError (nothing applied) if
        invalid."""
        return self.config.apply(control, self.jobs) is not None

    def _decide(
        self, job: JobView, event: StragglerVerdict | WorkerMetrics, now: datetime
    ) -> Outcome:
        config = self.config.for_job(job.job_id)
        policy = load_policy(config.policy)
        decision: Decision = policy.decide(job, event, config, now)
        if not decision.intents:
            if decision.memo is not None:  # what the policy learnt, without acting on it
                job.memo[policy.name] = decision.memo
            return Outcome(skipped=decision.skipped)
        if not self.rate.allow(
            job.job_id, len(decision.intents), config.max_commands_per_minute, now
        ):
            return Outcome(
                skipped=(
                    *decision.skipped,
                    f"rate limit: {len(decision.intents)} command(s) over "
                    f"{config.max_commands_per_minute}/min for {job.job_id}",
                )
            )
        verdict = event if isinstance(event, StragglerVerdict) else None
        commands = tuple(
            build_command(i, job.job_id, verdict, policy.name, config, self.stamp, now)
            for i in decision.intents
        )
        for command in commands:
            job.on_issued(command)
        if decision.memo is not None:
            job.memo[policy.name] = decision.memo
        return Outcome(commands, decision.skipped)


def validate_policy(config: ControllerConfig) -> None:
    """ConfigError unless the configured policy loads."""
    load_policy(config.policy)
