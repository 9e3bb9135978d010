"""Reading a job's shard log back for people and audits, optionally by time window.

:func:`replay_events` yields a job's events in log order (the order the fold
applies them) with the record timestamp of each, restricted to a window of
record time. Two broker behaviours are designed around (docs/embedded-broker.md):

* ``offsets_for_times`` answers are unreliable (the embedded broker answers
  offset 0 whatever the time). The answer is used only after it is checked
  against the records themselves: the record at the answered offset must be
  at or after the start and the record just before it must be earlier, which
  is what "the first offset at or after T" means. Any other answer, an error,
  or no answer, and the replay scans the partition from the beginning,
  filtering by record timestamp. Either way the window is applied to every
  record, so a wrong start only costs time, never correctness.
* the high watermark is wrong, so the end of the log is a marker written at
  the start of the replay (:func:`eventlog.read_until_marker`).

:func:`export_avro` writes events to an Avro Object Container File, so the
log can be handed to anyone with any Avro library.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from os import PathLike

import fastavro
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaException,
    Message,
    TopicPartition,
)

from antdt.bus.clients import consuming, producing
from antdt.bus.readers import assign_now, poll_batch
from antdt.schemas.codec import Codec, to_avro_dict
from antdt.schemas.models import AvroModel, ShardLogEvent
from antdt.schemas.store import default_store
from antdt.services.sharder.audit import AuditReport, audit_log
from antdt.services.sharder.eventlog import (
    LogReads,
    job_partition,
    lacks_beginning,
    log_topic,
    read_until_marker,
)
from antdt.services.sharder.state import from_ms, to_ms
from antdt.settings import Settings

log = logging.getLogger(__name__)

CLIENT_ID = "antdt-replay"
#: How long to wait for the two records that check a broker's answer. They
#: exist when the answer is right, so only a wrong answer past the end waits.
PROBE_TIMEOUT_S = 2.0
LOOKUP_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class StartPoint:
    """Where a windowed replay starts reading, and why."""

    offset: int
    # True: the broker's offsets_for_times answer checked out; False: scan from the beginning
    verified: bool


def record_time_ms(message: Message) -> int | None:
    """The record timestamp in ms, or None when the record has none."""
    kind, value = message.timestamp()
    return None if kind == TIMESTAMP_NOT_AVAILABLE else value


def broker_offset_for_time(
    consumer: Consumer, topic: str, partition: int, at_ms: int
) -> int | None:
    """The broker's ``offsets_for_times`` answer, or None when it has none or fails (unverified)."""
    try:
        [answer] = consumer.offsets_for_times(
            [TopicPartition(topic, partition, at_ms)], timeout=LOOKUP_TIMEOUT_S
        )
    except KafkaException as exc:
        log.warning("offsets_for_times on %s[%d] failed: %s", topic, partition, exc.args[0])
        return None
    if answer.error is not None or answer.offset < 0:
        return None
    return answer.offset


def read_records(
    consumer: Consumer, topic: str, partition: int, offset: int, count: int, timeout_s: float
) -> list[Message]:
    """Up to ``count`` records of any key from ``offset`` on, or fewer if they do not come within
    ``timeout_s``."""
    assign_now(consumer, [TopicPartition(topic, partition, offset)])
    records: list[Message] = []
    deadline = time.monotonic() + timeout_s
    while len(records) < count and (left := deadline - time.monotonic()) > 0:
        records += poll_batch(consumer, count - len(records), min(left, 0.1))
    return records[:count]


def answer_checks_out(records: list[Message], offset: int, at_ms: int) -> bool:
    """Do ``records`` (the one before ``offset``, if any, then the one at it) make it the first at
    or after ``at_ms``?"""
    expected = [offset - 1, offset] if offset > 0 else [offset]
    if [r.offset() for r in records] != expected:
        return False  # missing, past the end, or not contiguous: cannot tell, so do not trust
    times = [record_time_ms(r) for r in records]
    if None in times:
        return False
    return times[-1] >= at_ms and (len(times) == 1 or times[0] < at_ms)


def find_start(
    settings: Settings, topic: str, partition: int, at_ms: int, probe_timeout_s: float | None = None
) -> StartPoint:
    """The first offset at or after ``at_ms`` if the broker's answer checks out, else the
    beginning."""
    with consuming(settings, client_id=CLIENT_ID) as consumer:
        offset = broker_offset_for_time(consumer, topic, partition, at_ms)
        if offset is not None:
            first = max(offset - 1, 0)
            timeout_s = PROBE_TIMEOUT_S if probe_timeout_s is None else probe_timeout_s
            records = read_records(consumer, topic, partition, first, offset - first + 1, timeout_s)
            if answer_checks_out(records, offset, at_ms):
                return StartPoint(offset, verified=True)
    log.info(
        "offsets_for_times(%s[%d], %d) answered %s, which the records do not confirm: "
        "scanning from the beginning",
        topic,
        partition,
        at_ms,
        offset,
    )
    return StartPoint(OFFSET_BEGINNING, verified=False)


def replay_events(
    settings: Settings,
    job_id: str,
    codec: Codec,
    start: datetime | None = None,
    end: datetime | None = None,
) -> Iterator[tuple[int, datetime, ShardLogEvent]]:
    """``(offset, record time, event)`` for each event of the job with record time in ``[start,
    end]``, in log order.

    Reads up to a marker written when the replay starts: events appended
    later are not included.
    """
    topic = log_topic(settings)
    start_ms, end_ms = to_ms(start), to_ms(end)
    begin = OFFSET_BEGINNING
    if start_ms is not None:
        begin = find_start(settings, topic, job_partition(settings, topic, job_id), start_ms).offset
    with producing(settings, client_id=CLIENT_ID) as producer:
        for message in read_until_marker(settings, topic, job_id.encode(), begin, producer):
            ms = record_time_ms(message)
            if ms is not None and not _within(ms, start_ms, end_ms):
                continue  # not decoded: a scan may pass over most of the log
            event = codec.decode(message.value(), topic)
            if ms is None:  # a record without a timestamp: the event's own time stands in
                ms = to_ms(event.timestamp)
                if not _within(ms, start_ms, end_ms):
                    continue
            yield message.offset(), from_ms(ms), event


def audit_job(
    settings: Settings,
    job_id: str,
    events: list[ShardLogEvent],
    codec: Codec,
    allow_quarantine: bool = False,
) -> AuditReport:
    """Audit the job's whole log; from the earliest snapshot if the log lost its beginning (a reset
    bus)."""
    snapshot = None
    if lacks_beginning(events):
        with producing(settings, client_id=CLIENT_ID) as producer:
            snapshot = LogReads(settings, codec, producer).earliest_snapshot(job_id)
    return audit_log(events, job_id=job_id, allow_quarantine=allow_quarantine, snapshot=snapshot)


def _within(ms: int, start_ms: int | None, end_ms: int | None) -> bool:
    return (start_ms is None or ms >= start_ms) and (end_ms is None or ms <= end_ms)


def export_avro(
    events: Iterable[AvroModel], path: str | PathLike[str], record: type[AvroModel] = ShardLogEvent
) -> int:
    """Write ``events`` (all of type ``record``) to an Avro Object Container File; returns how many
    were written."""
    schema = default_store().current(record.avro_name).raw
    written = 0

    def records() -> Iterator[dict]:
        nonlocal written
        for event in events:
            written += 1
            yield to_avro_dict(event)

    with open(path, "wb") as out:
        fastavro.writer(out, schema, records())
    return written


__all__ = ["StartPoint", "export_avro", "find_start", "replay_events"]
