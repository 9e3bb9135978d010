"""Reading one job's shard log in order, as the fold does: fenced, sequenced, gaps noticed.

A parameter-server shard applies updates when the log records their commits,
so it reads the job's partition of ``shard.log`` by manual assignment. It
applies the fold's discipline (:mod:`antdt.services.sharder.state`): an
election with a higher writer epoch makes its writer current, events of any
other epoch are fenced, repeated seqs skipped, and a missing seq is reported
as a gap (the shard then cannot know what was committed, and rolls back).

The embedded broker may hold a partition's last record back from fetches
until the next write to it (docs/architecture.md); while updates wait for
their commit, :meth:`LogFollower.nudge` writes a marker there.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from confluent_kafka import TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.markers import marker_id, send_marker
from antdt.bus.readers import assign_now, key_partition, poll_batch
from antdt.bus.watch import Rewinder, shared_watch
from antdt.errors import AntdtError
from antdt.schemas.codec import Codec
from antdt.schemas.models import ShardLogEvent
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.eventlog import log_topic
from antdt.settings import Settings

log = logging.getLogger(__name__)


class Order(str, Enum):
    NEXT = "next"  # the next event: apply it
    SKIP = "skip"  # fenced or seen already
    GAP = "gap"  # seqs are missing before it


@dataclass
class Position:
    """How far the follower has read: the current writer epoch and the last seq taken in."""

    writer_epoch: int = 0
    last_seq: int = 0

    def place(self, event: ShardLogEvent) -> Order:
        if event.transition is T.WRITER_ELECTED and event.writer_epoch > self.writer_epoch:
            self.writer_epoch = event.writer_epoch
        elif event.writer_epoch != self.writer_epoch or event.transition is T.WRITER_ELECTED:
            return Order.SKIP
        if event.seq <= self.last_seq:
            return Order.SKIP
        order = Order.NEXT if event.seq == self.last_seq + 1 else Order.GAP
        self.last_seq = event.seq
        return order


class LogFollower:
    """The job's log events from ``start`` (an offset), each with its offset and its place in the
    order."""

    def __init__(
        self, settings: Settings, job_id: str, codec: Codec, start: int, position: Position
    ):
        self.job_id, self.codec, self.position = job_id, codec, position
        self.topic = log_topic(settings)
        self.partition = key_partition(settings, self.topic, job_id)
        self._consumer = make_consumer(
            settings, client_id=f"antdt-ps-{job_id}", pace=FetchPace.LOW_LATENCY
        )
        assign_now(self._consumer, [TopicPartition(self.topic, self.partition, start)])
        self._producer = make_producer(
            settings, client_id=f"antdt-ps-{job_id}-nudge", **{"linger.ms": 0}
        )
        self._watch = shared_watch(settings)
        # after a bus reset the log starts at offset 0 again
        self._rewinder = Rewinder(self._consumer, self._watch)
        self.undecodable = 0

    def poll(self, timeout_s: float) -> list[tuple[int, ShardLogEvent, Order]]:
        self._rewinder.check()
        found = []
        for message in poll_batch(self._consumer, 500, timeout_s):
            if message.key() != self.job_id.encode() or marker_id(message) is not None:
                continue
            try:
                event = self.codec.decode(message.value(), self.topic)
            # the sharder dead-letters bad input; a bad log record is only counted here
            except AntdtError as exc:
                self.undecodable += 1
                log.error("undecodable shard log record at offset %d: %s", message.offset(), exc)
                continue
            found.append((message.offset(), event, self.position.place(event)))
        return found

    def nudge(self) -> None:
        """Make a held-back last record of the partition readable (see the module docstring)."""
        send_marker(self._producer, self.topic, self.job_id.encode(), partition=self.partition)
        self._producer.poll(0)

    def close(self) -> None:
        self._producer.flush(2)
        self._consumer.close()
        self._watch.release()
