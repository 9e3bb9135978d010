"""What the controller knows about a job: the policies' input (pure, no Kafka).

The controller core keeps one :class:`JobView` per job, updated from worker
metrics (batch size, step, throughput, incarnation), verdicts (the open
episode of each worker) and the commands it issued itself (quotas, batch
sizes, restarts for budgets and cooldowns). Policies only read it; what a
policy wants to remember between decisions it returns as a memo, which the
core stores when the decision is published.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from antdt.schemas.models import (
    WORKER_ROLE,
    CommandAction,
    MitigationCommand,
    StragglerVerdict,
    VerdictKind,
    WorkerMetrics,
)
from antdt.sizing.step_model import StepWindow

DISRUPTIVE = (CommandAction.RESTART, CommandAction.EVICT)
WINDOWS_KEPT = 32


@dataclass
class WorkerView:
    worker_id: str
    node_id: str | None = None
    role: str = WORKER_ROLE  # or "ps": a parameter-server shard, which has no shards to pull
    incarnation: str | None = None
    last_step: int | None = None
    steps_per_s: float | None = None
    batch_size: int | None = None
    samples_per_s: float | None = None  # compute throughput: samples / compute seconds
    episode: StragglerVerdict | None = None  # the latest non-CLEARED verdict
    quota: int | None = None  # the last quota commanded
    acted_at: datetime | None = None  # last RESTART/EVICT, until the worker is back
    last_seen: datetime | None = None
    world_size: int | None = None  # its synchronous group's ranks, as it last reported
    # recent StepWindows, oldest first
    windows: deque = field(default_factory=lambda: deque(maxlen=WINDOWS_KEPT))


@dataclass(frozen=True)
class ActionRecord:
    at: datetime
    worker_id: str
    node_id: str | None
    action: CommandAction


@dataclass
class JobView:
    job_id: str
    workers: dict[str, WorkerView] = field(default_factory=dict)
    actions: deque = field(default_factory=lambda: deque(maxlen=10_000))
    degraded_nodes: set[str] = field(default_factory=set)
    global_batch_size: int | None = None
    memo: dict[str, Any] = field(default_factory=dict)  # policy name -> what the policy keeps

    def worker(self, worker_id: str) -> WorkerView:
        if worker_id not in self.workers:
            self.workers[worker_id] = WorkerView(worker_id)
        return self.workers[worker_id]

    # ------------------------------------------------------------ inputs

    def on_metrics(self, report: WorkerMetrics) -> None:
        view = self.worker(report.worker_id)
        if view.incarnation is not None and view.incarnation != report.incarnation:
            view.acted_at = None  # back after a restart: no longer "acted on"
            view.episode = None
            view.quota = None
            view.windows.clear()
        view.incarnation = report.incarnation
        view.node_id = report.node_id or view.node_id
        view.role = report.role
        view.batch_size = report.local_batch_size
        view.world_size = report.world_size
        view.last_seen = report.window_end
        if report.last_step is not None:
            view.last_step = report.last_step
        seconds = (report.window_end - report.window_start).total_seconds()
        if seconds > 0 and report.step_count:
            view.steps_per_s = report.step_count / seconds
        if report.samples and report.compute.sum_s > 0:
            view.samples_per_s = report.samples / report.compute.sum_s
            if report.step_count:
                view.windows.append(
                    StepWindow(
                        report.window_end,
                        report.first_step,
                        report.last_step,
                        report.step_count,
                        report.samples / report.step_count,
                        report.compute.sum_s / report.step_count,
                        report.local_batch_size,
                        opening=not view.windows,
                    )
                )

    def on_verdict(self, verdict: StragglerVerdict) -> None:
        view = self.worker(verdict.worker_id)
        view.node_id = verdict.node_id or view.node_id
        view.episode = None if verdict.kind is VerdictKind.CLEARED else verdict

    def on_issued(self, command: MitigationCommand) -> None:
        """Record a published command (budgets, cooldowns, current quotas and batch sizes)."""
        view = self.worker(command.target_worker)
        if command.dry_run:
            return
        if command.action is CommandAction.SET_SHARD_QUOTA:
            view.quota = command.shard_quota
        elif command.action is CommandAction.ADJUST_BATCH_SIZE:
            view.batch_size = command.batch_size
            self.global_batch_size = command.global_batch_size or self.global_batch_size
        elif command.action is CommandAction.MARK_NODE_DEGRADED and view.node_id:
            self.degraded_nodes.add(command.parameters.get("node", view.node_id))
        if command.action in DISRUPTIVE:
            view.acted_at = command.issued_at
        self.actions.append(
            ActionRecord(command.issued_at, command.target_worker, view.node_id, command.action)
        )

    # ------------------------------------------------------------ questions policies ask

    def present(self, now: datetime, silent_after_s: float) -> list[WorkerView]:
        """The workers still in the job: all but those whose reports stopped ``silent_after_s``
        ago."""
        return [
            w
            for w in self.workers.values()
            if w.last_seen is None or (now - w.last_seen).total_seconds() < silent_after_s
        ]

    def disruptive_since(self, since: datetime) -> list[ActionRecord]:
        return [a for a in self.actions if a.at >= since and a.action in DISRUPTIVE]

    def acted_on(self, now: datetime, timeout: timedelta) -> list[WorkerView]:
        """Workers restarted or evicted and not back yet (within ``timeout``)."""
        return [
            w
            for w in self.workers.values()
            if w.acted_at is not None and now - w.acted_at < timeout
        ]

    def last_action_on(
        self, worker_id: str | None = None, node_id: str | None = None
    ) -> datetime | None:
        for record in reversed(self.actions):
            if record.action in DISRUPTIVE and (
                (worker_id is not None and record.worker_id == worker_id)
                or (node_id is not None and record.node_id == node_id)
            ):
                return record.at
        return None


def group_size(workers: list[WorkerView]) -> int | None:
    """The synchronous group's size as the most recent report says (None if no worker reports
    one)."""
    reported = [w for w in workers if w.world_size is not None and w.last_seen is not None]
    return max(reported, key=lambda w: w.last_seen).world_size if reported else None
