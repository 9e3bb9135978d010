"""A consumer group member's backlog: the input waiting when its partitions were assigned.

A service that takes its jobs over lazily, on each job's first record (the
sharder), has taken over every job with input waiting once it has handled
the records that were there when its partitions were assigned. That is when
it is ready: an orchestrator's readiness probe, or a harness about to inject
the next fault, must not count it ready while it is still recovering. What
is produced later is ordinary work, not take-over.
"""

from __future__ import annotations

import logging

from confluent_kafka import Consumer, KafkaException, Message, TopicPartition

log = logging.getLogger(__name__)

Partition = tuple[str, int]


class Backlog:
    """The end offsets a consumer must handle up to before it is caught up.

    Not caught up before the first assignment (nothing is known yet); an
    empty assignment, or partitions with nothing waiting, are caught up at
    once. Call :meth:`assigned` and :meth:`revoked` from the consumer's
    rebalance callbacks and :meth:`handled` with every batch handled.
    """

    def __init__(self, lookup_timeout_s: float = 10.0):
        self.lookup_timeout_s = lookup_timeout_s
        self._ends: dict[Partition, int] | None = None

    @property
    def caught_up(self) -> bool:
        return self._ends == {}

    def assigned(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """A new assignment (the whole of it: eager rebalancing): what each partition holds past
        the group's committed offset is the backlog."""
        self._ends = {}
        if not partitions:
            return
        try:
            committed = consumer.committed(partitions, timeout=self.lookup_timeout_s)
            for partition in committed:
                low, high = consumer.get_watermark_offsets(
                    partition, timeout=self.lookup_timeout_s, cached=False
                )
                begin = partition.offset if partition.offset >= 0 else low
                if begin < high:
                    self._ends[(partition.topic, partition.partition)] = high
        # readiness is advice: a broker that cannot say must not stop the service
        except KafkaException as exc:
            log.warning("backlog unknown (%s): counted as caught up", exc)
            self._ends = {}

    def revoked(self, partitions: list[TopicPartition]) -> None:
        if self._ends is not None:
            for partition in partitions:
                self._ends.pop((partition.topic, partition.partition), None)

    def handled(self, messages: list[Message]) -> None:
        """Records handled: a partition is caught up with its last waiting record."""
        if not self._ends:
            return
        for message in messages:
            key = (message.topic(), message.partition())
            end = self._ends.get(key)
            if end is not None and message.offset() + 1 >= end:
                del self._ends[key]
