"""Reading and decoding, with bad records routed to the dead-letter topic.

:class:`KeyedReader` reads one key's records from the one partition that key
hashes to, by manual assignment (no consumer group, so no join delay: the
embedded broker holds a JoinGroup for half the session timeout): an
operator's or a test's look at one worker's records. (A worker's own replies
are read by :class:`~antdt.bus.own_key.OwnKeyClient`, positioned by a marker.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from antdt.bus.admin import partition_counts
from antdt.bus.clients import consuming, make_admin, make_consumer, producing
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.gaps import GuardedConsumer
from antdt.bus.markers import marker_id, write_marker
from antdt.bus.murmur2 import partition_for
from antdt.errors import AntdtError, BusError, CodecError, TopicMissing
from antdt.schemas.codec import Codec
from antdt.schemas.models import AvroModel
from antdt.settings import Settings
from antdt.topics import worker_key

log = logging.getLogger(__name__)

BEGINNING = OFFSET_BEGINNING
END = OFFSET_END
#: A marker not read back this long: another is written (see read_to_markers).
MARKER_NUDGE_S = 1.0
#: How long a missing topic is looked for again (the bus may be in the middle of a reset).
TOPIC_BACK_WITHIN_S = 15.0


def decode_or_deadletter(
    message: Message,
    codec: Codec,
    deadletter: DeadLetter | None,
    expected: type[AvroModel] | tuple[type[AvroModel], ...] | None = None,
) -> AvroModel | None:
    """The decoded value of ``message``, or None after dead-lettering it.

    ``expected`` names the message types the topic carries: a record that
    decodes into another type (valid Avro, wrong topic) is as unusable as
    one that does not decode.
    """
    try:
        if message.value() is None:
            raise AntdtError("record has no value")
        value = codec.decode(message.value(), message.topic())
        if expected is not None and not isinstance(value, expected):
            raise CodecError(
                f"expected {_names(expected)} on {message.topic()}, got {type(value).__name__}"
            )
        return value
    except AntdtError as exc:
        if deadletter is None:
            log.warning(
                "undecodable record %s[%d]@%d: %s",
                message.topic(),
                message.partition(),
                message.offset(),
                exc,
            )
        else:
            deadletter.send(SourceRecord.from_confluent(message), exc)
        return None


def decode_addressed(
    message: Message,
    codec: Codec,
    deadletter: DeadLetter,
    expected: type[AvroModel],
    job_id: str,
    worker_id: str,
    noun: str,
) -> AvroModel | None:
    """The ``expected`` value of a record on one worker's own key, or None after dead-lettering it.

    A record there that does not decode, is of another type, or is addressed
    to another job or worker cannot be an answer to this worker; trusting it
    could hand it someone else's shards or group.
    """
    value = decode_or_deadletter(message, codec, deadletter, expected=expected)
    if value is not None and (value.job_id, value.worker_id) != (job_id, worker_id):
        deadletter.send(
            SourceRecord.from_confluent(message),
            (
                f"{noun} for {worker_key(value.job_id, value.worker_id)} on key "
                f"{message.key().decode()}"
            ),
        )
        return None
    return value


class MisroutedRecord(AntdtError):
    """A record keyed otherwise than its value says it must be (e.g. not by its job id).

    Keys decide partitions, and partitions decide which instance of a
    service owns a job: a misrouted record could make two instances act for
    one job, so it is refused rather than processed.
    """


def check_key(key: bytes | None, expected: str) -> None:
    """MisroutedRecord unless ``key`` is ``expected``."""
    if key != expected.encode():
        shown = "no key" if key is None else f"key {key[:100]!r}"
        raise MisroutedRecord(f"{shown}, but the record belongs under {expected!r}")


def _names(types: type | tuple[type, ...]) -> str:
    return " or ".join(t.__name__ for t in (types if isinstance(types, tuple) else (types,)))


def assign_now(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float = 10.0
) -> None:
    """Assign partitions so that fetching starts at once.

    librdkafka retries an offset lookup after 500 ms when the partition
    leader's connection is not up yet, which is always the case for a fresh
    consumer; a metadata request first brings the connection up (~50 ms).
    """
    for topic in sorted({tp.topic for tp in partitions}):
        consumer.list_topics(topic, timeout=timeout_s)
    consumer.assign(partitions)


def resume_or_end(
    consumer: Consumer, partitions: list[TopicPartition], timeout_s: float = 10.0
) -> list[TopicPartition]:
    """Each partition at its group's committed offset, or at its end where the group never committed
    one.

    The end is committed at once, so whoever holds the partition next starts
    there too: a record written after this moment is read by some member
    even if this one dies before reading it (``auto.offset.reset=latest``
    would skip it).
    """
    positions, fresh = [], []
    for tp in consumer.committed(partitions, timeout=timeout_s):
        if tp.offset < 0:
            _, end = consumer.get_watermark_offsets(
                TopicPartition(tp.topic, tp.partition), timeout=timeout_s
            )
            tp = TopicPartition(tp.topic, tp.partition, end)
            fresh.append(tp)
        positions.append(tp)
    if fresh:
        commit_within(consumer, fresh, timeout_s)
    return positions


#: How often an unconfirmed commit is sent again (a commit refused in a rebalance is not retried).
COMMIT_RETRY_S = 0.2


def commit_within(consumer: Consumer, offsets: list[TopicPartition], timeout_s: float) -> None:
    """Commit ``offsets`` and read them back as the group's within ``timeout_s``, else BusError.

    librdkafka's synchronous commit waits for the group's coordinator
    without bound, and a rebalance callback that waits so holds its
    service's whole loop; here the commit is sent (again, while it is not
    confirmed) and the committed offsets are read back under a deadline.
    """
    wanted = {(tp.topic, tp.partition): tp.offset for tp in offsets}
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        consumer.commit(offsets=offsets, asynchronous=True)
        try:
            stored = consumer.committed(offsets, timeout=left)
        except KafkaException:
            break  # the read-back itself ran out of time
        if all(tp.offset >= wanted[(tp.topic, tp.partition)] for tp in stored):
            return
        time.sleep(min(COMMIT_RETRY_S, max(0.0, deadline - time.monotonic())))
    shown = ", ".join(f"{topic}[{part}]@{offset}" for (topic, part), offset in wanted.items())
    raise BusError(f"the commit of {shown} was not confirmed within {timeout_s:g} s")


_PARTITION_COUNTS: dict[tuple[str, str], int] = {}


def key_partition(
    settings: Settings, topic: str, key: bytes | str, within_s: float = TOPIC_BACK_WITHIN_S
) -> int:
    """The partition ``key`` lands on (the topic's partition count is looked up once).

    A topic missing is looked for again for up to ``within_s``: a process
    that starts while the bus is being reset (a broker back empty, the
    topics being re-created) would otherwise die on a moment's gap.
    """
    cache_key = (settings.bootstrap_servers, topic)
    if cache_key not in _PARTITION_COUNTS:
        admin, deadline = make_admin(settings), time.monotonic() + within_s
        while True:
            try:
                _PARTITION_COUNTS[cache_key] = partition_counts(admin, [topic])[topic]
                break
            except TopicMissing:  # not a refused login or an unreachable bus: those end at once
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    return partition_for(key, _PARTITION_COUNTS[cache_key])


def follow_key(
    settings: Settings,
    consumer: Consumer,
    producer: Producer,
    topic: str,
    key: bytes,
    start: int = OFFSET_BEGINNING,
    timeout_s: float = 60.0,
) -> Iterator[Message]:
    """Assign ``key``'s partition from ``start`` and yield its records up to a fresh marker.

    When the generator ends the consumer stays assigned just past the marker,
    so a caller that goes on reading misses nothing written to ``key`` afterwards.
    """
    partition = key_partition(settings, topic, key)
    for message in read_to_markers(consumer, producer, topic, [partition], key, start, timeout_s):
        if message.key() == key:
            yield message


def read_to_markers(
    consumer: Consumer,
    producer: Producer,
    topic: str,
    partitions: list[int],
    marker_key: bytes,
    start: int = OFFSET_BEGINNING,
    timeout_s: float = 60.0,
) -> Iterator[Message]:
    """Assign ``partitions`` from ``start`` and yield their records up to a fresh marker in each.

    Catching up is proven by reading back a marker written first, never by the
    high watermark (wrong on the embedded broker). The embedded broker can keep
    a partition's last record invisible until the next write, so while a marker
    has not come back another one is written every :data:`MARKER_NUDGE_S`; any
    of them proves it. Markers, ours and others', are not yielded. The consumer
    stays assigned just past the markers read.
    """
    pending = {p: {write_marker(producer, topic, marker_key, partition=p)} for p in partitions}
    assign_now(consumer, [TopicPartition(topic, p, start) for p in partitions])
    deadline = time.monotonic() + timeout_s
    nudge_at = time.monotonic() + MARKER_NUDGE_S
    while pending and time.monotonic() < deadline:
        for message in poll_batch(consumer, 10_000, 0.05):
            found = marker_id(message)
            if found is None:
                yield message
            elif found in pending.get(message.partition(), ()):
                del pending[message.partition()]
        # our marker may be a last record kept invisible: write another
        if pending and time.monotonic() >= nudge_at:
            for p, markers in pending.items():
                markers.add(write_marker(producer, topic, marker_key, partition=p))
            nudge_at = time.monotonic() + MARKER_NUDGE_S
    if pending:
        raise BusError(
            f"did not reach the marker in {topic}{sorted(pending)} within {timeout_s:.0f} s"
        )


def read_whole_topic(
    settings: Settings,
    codec: Codec,
    topic: str,
    expected: type[AvroModel],
    job_id: str | None = None,
) -> Iterator[AvroModel]:
    """Every ``expected`` record of ``topic`` (of ``job_id``) up to markers written now, partition
    by partition.

    For audits of topics keyed by worker, whose job spreads over every
    partition. A record that does not decode is logged and skipped.
    """
    partitions = list(range(partition_counts(make_admin(settings), [topic])[topic]))
    with producing(settings) as producer, consuming(settings) as consumer:
        for message in read_to_markers(consumer, producer, topic, partitions, b"*"):
            try:
                value = codec.decode(message.value(), topic)
            except AntdtError as exc:
                log.warning(
                    "unreadable record %s[%d]@%d: %s",
                    topic,
                    message.partition(),
                    message.offset(),
                    exc,
                )
                continue
            if isinstance(value, expected) and (job_id is None or value.job_id == job_id):
                yield value


def poll_batch(consumer: Consumer, max_records: int, timeout_s: float) -> list[Message]:
    """Up to ``max_records`` data messages, returning as soon as any are available.

    ``Consumer.consume(n, t)`` holds what it has until it has ``n`` records or
    ``t`` passed, which would add up to ``t`` of latency to every request
    path; here the wait ends with the first record and the rest of the batch
    is whatever is already fetched. Transport errors are logged, fatal ones
    raised. A consumer with a gap guard (:mod:`antdt.bus.gaps`) holds back
    what came past a hole in a partition's offsets.
    """
    first = consumer.poll(timeout_s)
    if first is None:
        return []
    messages = [first, *consumer.consume(max_records - 1, 0)] if max_records > 1 else [first]
    good = []
    for message in messages:
        error = message.error()
        if error is None:
            good.append(message)
        elif error.fatal():
            raise BusError(f"fatal consumer error: {error.str()}")
        elif error.code() != KafkaError._PARTITION_EOF:
            log.warning("consumer error: %s", error.str())
    good = still_assigned(consumer, good)
    return consumer.admit(good) if isinstance(consumer, GuardedConsumer) else good


def still_assigned(consumer: Consumer, messages: list[Message]) -> list[Message]:
    """The messages whose partition the consumer still holds.

    A rebalance can revoke a partition between the batch's first record and
    its last (callbacks run inside ``consume``): a record fetched before is
    no longer ours to act on, its partition's new owner reads it again.
    """
    held = {(tp.topic, tp.partition) for tp in consumer.assignment()}
    return [m for m in messages if (m.topic(), m.partition()) in held]


class KeyedReader:
    """Reads the records of one key from its partition, decoded, without a group.

    ``start=END`` is the partition's end when the reader is made, looked up
    then: a record written after the constructor returns is read. (Assigned at
    the logical end, librdkafka resolves it later, and a record written
    meanwhile would be taken for history and skipped.)
    """

    def __init__(
        self,
        settings: Settings,
        topic: str,
        key: str,
        codec: Codec,
        start: int = END,
        deadletter: DeadLetter | None = None,
        partitions: int | None = None,
        pace: FetchPace = FetchPace.LOW_LATENCY,
    ):
        self.topic = topic
        self.key = key.encode()
        self._codec = codec
        self._deadletter = deadletter
        self.partition = (
            partition_for(self.key, partitions)
            if partitions
            else key_partition(settings, topic, self.key)
        )
        self._consumer = make_consumer(settings, pace=pace)
        if start == END:
            _, start = self._consumer.get_watermark_offsets(
                TopicPartition(topic, self.partition), timeout=10.0
            )
        assign_now(self._consumer, [TopicPartition(topic, self.partition, start)])

    def poll(self, timeout_s: float = 0.1, max_records: int = 500) -> list[AvroModel]:
        """Decoded records for this key that arrived since the last poll."""
        decoded = []
        for message in poll_batch(self._consumer, max_records, timeout_s):
            if message.key() != self.key:
                continue
            value = decode_or_deadletter(message, self._codec, self._deadletter)
            if value is not None:
                decoded.append(value)
        return decoded

    def __iter__(self) -> Iterator[AvroModel]:
        while True:
            yield from self.poll(timeout_s=0.5)

    def close(self) -> None:
        self._consumer.close()

    def __enter__(self) -> KeyedReader:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
