"""What the dashboard and the report show, read back from the bus as an operator would.

:class:`Timeline` follows the run's topics on a thread of its own (manual
assignment from the beginning, no consumer group): the workers' metrics,
the monitor's verdicts, the controller's commands, the agents' acks and the
sharder's answers. It keeps, per worker, the throughput and batch-size
series, where its time went, the shards held and the current verdict, plus every verdict and
command as a marker for the plots. Times are seconds since the run's start
signal (set with :meth:`Timeline.set_start`; before it, since the timeline
was created).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace

from confluent_kafka import TopicPartition

from antdt.bus.admin import partition_counts
from antdt.bus.clients import make_admin, make_consumer
from antdt.bus.markers import marker_id
from antdt.bus.readers import BEGINNING, assign_now, poll_batch
from antdt.bus.watch import Rewinder, shared_watch
from antdt.schemas.codec import make_codec
from antdt.schemas.models import (
    WORKER_ROLE,
    AckStatus,
    AssignmentStatus,
    CommandAck,
    CommandAction,
    MitigationCommand,
    ShardAssignment,
    StragglerVerdict,
    VerdictKind,
    WorkerMetrics,
)
from antdt.settings import Settings
from antdt.topics import topic_spec

FOLLOWED = (
    ("worker", "metrics"),
    ("monitor", "verdicts"),
    ("controller", "commands"),
    ("worker", "acks"),
    ("shard", "assignments"),
)


@dataclass
class Point:
    t: float
    samples_per_s: float
    batch_size: int
    samples: int


@dataclass
class Marker:
    t: float
    worker: str
    kind: str  # "verdict", "command" or "placement"
    label: str


@dataclass
class WorkerLane:
    points: list[Point] = field(default_factory=list)
    samples: int = 0
    batch_size: int = 0
    held: int = 0
    grants: list[float] = field(default_factory=list)  # when the sharder granted it shards
    verdict: str = ""
    compute_s: float = 0.0  # where the worker's time went, summed over its reports
    data_wait_s: float = 0.0
    sync_wait_s: float = 0.0

    @property
    def throughput(self) -> float:
        return self.points[-1].samples_per_s if self.points else 0.0


@dataclass
class CommandLine:
    t: float
    worker: str
    text: str
    acks: dict[str, int] = field(default_factory=dict)
    rejections: list[str] = field(default_factory=list)  # the reasons of REJECTED acks

    def acks_text(self, none: str = "-") -> str:
        """``applied 1, rejected 2``; ``none`` when no ack came yet."""
        return (
            ", ".join(f"{status.lower()} {count}" for status, count in sorted(self.acks.items()))
            or none
        )


def describe(command: MitigationCommand) -> str:
    """One short line: the action and its value."""
    value = {"ADJUST_BATCH_SIZE": command.batch_size, "SET_SHARD_QUOTA": command.shard_quota}.get(
        command.action.value
    )
    text = command.action.value + (f" {value}" if value is not None else "")
    if command.effective_step is not None:
        text += f" @step {command.effective_step}"
    return text + (" (dry run)" if command.dry_run else "")


class Timeline:
    """A live, thread-safe picture of one job's run."""

    def __init__(self, settings: Settings, job_id: str, workers: list[str]):
        self.settings, self.job_id = settings, job_id
        self.workers = {name: WorkerLane() for name in workers}
        self.markers: list[Marker] = []
        self.commands: list[CommandLine] = []
        self.verdicts = 0
        # nodes a MARK_NODE_DEGRADED named: the orchestrator avoids them
        self.degraded_nodes: set[str] = set()
        self.moves: list = []  # the orchestrator's placements (antdt.demo.placement.Move), in order
        self._commands_by_id: dict[str, CommandLine] = {}
        self._start = time.time()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._codec = make_codec(settings.schema_registry_url)
        self._thread = threading.Thread(target=self._follow, name="antdt-timeline", daemon=True)

    def set_start(self, start_wall: float) -> None:
        self._start = start_wall

    def now(self) -> float:
        """Seconds since the run's start signal."""
        return time.time() - self._start

    def start(self) -> Timeline:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def __enter__(self) -> Timeline:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @property
    def samples(self) -> int:
        with self._lock:
            return sum(track.samples for track in self.workers.values())

    def trained_after(self, worker: str, t: float) -> float | None:
        """When the worker first reported trained samples in a window ending after ``t`` (back after
        a kill)."""
        with self._lock:
            track = self.workers.get(worker)
            points = track.points if track else []
            return next((p.t for p in points if p.t > t and p.samples > 0), None)

    def granted_after(self, worker: str, t: float) -> float | None:
        """When the sharder first granted the worker shards after ``t``."""
        with self._lock:
            track = self.workers.get(worker)
            return min((g for g in (track.grants if track else []) if g > t), default=None)

    def add_move(self, move) -> None:
        """A placement the orchestrator made (:class:`antdt.demo.placement.Move`), as a marker on
        the process."""
        with self._lock:
            self.moves.append(move)
            self.markers.append(Marker(move.t, move.process, "placement", f"-> {move.target}"))

    def degraded(self) -> set[str]:
        with self._lock:
            return set(self.degraded_nodes)

    def snapshot(self) -> tuple[dict[str, WorkerLane], list[CommandLine]]:
        """Copies safe to render while the thread goes on."""
        with self._lock:
            tracks = {name: replace(t, points=list(t.points)) for name, t in self.workers.items()}
            return tracks, [
                replace(c, acks=dict(c.acks), rejections=list(c.rejections)) for c in self.commands
            ]

    # ------------------------------------------------------------ reading

    def _follow(self) -> None:
        consumer = make_consumer(self.settings, client_id="antdt-demo-timeline")
        names = [topic_spec(c, n).full_name(self.settings.topic_prefix) for c, n in FOLLOWED]
        counts = partition_counts(make_admin(self.settings), names)
        assign_now(
            consumer, [TopicPartition(t, p, BEGINNING) for t in names for p in range(counts[t])]
        )
        watch = shared_watch(self.settings)
        rewinder = Rewinder(consumer, watch)  # a restarted broker's topics start at offset 0 again
        try:
            while not self._stop.is_set():
                rewinder.check()
                for message in poll_batch(consumer, 500, 0.1):
                    if message.value() is None or marker_id(message) is not None:
                        continue
                    try:
                        record = self._codec.decode(message.value(), message.topic())
                    except Exception:  # noqa: BLE001 - the services dead-letter bad records; the view skips them
                        continue
                    if getattr(record, "job_id", None) == self.job_id:
                        with self._lock:
                            self._take(record)
        finally:
            consumer.close()
            watch.release()

    def _t(self, moment) -> float:
        return moment.timestamp() - self._start

    def _track(self, worker: str) -> WorkerLane:
        return self.workers.setdefault(worker, WorkerLane())

    def _take(self, record) -> None:
        if isinstance(record, WorkerMetrics):
            if record.role != WORKER_ROLE:
                # a parameter-server shard's steps are applied updates, counted by the workers
                # already
                return
            track = self._track(record.worker_id)
            span = (record.window_end - record.window_start).total_seconds()
            if span > 0:
                track.points.append(
                    Point(
                        self._t(record.window_end),
                        record.samples / span,
                        record.local_batch_size,
                        record.samples,
                    )
                )
            track.samples += record.samples
            track.batch_size = record.local_batch_size
            track.compute_s += record.compute.sum_s
            track.data_wait_s += record.data_wait_s
            track.sync_wait_s += record.sync_wait_s
        elif isinstance(record, StragglerVerdict):
            self.verdicts += 1
            label = (
                record.kind.value
                if record.kind is not VerdictKind.STRAGGLER
                else f"{record.classification.value} straggler"
            )
            self._track(record.worker_id).verdict = (
                "" if record.kind is VerdictKind.CLEARED else label
            )
            self.markers.append(
                Marker(
                    self._t(record.issued_at),
                    record.worker_id,
                    "verdict",
                    f"{label} x{record.speed_ratio:.1f}",
                )
            )
        elif isinstance(record, MitigationCommand):
            line = CommandLine(self._t(record.issued_at), record.target_worker, describe(record))
            self._commands_by_id[record.command_id] = line
            self.commands.append(line)
            self.markers.append(Marker(line.t, record.target_worker, "command", line.text))
            if (
                record.action is CommandAction.MARK_NODE_DEGRADED
                and not record.dry_run
                and record.parameters.get("node")
            ):
                self.degraded_nodes.add(record.parameters["node"])
        elif isinstance(record, CommandAck):
            line = self._commands_by_id.get(record.command_id)
            if line is not None and record.status is not AckStatus.SCHEDULED:
                line.acks[record.status.value] = line.acks.get(record.status.value, 0) + 1
                if record.status is AckStatus.REJECTED:
                    line.rejections.append(record.reason or "no reason given")
        elif isinstance(record, ShardAssignment):
            track = self._track(record.worker_id)
            track.held = len(record.shards) if record.status is AssignmentStatus.GRANTED else 0
            if record.status is AssignmentStatus.GRANTED and record.shards:
                track.grants.append(self._t(record.timestamp))
