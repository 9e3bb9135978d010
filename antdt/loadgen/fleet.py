"""A fleet of simulated agents: what many training workers send and how they answer, without torch.

Each :class:`SimWorker` speaks the agent's protocol at the agent's cadence:
a :class:`WorkerMetrics` report every ``report_interval_s`` (step times
drawn around its speed), a heartbeat every ``heartbeat_interval_s``, and the
shard loop (REQUESTED with a quota, a shard trained in ``shard_s``, DONE, the
next request once its shards are used up). A straggler becomes ``factor``
times slower at its onset and stays so; its reports and its shards show it.
Commands are acknowledged as an agent would, and SET_SHARD_QUOTA changes
what it asks for next.

The fleet is pure: :meth:`Fleet.due` says what to send at a given time,
``on_assignment`` and ``on_command`` take what came back, and the
:class:`Observations` hold the latencies a scale test reports (request to
grant, straggler onset to its first command). The bus is the driver's job.
"""

from __future__ import annotations

import heapq
import itertools
import random
from array import array
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import NamedTuple

from antdt.loadgen.traces import IDLE_RESOURCES
from antdt.schemas.models import (
    AckStatus,
    AssignmentStatus,
    CommandAck,
    CommandAction,
    DatasetSpec,
    LifecycleEvent,
    MitigationCommand,
    ProgressKind,
    ShardAssignment,
    ShardProgress,
    WorkerLifecycle,
    WorkerMetrics,
    trusted,
)
from antdt.topics import worker_key
from antdt.worker.steps import StepRecord, summarize


@dataclass(frozen=True)
class FleetSpec:
    """Who is simulated and how fast they go.

    ``stragglers``: the fraction of each job's workers (at least one) that
    turn ``factor`` times slower at an onset drawn between ``onset_from_s``
    and ``onset_until_s`` after the start.
    """

    jobs: int = 1
    workers_per_job: int = 100
    report_interval_s: float = 1.0
    heartbeat_interval_s: float = 5.0
    step_s: float = 0.1
    batch_size: int = 32
    noise: float = 0.1
    shard_s: float = 2.0
    quota: int = 2
    # an unanswered request is asked again, as the agent's dataset does
    request_timeout_s: float = 10.0
    stragglers: float = 0.02
    factor: float = 3.0
    onset_from_s: float = 20.0
    onset_until_s: float = 50.0
    seed: int = 0
    job_prefix: str = "scale"
    dataset: DatasetSpec = field(
        default_factory=lambda: DatasetSpec(
            name="scale",
            size=2_000_000,
            shard_size=100,
            epochs=1000,
            shuffle_seed=1,
            max_attempts=3,
            lease_s=600.0,
        )
    )

    @property
    def workers(self) -> int:
        return self.jobs * self.workers_per_job


@dataclass(frozen=True)
class Outgoing:
    """One record to send: the topic as (component, name), its key, the model, and whose it is
    (job/worker)."""

    component: str
    name: str
    key: str
    value: object
    worker: str


class Grant(NamedTuple):
    """One answered request: when it was sent (s after the start), the answer read, the answer
    stamped (s after)."""

    sent_s: float
    read_s: float
    stamped_s: float


class Grants:
    """Every grant a run saw, kept as three columns of doubles (24 bytes a grant): a half-hour soak
    sees about 360,000, which as tuples of floats grew the load generator from 62 to 140 MB.
    Appended and read back as :class:`Grant`."""

    def __init__(self) -> None:
        self._columns = tuple(array("d") for _ in Grant._fields)

    def append(self, grant: Grant) -> None:
        for column, value in zip(self._columns, grant):
            column.append(value)

    def __len__(self) -> int:
        return len(self._columns[0])

    def __getitem__(self, index: int) -> Grant:
        return Grant(*(column[index] for column in self._columns))

    def __iter__(self) -> Iterator[Grant]:
        return map(Grant, *self._columns)


@dataclass
class Observations:
    """What the fleet saw: request-to-grant latencies, each straggler's first command after its
    onset, other commands."""

    grants: Grants = field(default_factory=Grants)
    # job/worker -> latency from its onset
    first_command_s: dict[str, float] = field(default_factory=dict)
    commands: int = 0
    # commands to workers that never straggled (or before their onset)
    commands_to_the_unhurried: int = 0
    asked_again: int = 0  # requests unanswered within the request timeout

    def onset_to_command_s(self) -> list[float]:
        return list(self.first_command_s.values())


@dataclass
class SimWorker:
    """One simulated agent's state; its clock is the fleet's (seconds, monotonic)."""

    job_id: str
    worker_id: str
    rank: int
    step_s: float
    onset: float | None
    factor: float
    quota: int
    incarnation: str
    next_report: float
    next_heartbeat: float
    report_seq: int = 0
    progress_seq: int = 0
    step: int = 0
    epoch: int = 0
    held: deque = field(default_factory=deque)  # (shard_id, attempt) granted and not yet trained
    training_until: float | None = None
    training: tuple[int, int] | None = None
    asked: tuple[int, float] | None = None  # (seq, when) of the open request
    retry_at: float | None = None  # after a WAIT: when to ask again (None: at once)
    finished: bool = False
    next_look: float = 0.0

    @property
    def key(self) -> str:
        return worker_key(self.job_id, self.worker_id)

    def slowdown(self, now: float) -> float:
        return self.factor if self.onset is not None and now >= self.onset else 1.0


class Fleet:
    """Every simulated worker of every job; :meth:`due` is called often (every few milliseconds)."""

    def __init__(self, spec: FleetSpec, start: float, wall: datetime):
        self.spec, self.start, self.wall = spec, start, wall
        self.rng = random.Random(spec.seed)
        self.workers: dict[str, SimWorker] = {}
        self.seen = Observations()
        # (when, tie-break, worker key): who to look at next
        self._queue: list[tuple[float, int, str]] = []
        self._ties = itertools.count()
        for j in range(spec.jobs):
            job = f"{spec.job_prefix}-{j}"
            slow = set(
                self.rng.sample(
                    range(spec.workers_per_job),
                    max(1, round(spec.stragglers * spec.workers_per_job)),
                )
            )
            for w in range(spec.workers_per_job):
                onset = (
                    start + self.rng.uniform(spec.onset_from_s, spec.onset_until_s)
                    if w in slow
                    else None
                )
                worker = SimWorker(
                    job,
                    f"w{w}",
                    w,
                    spec.step_s * self.rng.uniform(0.95, 1.05),
                    onset,
                    spec.factor,
                    spec.quota,
                    f"sim-{spec.seed}",
                    start + self.rng.uniform(0, spec.report_interval_s),
                    start + self.rng.uniform(0, spec.heartbeat_interval_s),
                )
                self.workers[worker.key] = worker
                self._schedule(worker)

    @property
    def stragglers(self) -> int:
        return sum(worker.onset is not None for worker in self.workers.values())

    def utc(self, now: float) -> datetime:
        return self.wall + timedelta(seconds=now - self.start)

    # ------------------------------------------------------------ sending

    def joined(self, now: float) -> list[Outgoing]:
        return [self._lifecycle(w, LifecycleEvent.JOINED, now) for w in self.workers.values()]

    def due(self, now: float) -> list[Outgoing]:
        out: list[Outgoing] = []
        while self._queue and self._queue[0][0] <= now:
            when, _, key = heapq.heappop(self._queue)
            worker = self.workers[key]
            if when != worker.next_look:
                continue  # rescheduled since: a stale entry
            out += self._act(worker, now)
            self._schedule(worker)
        return out

    def _schedule(self, worker: SimWorker) -> None:
        """Queue the worker at its next own time; an entry it had is left to be skipped."""
        times = [worker.next_report, worker.next_heartbeat]
        if worker.training is not None:
            times.append(worker.training_until)
        elif worker.held:
            times.append(0.0)  # the next shard starts at once
        elif worker.asked is None and not worker.finished:
            times.append(worker.retry_at or 0.0)  # asks at once, or when a WAIT said to
        elif worker.asked is not None:
            times.append(worker.asked[1] + self.spec.request_timeout_s)
        worker.next_look = min(times)
        heapq.heappush(self._queue, (worker.next_look, next(self._ties), worker.key))

    def asked_at(self, key: str, seq: int, sent: float) -> None:
        """The driver's word that request ``seq`` left at ``sent``: grants are timed from there."""
        worker = self.workers[key]
        if worker.asked is not None and worker.asked[0] == seq:
            worker.asked = (seq, sent)

    def _act(self, worker: SimWorker, now: float) -> list[Outgoing]:
        out: list[Outgoing] = []
        if now >= worker.next_report:
            out.append(self._report(worker, worker.next_report))
            worker.next_report += self.spec.report_interval_s
        if now >= worker.next_heartbeat:
            out.append(self._lifecycle(worker, LifecycleEvent.HEARTBEAT, now))
            worker.next_heartbeat += self.spec.heartbeat_interval_s
        return out + self._shards(worker, now)

    def _shards(self, worker: SimWorker, now: float) -> list[Outgoing]:
        out = []
        if worker.training is not None and now >= worker.training_until:
            out.append(
                self._progress(
                    worker,
                    ProgressKind.DONE,
                    now,
                    shard_id=worker.training[0],
                    attempt=worker.training[1],
                )
            )
            worker.training = None
        if worker.training is None and worker.held:
            worker.training = worker.held.popleft()
            worker.training_until = now + self.spec.shard_s * worker.slowdown(now)
        if worker.asked is not None and now >= worker.asked[1] + self.spec.request_timeout_s:
            # its answer was lost (e.g. with a sharder killed before sending it)
            worker.asked = None
            self.seen.asked_again += 1
        if (
            worker.training is None
            and not worker.held
            and worker.asked is None
            and not worker.finished
            and (worker.retry_at is None or now >= worker.retry_at)
        ):
            request = self._progress(
                worker, ProgressKind.REQUESTED, now, quota=worker.quota, dataset=self.spec.dataset
            )
            worker.asked, worker.retry_at = (worker.progress_seq, now), None
            out.append(request)
        return out

    def _report(self, worker: SimWorker, end: float) -> Outgoing:
        """The interval's steps, summed up by the agent's own
        :func:`~antdt.worker.steps.summarize`."""
        interval, size = self.spec.report_interval_s, self.spec.batch_size
        step = worker.step_s * worker.slowdown(end)
        steps = [
            StepRecord(
                worker.step + i,
                step * self.rng.uniform(1 - self.spec.noise, 1 + self.spec.noise),
                0.0,
                0.0,
                size,
                size,
            )
            for i in range(max(1, round(interval / step)))
        ]
        worker.step += len(steps)
        worker.report_seq += 1
        summary = summarize(steps)
        report = trusted(
            WorkerMetrics,
            job_id=worker.job_id,
            worker_id=worker.worker_id,
            rank=worker.rank,
            node_id=f"node-{worker.worker_id}",
            seq=worker.report_seq,
            incarnation=worker.incarnation,
            window_start=self.utc(end - interval),
            window_end=self.utc(end),
            **summary.report_fields(),
            local_batch_size=size,
            resources=IDLE_RESOURCES,
            world_size=self.spec.workers_per_job,
        )
        return Outgoing("worker", "metrics", worker.job_id, report, worker.key)

    def _lifecycle(self, worker: SimWorker, event: LifecycleEvent, now: float) -> Outgoing:
        record = trusted(
            WorkerLifecycle,
            job_id=worker.job_id,
            worker_id=worker.worker_id,
            incarnation=worker.incarnation,
            event=event,
            timestamp=self.utc(now),
            host="loadgen",
            node_id=f"node-{worker.worker_id}",
            pid=1,
            rank=worker.rank,
        )
        return Outgoing("worker", "lifecycle", worker.job_id, record, worker.key)

    def _progress(self, worker: SimWorker, kind: ProgressKind, now: float, **fields) -> Outgoing:
        worker.progress_seq += 1
        record = trusted(
            ShardProgress,
            job_id=worker.job_id,
            worker_id=worker.worker_id,
            incarnation=worker.incarnation,
            seq=worker.progress_seq,
            kind=kind,
            epoch=worker.epoch,
            shard_id=fields.get("shard_id"),
            step=None,
            error=None,
            attempt=fields.get("attempt"),
            quota=fields.get("quota"),
            dataset=fields.get("dataset"),
            version=None,
            timestamp=self.utc(now),
        )
        return Outgoing("shard", "progress", worker.job_id, record, worker.key)

    # ------------------------------------------------------------ receiving

    def on_assignment(self, answer: ShardAssignment, now: float) -> None:
        worker = self.workers.get(worker_key(answer.job_id, answer.worker_id))
        if worker is None or worker.asked is None or answer.in_reply_to != worker.asked[0]:
            return  # another fleet's, or an answer to a request already answered
        sent = worker.asked[1]
        self.seen.grants.append(
            Grant(
                sent - self.start, now - sent, (answer.timestamp - self.utc(sent)).total_seconds()
            )
        )
        worker.asked = None
        if answer.status is AssignmentStatus.GRANTED:
            worker.held.extend((shard.shard_id, shard.attempt) for shard in answer.shards)
        elif answer.status is AssignmentStatus.EPOCH_END:
            worker.epoch = answer.epoch + 1
        elif answer.status is AssignmentStatus.FINISHED:
            worker.finished = True
        else:  # WAIT (nothing free now) or REFUSED: ask again shortly, as the agent does
            worker.retry_at = now + 0.5
        self._schedule(worker)

    def on_command(self, command: MitigationCommand, now: float) -> Outgoing | None:
        key = worker_key(command.job_id, command.target_worker)
        worker = self.workers.get(key)
        if worker is None:
            return None
        self.seen.commands += 1
        if worker.onset is not None and now >= worker.onset:
            self.seen.first_command_s.setdefault(key, now - worker.onset)
        else:
            self.seen.commands_to_the_unhurried += 1
        if command.action is CommandAction.SET_SHARD_QUOTA and command.shard_quota:
            worker.quota = command.shard_quota
        ack = trusted(
            CommandAck,
            command_id=command.command_id,
            job_id=command.job_id,
            worker_id=worker.worker_id,
            status=AckStatus.APPLIED,
            reason=None,
            applied_step=worker.step,
            controller_epoch=command.controller_epoch,
            timestamp=self.utc(now),
        )
        return Outgoing("worker", "acks", command.job_id, ack, key)
