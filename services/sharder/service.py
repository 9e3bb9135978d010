"""``antdt sharder``: the stateful dynamic data sharding service.

One loop, one thread. Each cycle it

1. consumes a batch of worker reports (``shard.progress``) and lifecycle
   events (``worker.lifecycle``; LEFT releases a worker's shards) in a
   consumer group, so several instances split the jobs between them;
2. for a job seen for the first time, recovers it (snapshot + log) and takes
   it over with a higher writer epoch (:mod:`recovery`); a job whose
   partition a rebalance gives straight back keeps its state as it was;
3. lets the pure core decide, and reclaims expired leases;
4. appends the resulting events to ``shard.log`` and waits until they are
   durable, and only then publishes the assignments (keyed
   ``<job>/<worker>``; each worker reads its own partition). A grant is
   never visible before it is in the log, so a crash cannot hand out a shard
   the recovered state does not know about;
5. snapshots a job every N events or T seconds (built and written off the
   loop, :mod:`snapshots`), and commits the input offsets. Input is
   at-least-once: a redelivered report is harmless because reports name the
   grant they are about (see :mod:`core`).

It is ready (``/readyz``) once it has handled the input that was waiting
when its partitions were assigned (:mod:`antdt.bus.backlog`): every job with
a report in it is taken over and answered by then. Until its first
assignment, and after one that brings a backlog, it is not.

If the bus comes back empty (an embedded broker restarted, see
:mod:`antdt.bus.watch`), this instance's memory is the only copy of its
jobs' state: it writes a snapshot of each job, including those whose
partitions it lost within the last minute (the reset itself revokes them),
into the new snapshot topic, and reads its input again from the beginning.
The log then continues after the snapshot; recovery and the audit start from
it (a log that does not begin at seq 1 is audited from the first snapshot).
The reset revokes every partition; a job of ours whose partition comes back
is taken over from the state we hold, not read back from the new log.

A record that does not decode, is not a report, is not keyed by its job id,
or that the core rejects (e.g. a shard id beyond the dataset, a dataset that
contradicts the job's) goes to the dead-letter topic and is counted. A record
whose processing fails unexpectedly goes there too, and its job is recovered
from the log on the next report: one bad record never stops the service.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Literal

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Message

from antdt.bus.admin import ensure_topics
from antdt.bus.backlog import Backlog
from antdt.bus.clients import drain, flush_or_raise, make_admin, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.murmur2 import partition_for
from antdt.bus.readers import MisroutedRecord, check_key, decode_or_deadletter, poll_batch
from antdt.bus.watch import (
    TOPICS_BACK_WITHIN_S,
    Record,
    Rewinder,
    deliver_through_reset,
    produce_or_refused,
    refresh_metadata,
    shared_watch,
)
from antdt.errors import BusError
from antdt.runtime.memory import FreeMemoryRelease, HeapFreeze
from antdt.runtime.service_loop import LoopService
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import (
    LifecycleEvent,
    ProgressKind,
    ShardAssignment,
    ShardLogEvent,
    ShardProgress,
    WorkerLifecycle,
)
from antdt.services.sharder import metrics
from antdt.services.sharder.core import CoreConfig, ProgressRejected, ShardCore
from antdt.services.sharder.eventlog import (
    LogReads,
    LogWriter,
    MarkerReader,
    log_topic,
    snapshot_topic,
)
from antdt.services.sharder.recovery import Recovered, held_state, take_over
from antdt.services.sharder.snapshots import SnapshotWriter
from antdt.services.sharder.state import Captured, JobState, state_at
from antdt.settings import Settings
from antdt.topics import topic_spec, worker_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SharderConfig:
    """Service knobs (the dataset itself comes from the workers)."""

    default_quota: int = 2
    snapshot_every_events: int = 10_000
    snapshot_every_s: float = 30.0
    lease_check_every_s: float = 0.2
    #: How often the memory malloc keeps free goes back to the system (:mod:`antdt.runtime.memory`;
    #: also at once after a bus reset's burst).
    release_memory_every_s: float = 60.0
    #: How often the live objects are frozen out of the collector's full passes (None: never), and
    #: how often they are all thawed and collected once (:class:`antdt.runtime.memory.HeapFreeze`).
    #: The collector is the process's: ``antdt sharder`` freezes, a sharder sharing its process
    #: (a test's) leaves it alone.
    freeze_heap_every_s: float | None = None
    thaw_heap_every_s: float = 600.0
    batch_size: int = 2000
    poll_timeout_s: float = 0.05
    use_snapshots: bool = True
    #: Where periodic snapshots are built and encoded: a process of their own keeps the loop's
    #: interpreter free.
    snapshot_builder: Literal["thread", "process"] = "process"


#: The sharder's producers, unlingered. lz4: snapshots of large datasets are big but repetitive
#: (a 100k-shard snapshot is ~1.5 MB raw, a few hundred kB compressed, under Kafka's 1 MB default).
LARGE_RECORDS = {"linger.ms": 0, "compression.type": "lz4", "message.max.bytes": 64 << 20}

#: How soon the state is written again when writing it after a bus reset failed.
RETRY_STATE_EVERY_S = 0.5
#: How long the state of a job whose partition was revoked is kept, should the bus turn out to have
#: been reset.
KEEP_REVOKED_S = 60.0


@dataclass
class JobRuntime:
    """A job this instance writes for."""

    core: ShardCore
    events_since_snapshot: int = 0
    last_snapshot_at: float = field(default_factory=time.monotonic)


def wall_ms() -> int:
    return int(time.time() * 1000)


class SharderService(LoopService):
    """Consumes reports, decides, logs, answers. See the module docstring."""

    def __init__(
        self, settings: Settings, config: SharderConfig | None = None, writer_id: str | None = None
    ):
        self.settings = settings
        self.config = config or SharderConfig()
        self.writer_id = (
            writer_id or f"sharder-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.codec: Codec = make_codec(settings.schema_registry_url)
        self.jobs: dict[str, JobRuntime] = {}
        self.ready = threading.Event()
        self._core_config = CoreConfig(default_quota=self.config.default_quota)
        self._producer = make_producer(settings, client_id=self.writer_id, **LARGE_RECORDS)
        self._log = LogWriter(self._producer, log_topic(settings), self.codec)
        # Snapshots and answers have producers of their own: the flush of the log before every batch
        # of answers waits for the log's records only, not for a snapshot of megabytes nor for the
        # last batch's answers.
        self._snapshot_producer = make_producer(
            settings, client_id=f"{self.writer_id}-snapshots", **LARGE_RECORDS
        )
        self._answer_producer = make_producer(
            settings, client_id=f"{self.writer_id}-answers", **LARGE_RECORDS
        )
        self._snapshots = SnapshotWriter(
            self._snapshot_producer,
            snapshot_topic(settings),
            self.codec,
            builder=self.config.snapshot_builder,
            registry_url=settings.schema_registry_url,
        )
        self._deadletter = DeadLetter.for_settings(
            self._producer, settings, "sharder", counter=metrics.DEADLETTERED
        )
        self._progress_topic = topic_spec("shard", "progress").full_name(settings.topic_prefix)
        self._lifecycle_topic = topic_spec("worker", "lifecycle").full_name(settings.topic_prefix)
        self._assignments_topic = topic_spec("shard", "assignments").full_name(
            settings.topic_prefix
        )
        self._consumer = None
        self._progress_partitions = 1
        self._last_lease_check = 0.0
        self._watch = None
        #: the take-overs' reads up to a marker; through one kept reader once started
        self._reads = LogReads(settings, self.codec, self._producer)
        self._rewinder: Rewinder | None = None
        self._revoked: dict[str, tuple[JobRuntime, float]] = {}
        #: Jobs whose state this instance wrote into the bus at its last reset: its memory of
        #: each is the fold of the new log up to its last offset there (see _held_since_reset)
        self._written_again: set[str] = set()
        # the input waiting when the partitions were assigned: its jobs are taken over once handled
        self._backlog = Backlog()
        # progress partitions given up in the rebalance under way
        self._just_revoked: set[int] = set()
        # the latest incarnation that reported, per worker
        self._incarnations: dict[tuple[str, str], str] = {}
        self._free_memory = FreeMemoryRelease(self.config.release_memory_every_s)
        self._heap = (
            HeapFreeze(self.config.freeze_heap_every_s, self.config.thaw_heap_every_s)
            if self.config.freeze_heap_every_s is not None
            else None
        )

    # ------------------------------------------------------------ lifecycle

    def start(self) -> SharderService:
        """Create the topics and join the consumer group."""
        counts = ensure_topics(make_admin(self.settings), self.settings)
        # Known now, while the topic exists: a revocation may come when it does not (a bus reset).
        self._progress_partitions = counts[self._progress_topic]
        self._consumer = make_consumer(
            self.settings,
            group_id=self.settings.group("sharder"),
            client_id=self.writer_id,
            pace=FetchPace.STEADY,  # requests come a shard ahead: no need to poll hard
        )
        self._consumer.subscribe(
            [self._progress_topic, self._lifecycle_topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._watch = shared_watch(self.settings, look_now=True)
        reader = MarkerReader(self.settings, self._watch).connect(
            [log_topic(self.settings), snapshot_topic(self.settings)]
        )
        self._reads = replace(self._reads, reader=reader)
        self._rewinder = Rewinder(self._consumer, self._watch, group=True)
        return self  # ready once its partitions' backlog is handled (:meth:`_ready_if_caught_up`)

    def close(self) -> None:
        if self._heap is not None:
            self._heap.close()
        self._snapshots.close()
        drain(self._snapshot_producer)
        drain(self._answer_producer)
        self._close_clients()
        if self._reads.reader is not None:
            self._reads.reader.close()
        if self._watch is not None:
            self._watch.release()
            self._watch = None

    def _on_revoke(self, consumer, partitions) -> None:
        """Partitions moved to another instance: it takes their jobs over, we stop writing for them.

        Their state is kept aside for a while: if the revocation came from a
        bus reset, it is the only copy left (see :meth:`_republish`).
        """
        self._backlog.revoked(partitions)
        lost = {p.partition for p in partitions if p.topic == self._progress_topic}
        self._just_revoked |= lost
        now = time.monotonic()
        for job_id in [j for j in self.jobs if partition_for(j, self._progress_partitions) in lost]:
            self._revoked[job_id] = (self.jobs.pop(job_id), now)
        for job_id in [j for j, (_, at) in self._revoked.items() if now - at > KEEP_REVOKED_S]:
            del self._revoked[job_id]
        metrics.JOBS.set(len(self.jobs))

    def _on_assign(self, consumer, partitions) -> None:
        """Jobs of partitions given back in the same rebalance stay ours as they were: nobody wrote
        for them between."""
        back = {
            p.partition for p in partitions if p.topic == self._progress_topic
        } & self._just_revoked
        self._just_revoked = set()
        for job_id in [
            j for j in self._revoked if partition_for(j, self._progress_partitions) in back
        ]:
            self.jobs[job_id] = self._revoked.pop(job_id)[0]
        metrics.JOBS.set(len(self.jobs))
        self._backlog.assigned(consumer, partitions)
        if not self._backlog.caught_up:
            self.ready.clear()  # jobs with reports waiting are not taken over yet
        self._ready_if_caught_up()

    def _on_lost(self, consumer, partitions) -> None:
        """Partitions lost without a rebalance (our session expired): another instance may have
        written for them."""
        self._on_revoke(consumer, partitions)
        self._just_revoked = set()

    # ------------------------------------------------------------ bus reset

    def _after_bus_reset(self, between_batches: bool = False) -> list[Message]:
        """If the bus was reset since the last look: input from the beginning, state
        re-published. Between batches, a revocation the reset left pending is served first
        (:meth:`_serve_revocation`), and what that poll returned is this batch's; within one,
        no poll may take partitions from under it."""
        polled: list[Message] = []
        if self._rewinder is not None and self._rewinder.check():
            if between_batches:
                polled = self._serve_revocation()
            self._republish()
            self._free_memory.now()  # the state built again and the input read again: a burst
        return polled

    def _housekeeping(self) -> None:
        """Between batches: malloc's free pages handed back every ``release_memory_every_s``, and
        the live heap frozen out of the collector's full passes (``antdt sharder`` only)."""
        self._free_memory.due()
        if self._heap is not None:
            self._heap.due()

    def _serve_revocation(self) -> list[Message]:
        """Poll once without waiting: a revocation the reset left pending is served now, so the
        group's new join (which the embedded broker holds for half the session, 1 s) runs while
        the state is written again, not after it. Returns what the poll read."""
        return poll_batch(self._consumer, self.config.batch_size, 0)

    def _republish(self) -> None:
        """Snapshot every job we write for, or did a moment ago, into the empty bus.

        Each snapshot covers the job's recent events written again before it
        (``log_offset``: the last of them), so a take-over after the reset
        reads only what follows. Readers skip by seq the events a snapshot
        already holds that reach the new log after it (appends the reset caught,
        retried by the producer).
        """
        self._snapshots.discard_pending()
        # the generation moves before the topics are back: what follows is the only copy of the
        # state, not to be written into topics that are not there yet
        if not self._watch.wait_restored(TOPICS_BACK_WITHIN_S):
            log.error("the topics are not back %.0f s after the bus reset", TOPICS_BACK_WITHIN_S)
        kept = {job_id: runtime for job_id, (runtime, _) in self._revoked.items()}
        jobs = {**kept, **self.jobs}
        deadline = time.monotonic() + TOPICS_BACK_WITHIN_S
        while True:
            try:
                self._write_state_again(jobs)
                break
            except BusError as exc:
                # a producer whose metadata still lags the new topics ('Unknown partition'):
                # exiting now would lose the only copy of the state
                if time.monotonic() > deadline:
                    raise
                log.warning("writing the state again after the bus reset: %s; once more", exc)
                time.sleep(RETRY_STATE_EVERY_S)
        metrics.BUS_RESETS.inc()
        log.warning(
            "the bus was reset: re-published the state of %d job(s); "
            "reading the input again from the beginning",
            len(self.jobs) + len(kept),
        )

    def _write_state_again(self, jobs: dict) -> None:
        """Into the new topics: each job's recent events (log followers that were a moment behind
        find what they missed), then its snapshot covering them; durable on return (BusError if
        not). A snapshot covering nothing (the log's beginning) made the take-over after a roll
        read all of them again: 1.2 s at the soak's 20,000, while every worker's request waited."""
        self._log.start_over()
        self._written_again = set()
        for producer in (self._producer, self._snapshot_producer, self._answer_producer):
            refresh_metadata(producer)
        self._log.append_recent(jobs)
        self._log.flush()  # the offsets of the events written again, for the snapshots
        for job_id, runtime in jobs.items():
            written = runtime.core.state.dataset is None or self._write_snapshot(
                runtime, log_offset=self._log.last_offset.get(job_id)
            )
            if not written:  # refused (a topic not back yet): the caller writes it all again
                raise BusError(f"job {job_id}'s snapshot was not written into the new bus")
        flush_or_raise(self._snapshot_producer)
        self._written_again = set(jobs)

    # ------------------------------------------------------------ one cycle

    def step(self) -> int:
        """Process one batch of input; returns how many records it consumed."""
        self._housekeeping()
        messages = self._after_bus_reset(between_batches=True) or poll_batch(
            self._consumer, self.config.batch_size, self.config.poll_timeout_s
        )
        started = time.perf_counter()
        now_ms = wall_ms()
        events: list[ShardLogEvent] = []
        answers: list[ShardAssignment] = []
        for message in messages:
            self._handle(message, now_ms, events, answers)
        self._backlog.handled(messages)
        if time.monotonic() - self._last_lease_check >= self.config.lease_check_every_s:
            self._last_lease_check = time.monotonic()
            for runtime in self.jobs.values():
                events += runtime.core.expire_leases(now_ms)
        self._commit(events, answers, now_ms, bool(messages))
        self._ready_if_caught_up()  # after the answers: the backlog's requests are answered
        if messages or events:
            metrics.BATCH_SECONDS.observe(time.perf_counter() - started)
        return len(messages)

    def _ready_if_caught_up(self) -> None:
        """Ready once the input waiting at the assignment is handled: every job with a report in it
        taken over (recovered from the log, a new writer epoch appended) and answered."""
        if not self.ready.is_set() and self._backlog.caught_up:
            self.ready.set()
            log.info("ready: the assigned input's backlog handled, %d job(s) held", len(self.jobs))

    def _handle(self, message: Message, now_ms: int, events: list, answers: list) -> None:
        value = decode_or_deadletter(
            message, self.codec, self._deadletter, expected=(ShardProgress, WorkerLifecycle)
        )
        if value is None:
            return
        try:
            # the key decides which instance writes for the job
            check_key(message.key(), value.job_id)
            if isinstance(value, ShardProgress):
                self._on_report(value, now_ms, events, answers)
            else:
                self._on_lifecycle(value, now_ms, events)
        except (ProgressRejected, MisroutedRecord) as exc:
            self._deadletter.send(SourceRecord.from_confluent(message), exc)
            self._refuse_waited(value, exc, now_ms, answers)
        except (BusError, KafkaException):
            raise  # the bus failed, not the record: stop, and recover from the log on restart
        # a bug must cost one record, not the service (nor a crash loop on redelivery)
        except Exception as exc:
            log.exception(
                "processing failed for %s[%d]@%d",
                message.topic(),
                message.partition(),
                message.offset(),
            )
            self._deadletter.send(SourceRecord.from_confluent(message), exc)
            self._forget_job(value.job_id)

    def _refuse_waited(self, value, exc: Exception, now_ms: int, answers: list) -> None:
        """A rejected report that someone waits for is answered REFUSED, with the reason: a
        REWIND (the process restoring ends, its job's state is lost, instead of waiting for a
        REWOUND that will never come) and a REQUESTED (a worker whose dataset disagrees with the
        job's ends with why, instead of hearing nothing until its sharder timeout)."""
        waited = (ProgressKind.REWIND, ProgressKind.REQUESTED)
        if not isinstance(value, ShardProgress) or value.kind not in waited:
            return
        runtime = self.jobs.get(value.job_id)
        if runtime is not None and isinstance(exc, ProgressRejected):
            answers.append(runtime.core.refusal(value, now_ms, str(exc)))

    def _forget_job(self, job_id: str) -> None:
        """Drop a job whose decision failed half-way: its state may hold events the log does not.

        The next report recovers it from the log (the source of truth) and
        takes it over with a higher writer epoch.
        """
        if self.jobs.pop(job_id, None) is not None:
            metrics.JOBS.set(len(self.jobs))

    def _on_report(self, report: ShardProgress, now_ms: int, events: list, answers: list) -> None:
        metrics.REPORTS.labels(report.kind.value).inc()
        self._incarnations[(report.job_id, report.worker_id)] = report.incarnation
        runtime = self._job(report.job_id, now_ms, events)
        if report.kind is ProgressKind.REWIND:
            outcome = runtime.core.rewind(
                report, now_ms, self._target_for_rewind(runtime, report, events)
            )
        else:
            outcome = runtime.core.on_progress(report, now_ms)
        events += outcome.events
        runtime.events_since_snapshot += len(outcome.events)
        if outcome.assignment is not None:
            answers.append(outcome.assignment)

    def _on_lifecycle(self, event: WorkerLifecycle, now_ms: int, events: list) -> None:
        """LEFT returns the worker's shards, unless a newer incarnation of it has reported since.

        (The farewell of a process that was replaced can arrive late: lifecycle
        and progress are different topics. Releasing then would take the
        shards its successor is training.)
        """
        if event.event is not LifecycleEvent.LEFT or event.job_id not in self.jobs:
            return
        latest = self._incarnations.get((event.job_id, event.worker_id))
        if latest is not None and latest != event.incarnation:
            return
        runtime = self.jobs[event.job_id]
        released = runtime.core.worker_left(event.worker_id, now_ms, event.reason or "worker left")
        events += released
        runtime.events_since_snapshot += len(released)

    def _job(self, job_id: str, now_ms: int, pending: list) -> JobRuntime:
        """The job's runtime, recovering and taking it over on first sight."""
        runtime = self.jobs.get(job_id)
        if runtime is not None:
            return runtime
        self._flush_log(pending)  # recovery reads the log: everything decided so far must be in it
        if job_id in self._revoked and self._watch is not None:
            # Back on a job we just lost: if a bus reset took it away, the log holds nothing
            # of it yet; learn that now, and re-publish the kept state before recovering.
            self._watch.check_now()
            self._after_bus_reset()
        held = self._held_since_reset(job_id)
        self._revoked.pop(job_id, None)
        with metrics.RECOVERY_SECONDS.time():
            core, recovered = take_over(
                self._reads,
                job_id,
                self._log,
                self.writer_id,
                self._core_config,
                now_ms,
                self.config.use_snapshots,
                known=held,
            )
        log.info(
            "took over job %s as writer epoch %d (%d events replayed, snapshot: %s, %.3f s)",
            job_id,
            core.state.writer_epoch,
            recovered.events_replayed,
            recovered.from_snapshot,
            recovered.seconds,
        )
        runtime = self.jobs[job_id] = JobRuntime(core)
        completed = core.complete_applied(now_ms)  # a DONE the last writer did not get to write
        pending += completed
        runtime.events_since_snapshot += len(completed)
        metrics.JOBS.set(len(self.jobs))
        return runtime

    def _held_since_reset(self, job_id: str) -> Recovered | None:
        """The state of a job we wrote into the bus at its reset and lost since (the reset revokes
        every partition), as a take-over's base: the new log holds that state and, after it, only
        what our flushes put there or another writer did, which the take-over folds in. Reading
        it back instead (the re-published snapshot, 2 million samples in the soak) took 0.7 s of
        every roll, with every worker's request waiting."""
        kept = self._revoked.get(job_id)
        last_offset = self._log.last_offset.get(job_id)
        if kept is None or job_id not in self._written_again or last_offset is None:
            return None
        return held_state(kept[0].core.state, last_offset)

    def _target_for_rewind(
        self, runtime: JobRuntime, report: ShardProgress, pending: list
    ) -> JobState | None:
        """The job's state at the version, when a rewind crosses an epoch boundary: the newest
        snapshot at or before it and the log after that snapshot (after a bus reset the log starts
        at the snapshot the sharder re-published)."""
        state = runtime.core.state
        if (
            report.version is None
            or report.version >= state.epoch_opened_seq
            or report.version > state.last_seq
        ):
            return None
        self._flush_log(pending)
        snapshot = self._reads.snapshot_at_or_before(state.job_id, report.version)
        start = OFFSET_BEGINNING
        if snapshot is not None and snapshot.log_offset is not None:
            start = snapshot.log_offset + 1
        events = self._reads.job_log(state.job_id, start)
        return state_at(state.job_id, report.version, (event for _, event in events), snapshot)

    def _flush_log(self, pending: list) -> None:
        if pending:
            self._log.append(pending)
            self._count_events(pending)
            pending.clear()
        try:
            self._log.flush()
        except BusError:
            if not self._state_again_if_reset("the shard log's appends"):
                raise

    def _state_again_if_reset(self, failed: str) -> bool:
        """Whether what ``failed`` met a bus reset (it went to topics that no longer exist); if
        so the state, every event decided so far in it, is written again now. Exiting instead
        would lose the only copy of the state with the bus's."""
        if self._watch is None or self._rewinder is None:
            return False
        self._watch.check_now()
        if not self._rewinder.check():
            return False
        log.warning("%s failed with a bus reset: writing the state again", failed)
        self._republish()
        return True

    # ------------------------------------------------------------ output

    def _commit(self, events: list, answers: list, now_ms: int, consumed: bool) -> None:
        self._flush_log(events)
        self._publish(answers)
        self._answer_producer.poll(0)
        self._producer.poll(0)
        self._snapshot_due()
        if consumed:
            try:
                self._consumer.commit(asynchronous=True)
            except KafkaException as exc:  # nothing to commit, or a rebalance in progress
                log.debug("commit skipped: %s", exc)

    def _publish(self, answers: list) -> None:
        """Hand the answers to the producer. One it refuses because a bus reset took the topic
        (its metadata saw the topic gone before the watch made it again) is sent once the state
        is written into the new bus and the topic is back, so no grant is seen before its event
        is in the log. Raising instead ended a soak's sharder at a roll, with the only copy of
        the state."""
        refused: list[Record] = []
        for answer in answers:
            topic = self._assignments_topic
            key = worker_key(answer.job_id, answer.worker_id).encode()
            value = self.codec.encode(answer, topic)
            error = produce_or_refused(self._answer_producer, topic, key=key, value=value)
            if error is not None:
                if self._watch is None:  # no watch to make the topic again
                    raise KafkaException(error)
                refused.append((topic, key, value))
            metrics.ASSIGNMENTS.labels(answer.status.value).inc()
        if refused:
            self._state_again_if_reset("publishing the answers")
            deliver_through_reset(self._answer_producer, self._watch, refused)

    def _count_events(self, events: list) -> None:
        for transition, count in Counter(event.transition for event in events).items():
            metrics.EVENTS.labels(transition.value).inc(count)

    def _snapshot_due(self) -> None:
        """Snapshot every max(N, 2 x shards) events or T seconds.

        A snapshot costs time in proportion to the number of shards, so for
        large datasets the event interval grows with it: the snapshot cost per
        event stays bounded, and recovery replays at most that many events.
        """
        now = time.monotonic()
        for job_id, runtime in self.jobs.items():
            dataset = runtime.core.state.dataset
            every = (
                max(self.config.snapshot_every_events, 2 * dataset.shard_count)
                if dataset
                else self.config.snapshot_every_events
            )
            by_count = runtime.events_since_snapshot >= every
            by_time = (
                runtime.events_since_snapshot
                and now - runtime.last_snapshot_at >= self.config.snapshot_every_s
            )
            if (by_count or by_time) and runtime.core.state.dataset is not None:
                self._snapshots.submit(self._capture(runtime), self._log.last_offset.get(job_id))

    def snapshot(self, job_id: str) -> bool:
        """Write a snapshot of the job covering everything appended so far, now; False if it was not
        written."""
        return self._write_snapshot(self.jobs[job_id], log_offset=self._log.last_offset.get(job_id))

    def _write_snapshot(self, runtime: JobRuntime, log_offset: int | None) -> bool:
        return self._snapshots.write_now(self._capture(runtime), log_offset)

    @staticmethod
    def _capture(runtime: JobRuntime) -> Captured:
        """The job's state to snapshot; the snapshot clock starts again."""
        runtime.events_since_snapshot, runtime.last_snapshot_at = 0, time.monotonic()
        return runtime.core.state.capture()
