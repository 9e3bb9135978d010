"""The sharder's Kafka side of event sourcing: append to the log, read it back.

* :class:`LogWriter` appends a job's events to ``shard.log`` (keyed by job, so
  one job's events are totally ordered in one partition) and learns the
  offset of each from the delivery reports; snapshots record the offset they
  cover so recovery can seek straight past it. It keeps each job's last
  events, to write them again into a log that a bus reset emptied: readers
  that follow the log closely (parameter servers) then miss nothing, and skip
  what they had by its seq.
* :class:`LogReads` reads one job's events from an offset up to a marker it
  writes first (never trusting the high watermark, which the embedded broker
  reports wrong), and finds its snapshots the same way (the newest decoding
  only the winner).
* :class:`MarkerReader` is the one consumer a sharder keeps for these reads,
  connected between them (a fresh one per read cost most of a job's take-over).

Every log record carries its writer epoch in a header, so a sharder can
notice that a newer writer took over without decoding anything.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer

from antdt.bus.clients import consuming, make_consumer
from antdt.bus.config import FetchPace
from antdt.bus.readers import follow_key, key_partition
from antdt.bus.watch import BusWatch, produce_or_refused
from antdt.errors import BusError
from antdt.schemas.codec import Codec
from antdt.schemas.models import ShardLogEvent, ShardSnapshot
from antdt.settings import Settings
from antdt.topics import topic_spec

WRITER_HEADER = "antdt.writer-epoch"
READ_TIMEOUT_S = 60.0
RECOVERY_CLIENT = "antdt-sharder-recovery"
#: How much of each job's log is kept to be written again after a bus reset.
RECENT_S = 60.0
RECENT_MAX = 20_000


def log_topic(settings: Settings) -> str:
    return topic_spec("shard", "log").full_name(settings.topic_prefix)


def snapshot_topic(settings: Settings) -> str:
    return topic_spec("shard", "snapshots").full_name(settings.topic_prefix)


class _Record(NamedTuple):
    """One appended event as produced (kept to be written again after a bus reset)."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    timestamp: int


class LogWriter:
    """Appends events to the shard log; remembers the last offset written per job."""

    def __init__(self, producer: Producer, topic: str, codec: Codec):
        self._producer = producer
        self._topic = topic
        self._codec = codec
        self._errors: list[str] = []
        self.last_offset: dict[str, int] = {}
        self._recent: dict[str, deque[tuple[float, _Record]]] = {}
        #: Bus resets this writer has started over after (:meth:`start_over`): a delivery report
        #: of an append made before the last one is not this log's to fail on.
        self.generation = 0

    def start_over(self) -> None:
        """A bus reset emptied the log, and the state it held is being written again (snapshots):
        what was appended before, delivered or failed, no longer counts. Without this, the
        delivery failures of the appends caught in the reset ('Unknown partition') failed the
        flush that wrote the state again, and the sharder exited with the only copy of it."""
        self.generation += 1
        self._errors.clear()
        self.last_offset.clear()

    def append(self, events: list[ShardLogEvent]) -> None:
        now = time.monotonic()
        for event in events:
            record = _Record(
                key=event.job_id.encode(),
                value=self._codec.encode(event, self._topic),
                headers=[(WRITER_HEADER, str(event.writer_epoch).encode())],
                # replay by time sees transition times
                timestamp=int(event.timestamp.timestamp() * 1000),
            )
            kept = self._recent.setdefault(event.job_id, deque(maxlen=RECENT_MAX))
            kept.append((now, record))
            self._produce(record)

    def _produce(self, record: _Record) -> None:
        """One append; one a bus reset's missing topic refuses fails as a failed delivery would:
        :meth:`flush` raises, and the sharder writes its state (this record included, it is kept)
        into the new log, where raising here ended it with the only copy of that state."""
        refused = produce_or_refused(
            self._producer,
            self._topic,
            key=record.key,
            value=record.value,
            headers=record.headers,
            on_delivery=self._report_for(self.generation),
            timestamp=record.timestamp,
        )
        if refused is not None:
            self._errors.append(refused.str())

    def _report_for(self, generation: int):
        """The delivery callback of an append made in ``generation``."""
        return lambda error, message: self._delivered(generation, error, message)

    def _delivered(self, generation: int, error: KafkaError | None, message: Message) -> None:
        if generation != self.generation:
            return  # appended before a reset the log started over after
        if error is not None:
            self._errors.append(error.str())
            return
        job = message.key().decode()
        self.last_offset[job] = max(self.last_offset.get(job, -1), message.offset())

    def append_recent(self, jobs) -> int:
        """Write the kept records of ``jobs`` again (into a log a bus reset emptied); how many.
        They are kept encoded: encoding them again took most of the 0.8-1.2 s this cost at
        20,000 records, while the workers' requests wait for it."""
        since = time.monotonic() - RECENT_S
        again = [record for job in jobs for at, record in self._recent.get(job, ()) if at >= since]
        for record in again:
            self._produce(record)
        return len(again)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until everything appended is durable; BusError if any of it failed."""
        remaining = self._producer.undelivered_after_flush(timeout_s)
        if remaining or self._errors:
            errors, self._errors = self._errors, []
            raise BusError(
                f"shard log append failed: {remaining} undelivered, errors: {errors[:3]}"
            )


def job_partition(settings: Settings, topic: str, job_id: str) -> int:
    """The partition a job's records live in."""
    return key_partition(settings, topic, job_id)


class MarkerReader:
    """The consumer a sharder keeps for its reads up to a marker, one read at a time.

    A take-over reads three times (the snapshot, the log, the log past its
    election) while the worker whose request made it waits, and a fresh
    consumer's first fetch waits for its second connection (librdkafka drops
    the bootstrap connection once metadata names the broker:
    ``EMBEDDED_RECONNECT`` in :mod:`antdt.bus.config`): a new job's take-over
    took 39 ms on a running sharder, 79 ms for the first job after it started
    (the embedded broker, docs/torchrun.md). This one stays connected between
    reads and holds no partition then, so it fetches nothing; it reads at the
    low-latency pace (a caller waits), and is made again after a bus reset
    (``watch``). A read while another is under way (one abandoned unfinished,
    say) gets a fresh consumer, as without a reader.
    """

    def __init__(self, settings: Settings, watch: BusWatch | None = None):
        self._settings, self._watch = settings, watch
        self._consumer: Consumer | None = None
        self._generation = 0  # the bus generation the consumer was made in (set with it)
        self._busy = threading.Lock()

    def read(
        self, topic: str, key: bytes, start: int, producer: Producer, timeout_s: float
    ) -> Iterator[Message]:
        """Every record with ``key`` in its partition from ``start`` up to a fresh marker."""
        if not self._busy.acquire(blocking=False):
            yield from _read_fresh(self._settings, topic, key, start, producer, timeout_s)
            return
        try:
            consumer = self._connected()
            try:
                yield from follow_key(
                    self._settings, consumer, producer, topic, key, start, timeout_s
                )
            finally:
                consumer.unassign()  # between reads it fetches nothing
        finally:
            self._busy.release()

    def connect(self, topics: list[str]) -> MarkerReader:
        """Make the consumer and learn ``topics``' metadata now, at the service's start, not in
        the first take-over (whose reads took 30, 17 and 4 ms, the first one connecting)."""
        consumer = self._connected()
        for topic in topics:
            key_partition(self._settings, topic, b"")  # the partition count, kept
            consumer.list_topics(topic, timeout=READ_TIMEOUT_S)
        return self

    def _connected(self) -> Consumer:
        """The kept consumer, made anew after a bus reset (a reset broker forgets its metadata)."""
        generation = self._watch.generation if self._watch is not None else 0
        if self._consumer is not None and generation != self._generation:
            self._consumer.close()
            self._consumer = None
        if self._consumer is None:
            self._consumer = make_consumer(
                self._settings, client_id=RECOVERY_CLIENT, pace=FetchPace.LOW_LATENCY
            )
            self._generation = generation
        return self._consumer

    def close(self) -> None:
        with self._busy:
            if self._consumer is not None:
                self._consumer.close()
                self._consumer = None


def read_until_marker(
    settings: Settings,
    topic: str,
    key: bytes,
    start: int,
    producer: Producer,
    timeout_s: float = READ_TIMEOUT_S,
    reader: MarkerReader | None = None,
) -> Iterator[Message]:
    """Every record with ``key`` in its partition from ``start`` up to a fresh marker; through
    ``reader`` where the caller keeps one, else a consumer of its own."""
    if reader is not None:
        yield from reader.read(topic, key, start, producer, timeout_s)
    else:
        yield from _read_fresh(settings, topic, key, start, producer, timeout_s)


def _read_fresh(
    settings: Settings, topic: str, key: bytes, start: int, producer: Producer, timeout_s: float
) -> Iterator[Message]:
    with consuming(settings, client_id=RECOVERY_CLIENT) as consumer:
        yield from follow_key(settings, consumer, producer, topic, key, start, timeout_s)


def lacks_beginning(events: list[ShardLogEvent]) -> bool:
    """True if the log does not start at seq 1: the bus was reset, or retention deleted its start.

    After a reset the new log may hold the old one's last minute again (the
    sharder writes it back for log followers), seq 1 included, but behind
    events a producer retried into it first: only a log whose first record is
    seq 1 is whole.
    """
    return bool(events) and events[0].seq > 1


@dataclass(frozen=True)
class LogReads:
    """A sharder's reads of the shard log and its snapshots, one job at a time, each up to a
    marker it writes first.

    What every read needs, given once: the settings (the topics' names and
    partitions), the codec, the producer that writes each read's closing
    marker, and the consumer the caller keeps for them (``reader``; None: a
    consumer of its own per read).
    """

    settings: Settings
    codec: Codec
    producer: Producer
    reader: MarkerReader | None = None

    def job_log(
        self, job_id: str, start: int = OFFSET_BEGINNING
    ) -> Iterator[tuple[int, ShardLogEvent]]:
        """``(offset, event)`` for every event of the job from ``start`` to now."""
        topic = log_topic(self.settings)
        for message in self._marked(topic, job_id, start):
            yield message.offset(), self.codec.decode(message.value(), topic)

    def earliest_snapshot(self, job_id: str) -> ShardSnapshot | None:
        """The oldest snapshot of the job still on the bus, or None: where an audit of a log that
        lost its beginning starts."""
        for message in self._snapshots(job_id):
            return self.codec.decode(message.value())
        return None

    def latest_snapshot(self, job_id: str) -> ShardSnapshot | None:
        """The newest snapshot of the job, or None (only the winner is decoded)."""
        newest = None
        for message in self._snapshots(job_id):
            newest = message
        return None if newest is None else self.codec.decode(newest.value())

    def snapshot_at_or_before(self, job_id: str, seq: int) -> ShardSnapshot | None:
        """The newest snapshot of the job taken at or before log seq ``seq``, or None (every
        snapshot of the job is decoded: for the rare rewind across an epoch)."""
        found = None
        for message in self._snapshots(job_id):
            snapshot = self.codec.decode(message.value())
            if snapshot.seq <= seq and (found is None or snapshot.seq >= found.seq):
                found = snapshot
        return found

    def _snapshots(self, job_id: str) -> Iterator[Message]:
        """Every snapshot record of the job, oldest first, up to a fresh marker."""
        return self._marked(snapshot_topic(self.settings), job_id, OFFSET_BEGINNING)

    def _marked(self, topic: str, job_id: str, start: int) -> Iterator[Message]:
        return read_until_marker(
            self.settings, topic, job_id.encode(), start, self.producer, reader=self.reader
        )
