"""Sending test records through the embedded broker and checking what reached the dead-letter
topic."""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import consuming, producing
from antdt.bus.deadletter import (
    HEADER_ERROR,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_SERVICE,
    HEADER_TOPIC,
)
from antdt.bus.readers import assign_now, poll_batch
from antdt.settings import Settings


@dataclass(frozen=True)
class Record:
    """One record to send; ``because`` is what its dead letter's error must say (None: it must not
    be dead-lettered)."""

    topic: str
    key: bytes | None
    value: bytes | None
    because: str | None = ""


@dataclass(frozen=True)
class Sent:
    record: Record
    partition: int
    offset: int

    @property
    def origin(self) -> tuple[str, int, int]:
        return self.record.topic, self.partition, self.offset


def send(settings: Settings, records: list[Record]) -> list[Sent]:
    """Produce ``records`` in order; where each one landed."""
    landed: dict[int, Sent] = {}

    def delivered(index: int, record: Record):
        def callback(error, message) -> None:
            assert error is None, error
            landed[index] = Sent(record, message.partition(), message.offset())

        return callback

    with producing(settings) as producer:
        for index, record in enumerate(records):
            producer.produce(
                record.topic,
                key=record.key,
                value=record.value,
                on_delivery=delivered(index, record),
            )
            producer.poll(0)
    return [landed[i] for i in range(len(records))]


def read_until(
    settings: Settings, topic: str, partitions: int, done, timeout_s: float = 30.0
) -> list:
    """Records of ``topic`` from its start until ``done(records)``; fails with how many were
    read."""
    found = []
    with consuming(settings) as consumer:
        assign_now(
            consumer, [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        deadline = time.monotonic() + timeout_s
        while not done(found) and time.monotonic() < deadline:
            found += poll_batch(consumer, 1000, 0.1)
    assert done(found), f"gave up after {timeout_s:.0f} s with {len(found)} record(s) from {topic}"
    return found


def dead_letters(
    settings: Settings, want: int, timeout_s: float = 30.0, settle_s: float = 0.5
) -> list:
    """The dead-letter topic's records: at least ``want``, and whatever else arrives within
    ``settle_s`` after."""
    topic = f"{settings.topic_prefix}.deadletter"
    found = []
    with consuming(settings) as consumer:
        assign_now(consumer, [TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout_s
        while len(found) < want and time.monotonic() < deadline:
            found += poll_batch(consumer, 1000, 0.1)
        settle = time.monotonic() + settle_s
        while time.monotonic() < settle:
            found += poll_batch(consumer, 1000, 0.05)
    return found


def assert_service_dead_lettered(
    service, name: str, settings: Settings, sent: list[Sent], bad: int
) -> None:
    """``antdt <name>`` counted every bad record, is still ready, and the dead-letter topic holds
    exactly them."""
    service.wait_until(
        lambda: service.metric(f"antdt_{name}_deadlettered_total") == bad,
        "every bad record counted",
    )
    assert service.is_ready()
    assert_dead_lettered_exactly(dead_letters(settings, bad), sent, name)


def assert_dead_lettered_exactly(dead: list, sent: list[Sent], service: str) -> None:
    """One dead letter per bad record sent (none for the good ones), a copy with its provenance and
    the reason."""
    bad = {s.origin: s.record for s in sent if s.record.because is not None}
    seen = set()
    for message in dead:
        headers = dict(message.headers())
        origin = (
            headers[HEADER_TOPIC].decode(),
            int(headers[HEADER_PARTITION]),
            int(headers[HEADER_OFFSET]),
        )
        assert origin in bad, (
            f"dead-lettered but not sent as bad: {origin}: {headers[HEADER_ERROR].decode()}"
        )
        assert origin not in seen, f"dead-lettered twice: {origin}"
        seen.add(origin)
        record = bad[origin]
        assert (message.key(), message.value()) == (record.key, record.value)
        assert headers[HEADER_SERVICE] == service.encode()
        error = headers[HEADER_ERROR].decode()
        assert error and record.because in error, (
            f"{origin}: expected {record.because!r} in {error!r}"
        )
    missing = [f"{origin} ({bad[origin].because})" for origin in bad if origin not in seen]
    assert not missing, f"not dead-lettered: {missing}"
