"""Offset holes on the embedded broker: a record handed out past one is held back, the hole read
again.

With several producers appending to one partition at once, the embedded
broker can answer a tailing fetch with offset N+1 before offset N is
readable; the consumer's position then moves past N and N is never
delivered (docs/reliability.md, "A skipped offset"). A worker's commit
lost that way is a sample trained but never recorded.

Offsets there have no legitimate holes (no compaction, no transactions), so
:class:`GapGuard` drops a record that arrives past a hole, with everything
after it from that partition in the batch, and seeks the partition back to
the hole. A hole still there after ``patience_s`` is accepted with a
warning. Every reposition the reader makes itself (assign, seek, a
rebalance) resets what the guard expects of that partition.

A dropped record must not count as consumed: librdkafka stores the offset of
every message it hands the application (and a seek does not take that back),
so a commit after a drop would skip the hole for the next reader. The
guarded consumer therefore stores offsets itself, only for what it admits.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaException, Message, TopicPartition

from antdt.bus.closing import BoundedConsumer

log = logging.getLogger(__name__)

PATIENCE_S = 10.0

Partition = tuple[str, int]


class GapGuard:
    """What offset comes next in each partition a consumer reads; see the module docstring."""

    def __init__(self, seek: Callable[[TopicPartition], None], patience_s: float = PATIENCE_S):
        self._seek = seek
        self.patience_s = patience_s
        self._next: dict[Partition, int] = {}
        # the hole and when it was first seen
        self._waiting_since: dict[Partition, tuple[int, float]] = {}
        self.holes_refilled = 0
        self.holes_accepted = 0

    def admit(self, messages: list[Message]) -> list[Message]:
        """The messages in order, less those past a hole (their partitions are sought back to
        it)."""
        admitted, blocked = [], set()
        for message in messages:
            partition = (message.topic(), message.partition())
            if partition in blocked:
                continue
            expected, offset = self._next.get(partition), message.offset()
            if (
                expected is not None
                and offset > expected
                and not self._waited_out(partition, expected)
            ):
                blocked.add(partition)
                self._seek(TopicPartition(partition[0], partition[1], expected))
                continue
            if self._waiting_since.pop(partition, None) is not None and expected is not None:
                self._count(partition, expected, offset)
            self._next[partition] = offset + 1
            admitted.append(message)
        return admitted

    def forget(self, partitions) -> None:
        """The reader moved these partitions itself: expect nothing of them."""
        for tp in partitions:
            self._next.pop((tp.topic, tp.partition), None)
            self._waiting_since.pop((tp.topic, tp.partition), None)

    def _waited_out(self, partition: Partition, hole: int) -> bool:
        since = self._waiting_since.get(partition)
        if since is None or since[0] != hole:
            self._waiting_since[partition] = (hole, time.monotonic())
            return False
        return time.monotonic() - since[1] >= self.patience_s

    def _count(self, partition: Partition, hole: int, offset: int) -> None:
        if offset == hole:
            self.holes_refilled += 1
            log.debug("%s[%d]: offset %d came on a second read", partition[0], partition[1], hole)
        else:
            self.holes_accepted += 1
            log.warning(
                "%s[%d]: offsets %d-%d never came (waited %.0f s); reading on from %d",
                partition[0],
                partition[1],
                hole,
                offset - 1,
                self.patience_s,
                offset,
            )


class GuardedConsumer(BoundedConsumer):
    """A consumer whose :func:`~antdt.bus.readers.poll_batch` reads through a :class:`GapGuard`.

    Its own repositions (assign, seek, a rebalance's assignment) reset the
    guard for the partitions concerned. Offsets are stored (for ``commit()``)
    only for admitted messages, see the module docstring.
    """

    def __init__(self, conf: dict):
        super().__init__({**conf, "enable.auto.offset.store": False})
        self.gaps = GapGuard(super().seek)

    def admit(self, messages: list[Message]) -> list[Message]:
        """The messages the guard lets through, their offsets stored as consumed."""
        admitted = self.gaps.admit(messages)
        last: dict[Partition, int] = {}
        for message in admitted:
            last[(message.topic(), message.partition())] = message.offset()
        if last:
            self._store(last)
        return admitted

    def _store(self, last: dict[Partition, int]) -> None:
        try:
            self.store_offsets(
                offsets=[TopicPartition(t, p, offset + 1) for (t, p), offset in last.items()]
            )
        # a partition revoked meanwhile: its next owner reads it again
        except KafkaException as exc:
            log.debug("offsets not stored: %s", exc)

    def assign(self, partitions) -> None:
        self.gaps.forget(partitions)
        super().assign(partitions)

    def incremental_assign(self, partitions) -> None:
        self.gaps.forget(partitions)
        super().incremental_assign(partitions)

    def seek(self, partition: TopicPartition) -> None:
        self.gaps.forget([partition])
        super().seek(partition)

    def subscribe(self, topics, on_assign=None, on_revoke=None, on_lost=None) -> None:
        def assigned(consumer, partitions):
            self.gaps.forget(partitions)
            if on_assign is not None:
                on_assign(consumer, partitions)

        def revoked(consumer, partitions):
            self.gaps.forget(partitions)
            if on_revoke is not None:
                on_revoke(consumer, partitions)

        callbacks = {"on_assign": assigned, "on_revoke": revoked}
        if on_lost is not None:
            callbacks["on_lost"] = on_lost
        super().subscribe(topics, **callbacks)
