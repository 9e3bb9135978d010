"""An end-to-end check of the bus: every message type through a real broker.

``antdt check`` runs it to prove a deployment's Kafka, credentials and topics work before any
service relies on them: it creates every registry topic, publishes one example of each message type
with the production client settings, reads each back by manual assignment, decodes it with the
codec, and sends one corrupt record through the dead-letter path.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import consuming, make_admin, producing
from antdt.bus.deadletter import DeadLetter
from antdt.bus.readers import assign_now, decode_or_deadletter, poll_batch
from antdt.errors import BusError
from antdt.schemas.codec import make_codec
from antdt.schemas.examples import all_examples
from antdt.settings import Settings
from antdt.topics import TOPICS, topic_spec


@dataclass(frozen=True)
class CheckRow:
    """One message type's trip through the broker."""

    topic: str
    message: str
    encoded_bytes: int
    round_trip_ms: float
    decoded_equal: bool


@dataclass(frozen=True)
class CheckResult:
    rows: list[CheckRow]
    dead_lettered: int

    @property
    def ok(self) -> bool:
        return all(row.decoded_equal for row in self.rows) and self.dead_lettered == 1


def run_bus_check(settings: Settings, timeout_s: float = 20.0) -> CheckResult:
    """Publish and read back every message type; dead-letter one corrupt record.

    The reader is proven live (it reads back a marker on every topic) before
    the timed sends, so the round-trip times are produce-to-consume
    latencies, not consumer start-up.
    """
    codec = make_codec(settings.schema_registry_url)
    counts = ensure_topics(make_admin(settings), settings)
    by_type = {spec.value: spec for spec in TOPICS if spec.value is not None}
    examples = {by_type[type(m)].full_name(settings.topic_prefix): m for m in all_examples()}
    run_id = uuid.uuid4().hex[:8].encode()
    corrupt_topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    deadletter_topic = topic_spec("", "deadletter").full_name(settings.topic_prefix)
    with (
        producing(settings, client_id="antdt-buscheck") as producer,
        consuming(settings, client_id="antdt-buscheck") as consumer,
    ):
        _warm_up(producer, consumer, examples, counts, run_id, timeout_s)
        sent_at: dict[str, float] = {}
        for topic, message in examples.items():
            sent_at[topic] = time.monotonic()
            producer.produce(topic, key=run_id, value=codec.encode(message, topic))
        producer.produce(corrupt_topic, key=run_id, value=b"\xc3\x01not-avro")
        producer.flush(timeout_s)
        deadletter = DeadLetter(producer, deadletter_topic, "buscheck")
        rows = _read_back(consumer, examples, run_id, sent_at, codec, deadletter, timeout_s)
    return CheckResult(rows, deadletter.count)


def _warm_up(producer, consumer, examples, counts, run_id: bytes, timeout_s: float) -> None:
    """Assign every partition and wait until a marker on each topic is seen.

    docs/embedded-broker.md: the embedded broker's high watermark cannot tell when a reader
    is live, so the reader proves it by reading markers it wrote itself.
    """
    assign_now(
        consumer,
        [TopicPartition(t, p, OFFSET_BEGINNING) for t in examples for p in range(counts[t])],
    )
    marker = run_id + b"-marker"
    for topic in examples:
        producer.produce(topic, key=marker, value=b"")
    producer.flush(timeout_s)
    pending = set(examples)
    deadline = time.monotonic() + timeout_s
    while pending and time.monotonic() < deadline:
        pending -= {m.topic() for m in poll_batch(consumer, 500, 0.05) if m.key() == marker}
    if pending:
        raise BusError(f"bus check: markers not read back from {', '.join(sorted(pending))}")


def _read_back(consumer, examples, run_id, sent_at, codec, deadletter, timeout_s) -> list[CheckRow]:
    rows: dict[str, CheckRow] = {}
    deadline = time.monotonic() + timeout_s
    while (len(rows) < len(examples) or deadletter.count < 1) and time.monotonic() < deadline:
        # one message at a time: consume(n, t) would hold early arrivals until n or t
        for message in poll_batch(consumer, 1, 0.05):
            received = time.monotonic()
            if message.key() != run_id:
                continue
            decoded = decode_or_deadletter(message, codec, deadletter)
            if decoded is None:
                continue
            topic = message.topic()
            rows[topic] = CheckRow(
                topic,
                type(decoded).__name__,
                len(message.value()),
                (received - sent_at[topic]) * 1000,
                decoded == examples[topic],
            )
    if len(rows) < len(examples):
        missing = sorted(set(examples) - set(rows))
        raise BusError(
            f"bus check: nothing read back from {', '.join(missing)} within {timeout_s:.0f} s"
        )
    return [rows[t] for t in examples]
