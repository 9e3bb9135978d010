"""A worker's reply reader: its partition woken on resume (antdt.bus.own_key) on a real broker.

How soon a woken partition is read is a benchmark's figure (bench/resume_bench.py), not a test's.
"""

from __future__ import annotations

import time

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace, collected_late
from antdt.bus.own_key import wake_fetcher


def _read(consumer, count: int, within_s: float = 15.0) -> list[bytes]:
    values: list[bytes] = []
    deadline = time.monotonic() + within_s
    while len(values) < count and time.monotonic() < deadline:
        message = consumer.poll(0.05)
        if message is not None and message.error() is None:
            values.append(message.value())
    return values


def test_a_woken_partition_reads_what_came_while_it_was_paused_once_in_order(settings, topics):
    """The seek that wakes the fetcher goes to where the reader stands: nothing polled before the
    pause comes again, nothing written during it is skipped."""
    topic = settings.topic("shard", "assignments")
    producer = make_producer(settings)
    consumer = make_consumer(
        settings, pace=FetchPace.STEADY, **collected_late(settings, FetchPace.STEADY)
    )
    partition = [TopicPartition(topic, 0, OFFSET_BEGINNING)]
    try:
        consumer.assign(partition)
        producer.produce(topic, value=b"before", partition=0)
        producer.flush(10)
        assert _read(consumer, 1) == [b"before"]
        consumer.pause(partition)
        for value in (b"during-1", b"during-2"):
            producer.produce(topic, value=value, partition=0)
        producer.flush(10)
        consumer.resume(partition)
        wake_fetcher(consumer, partition)
        assert _read(consumer, 2) == [b"during-1", b"during-2"]
        assert _read(consumer, 1, within_s=1.0) == []  # and nothing again
    finally:
        consumer.close()


def test_waking_a_partition_with_nothing_polled_yet_leaves_it_where_it_was(settings, topics):
    """No position to seek to: the resume alone stands, and the reader starts where assigned."""
    topic = settings.topic("shard", "assignments")
    producer = make_producer(settings)
    consumer = make_consumer(settings, pace=FetchPace.STEADY)
    partition = [TopicPartition(topic, 1, OFFSET_BEGINNING)]
    try:
        consumer.assign(partition)
        producer.produce(topic, value=b"only", partition=1)
        producer.flush(10)
        wake_fetcher(consumer, partition)
        assert _read(consumer, 1) == [b"only"]
    finally:
        consumer.close()
