"""The gap guard: records past a hole in a partition's offsets are held back and the hole read
again."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.gaps import GapGuard
from antdt.bus.readers import assign_now, poll_batch


@dataclass
class Record:
    """The three things the guard reads of a confluent Message."""

    at: int
    part: int = 0
    name: str = "t"

    def topic(self) -> str:
        return self.name

    def partition(self) -> int:
        return self.part

    def offset(self) -> int:
        return self.at


def offsets(messages) -> list[int]:
    return [m.offset() for m in messages]


@pytest.fixture
def sought() -> list[tuple[int, int]]:
    return []


@pytest.fixture
def guard(sought) -> GapGuard:
    return GapGuard(lambda tp: sought.append((tp.partition, tp.offset)), patience_s=60)


def test_contiguous_offsets_pass_and_the_first_one_may_be_anywhere(guard, sought):
    assert offsets(guard.admit([Record(7), Record(8), Record(9)])) == [7, 8, 9]
    assert offsets(guard.admit([Record(10)])) == [10] and sought == []


def test_a_record_past_a_hole_is_held_back_with_the_rest_of_its_partition(guard, sought):
    guard.admit([Record(0), Record(1)])
    got = guard.admit([Record(3), Record(4), Record(2, part=1), Record(5)])
    # another partition is not held back
    assert [(m.partition(), m.offset()) for m in got] == [(1, 2)]
    assert sought == [(0, 2)]
    # the second read has it
    assert offsets(guard.admit([Record(2), Record(3), Record(4)])) == [2, 3, 4]
    assert guard.holes_refilled == 1 and guard.holes_accepted == 0


def test_a_hole_that_stays_is_accepted_after_the_patience(sought):
    guard = GapGuard(lambda tp: sought.append((tp.partition, tp.offset)), patience_s=0.0)
    guard.admit([Record(0)])
    assert guard.admit([Record(2)]) == []  # first sight: read the hole again
    assert offsets(guard.admit([Record(2)])) == [2]  # still missing: go on
    assert guard.holes_accepted == 1 and sought == [(0, 1)]


def test_going_back_is_never_a_hole_and_forgotten_partitions_expect_nothing(guard, sought):
    guard.admit([Record(5)])
    assert offsets(guard.admit([Record(0)])) == [0]  # a rewind, a redelivery
    guard.forget([TopicPartition("t", 0)])
    assert offsets(guard.admit([Record(40)])) == [40] and sought == []


@pytest.fixture
def ten_records(settings, topics):
    """Offsets 0-9 in partition 0 of a topic, and a guarded consumer (closed afterwards) to read
    them."""
    topic = f"{settings.topic_prefix}.shard.progress"
    producer = make_producer(settings)
    for i in range(10):
        producer.produce(topic, key=b"job", value=str(i).encode(), partition=0)
    assert producer.undelivered_after_flush(10) == 0
    consumer = make_consumer(settings)
    yield topic, consumer
    consumer.close()


def test_a_guarded_consumer_repositioned_by_its_reader_sees_no_hole(ten_records):
    """A reader's own assign past what it read is not a hole: the records come, none sought back."""
    topic, consumer = ten_records
    assign_now(consumer, [TopicPartition(topic, 0, 0)])
    first = read(consumer, 3)
    assign_now(consumer, [TopicPartition(topic, 0, 7)])
    later = read(consumer, 3)
    assert (offsets(first), offsets(later)) == ([0, 1, 2], [7, 8, 9])
    assert consumer.gaps.holes_refilled == consumer.gaps.holes_accepted == 0


def read(consumer, count: int) -> list:
    got = []
    for _ in range(200):
        got += poll_batch(consumer, count - len(got), 0.05)
        if len(got) >= count:
            return got
    raise AssertionError(f"read {len(got)} of {count} records")


def test_a_record_held_back_is_not_committed_as_consumed(ten_records):
    """A commit right after a hole commits up to the hole, not past what was dropped (librdkafka
    stores what it hands out)."""
    topic, consumer = ten_records
    assign_now(consumer, [TopicPartition(topic, 0, 0)])
    assert offsets(read(consumer, 3)) == [0, 1, 2]
    # what a skipped fetch looks like: the guard is not told
    Consumer.seek(consumer, TopicPartition(topic, 0, 6))
    assert wait_for_a_drop(consumer) and committed_now(consumer, topic) == 3
    # the hole and what was dropped, read again
    assert offsets(read(consumer, 7)) == [3, 4, 5, 6, 7, 8, 9]
    assert committed_now(consumer, topic) == 10 and consumer.gaps.holes_refilled == 1


def wait_for_a_drop(consumer) -> bool:
    """Poll until the guard holds a batch back (a seek back to the hole), admitting nothing
    meanwhile."""
    for _ in range(200):
        assert poll_batch(consumer, 10, 0.05) == []
        if consumer.gaps._waiting_since:
            return True
    return False


def committed_now(consumer, topic: str) -> int:
    consumer.commit(asynchronous=False)
    return consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
