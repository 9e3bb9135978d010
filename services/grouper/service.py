"""``antdt grouper``: readiness announcements in, partial-reduce groups out.

One loop, one thread, one instance per deployment. Each cycle it reads a
batch of announcements (``group.ready``, keyed by job) from every partition
by manual assignment, starting at the end: an announcement is worth
something only while its worker waits, and a waiting worker sends it again
(so no offsets are committed, and no consumer-group rebalance can stall
it); lets :class:`~antdt.services.grouper.core.GroupFormer` decide
(announcements complete groups, deadlines and checkpoint times pass);
publishes each group as one :class:`~antdt.schemas.models.GroupFormed` per
member, keyed ``<job>/<worker>`` (each worker reads its own partition), and
appends a marker to every partition it wrote to: on the embedded broker a
partition's last record can stay invisible until the next write, and a
member waits for exactly that record. The ``group.formed`` topic is the
audit of who averaged with whom, when and why.

Why a service of its own and not part of the controller: it sits on every
step's critical path (milliseconds, many times a second per job), while the
controller decides on verdicts at second scale with budgets and cooldowns;
a controller restart must not stall training steps.

A grouper that dies loses only who is waiting: workers announce again when
no group comes (:mod:`antdt.worker.preduce.client`), and a restarted
grouper numbers its groups above its predecessor's. After a bus reset
(:mod:`antdt.bus.watch`) it reads the new, empty topics from the beginning;
the waiting workers announce again at once, and one whose group record the
reset lost (its delivery failed) is sent its group again. A record that does not
decode, is not an announcement or is not keyed by its job id goes to the
dead-letter topic and is counted.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid

from confluent_kafka import Message, TopicPartition

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.markers import send_marker
from antdt.bus.murmur2 import partition_for
from antdt.bus.readers import (
    MisroutedRecord,
    assign_now,
    check_key,
    decode_or_deadletter,
    poll_batch,
)
from antdt.bus.watch import Rewinder, produce_through_reset, refresh_metadata, shared_watch
from antdt.runtime.service_loop import LoopService
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import GroupFormed, GroupReady
from antdt.schemas.types import utc_now
from antdt.services.grouper import metrics
from antdt.services.grouper.core import Formed, GrouperConfig, GroupFormer, Waiting
from antdt.settings import Settings
from antdt.topics import topic_spec, worker_key

log = logging.getLogger(__name__)

#: Longest wait for input in one cycle; deadlines are checked at least this often.
POLL_S = 0.005


class GrouperService(LoopService):
    """Consumes announcements, forms groups, tells each member. See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        config: GrouperConfig | None = None,
        instance_id: str | None = None,
    ):
        self.settings = settings
        self.instance_id = (
            instance_id or f"grouper-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.codec: Codec = make_codec(settings.schema_registry_url)
        self.former = GroupFormer(config, first_id=int(time.time() * 1000))
        self.ready = threading.Event()
        self._producer = make_producer(settings, client_id=self.instance_id, **{"linger.ms": 0})
        self._deadletter = DeadLetter.for_settings(
            self._producer, settings, "grouper", counter=metrics.DEADLETTERED
        )
        self._ready_topic = topic_spec("group", "ready").full_name(settings.topic_prefix)
        self._formed_topic = topic_spec("group", "formed").full_name(settings.topic_prefix)
        self._formed_partitions = 1
        self._consumer = None
        self._watch = None
        self._rewinder: Rewinder | None = None

    def start(self) -> GrouperService:
        # the watch knows the cluster before the reader is placed on it, so a reset from here on
        # rewinds the reader (a chaos run's broker restart once fell between the grouper's ready
        # and its watch's first look: the reset went unseen and the reader stayed at the old end)
        self._watch = shared_watch(self.settings, look_now=True)
        counts = ensure_topics(make_admin(self.settings), self.settings)
        self._formed_partitions = counts[self._formed_topic]
        # the ranks announce and train on (worker/preduce/rounds.py): a 5 ms wait here bought
        # them nothing and polled the embedded broker 200 times a second, idle or not
        self._consumer = make_consumer(
            self.settings, client_id=self.instance_id, pace=FetchPace.STEADY
        )
        assign_now(
            self._consumer,
            [
                TopicPartition(self._ready_topic, p, self._end_of(p))
                for p in range(counts[self._ready_topic])
            ],
        )
        self._rewinder = Rewinder(self._consumer, self._watch)
        self.ready.set()
        return self

    def _end_of(self, partition: int) -> int:
        """Where ``partition`` ends now: looked up before assigning, so what is written once ready
        is read.

        (Assigning at OFFSET_END would look the end up at the first fetch,
        later.) A high watermark that lags the real end, as the embedded
        broker's can, only makes the grouper read a few old announcements.
        """
        _, high = self._consumer.get_watermark_offsets(
            TopicPartition(self._ready_topic, partition), timeout=10.0, cached=False
        )
        return max(0, high)

    def close(self) -> None:
        self._close_clients()
        if self._watch is not None:
            self._watch.release()
            self._watch = None

    def step(self) -> int:
        """One batch of announcements, then whatever deadlines have passed; returns the records
        read."""
        # the bus came back empty: read it from 0
        if self._rewinder is not None and self._rewinder.check():
            refresh_metadata(self._producer)
            metrics.BUS_RESETS.inc()
            log.warning(
                "the bus was reset: reading announcements from the beginning of the new topics"
            )
        messages = poll_batch(self._consumer, 1000, POLL_S)
        formed: list[Formed] = []
        for message in messages:
            formed += self._handle(message)
        formed += self.former.tick(time.monotonic())
        if formed:
            self._publish(formed)
        return len(messages)

    def _handle(self, message: Message) -> list[Formed]:
        event = decode_or_deadletter(message, self.codec, self._deadletter, expected=GroupReady)
        if event is None:
            return []
        try:
            check_key(message.key(), event.job_id)
        except MisroutedRecord as exc:
            self._deadletter.send(SourceRecord.from_confluent(message), exc)
            return []
        metrics.ANNOUNCEMENTS.labels(str(event.finished).lower()).inc()
        stale = self.former.ignored
        formed = self.former.ready(event, time.monotonic())
        metrics.STALE.inc(self.former.ignored - stale)
        metrics.JOBS.set(len(self.former.jobs))
        return formed

    def _publish(self, groups: list[Formed]) -> None:
        """Each member's record, then a marker on each partition written (see the module
        docstring)."""
        touched: dict[int, bytes] = {}
        now = utc_now()
        for group in groups:
            for member in self._recipients(group):
                waited_s = max(0.0, group.at - member.since)
                record = GroupFormed(
                    job_id=group.job_id,
                    worker_id=member.worker_id,
                    group_id=group.group_id,
                    generation=group.generation,
                    reason=group.reason,
                    members=[m.worker_id for m in group.members],
                    ranks=group.ranks,
                    in_reply_to=member.seq,
                    waited_ms=round(waited_s * 1000),
                    timestamp=now,
                )
                key = worker_key(group.job_id, member.worker_id).encode()
                produce_through_reset(
                    self._producer,
                    self._watch,
                    self._formed_topic,
                    key=key,
                    value=self.codec.encode(record, self._formed_topic),
                    on_delivery=_logged,
                )
                touched[partition_for(key, self._formed_partitions)] = key
        for partition, key in touched.items():
            send_marker(self._producer, self._formed_topic, key, partition=partition)
        self._producer.poll(0)

    @staticmethod
    def _recipients(group: Formed) -> list[Waiting]:
        """Every member of a new group (counted); the one member a group is sent again to."""
        if group.resent_to is not None:
            metrics.RESENT.inc()
            [member] = [m for m in group.members if m.rank == group.resent_to]
            log.warning(
                "%s announced step %d of job %s again: its group %d sent again (its record was "
                "lost)",
                member.worker_id,
                member.seq,
                group.job_id,
                group.group_id,
            )
            return [member]
        metrics.GROUPS.labels(group.reason.value).inc()
        metrics.GROUP_SIZE.observe(len(group.members))
        for member in group.members:
            metrics.WAIT_SECONDS.observe(max(0.0, group.at - member.since))
        return list(group.members)


def _logged(error, message) -> None:
    if error is not None:
        log.warning("a group record was not delivered: %s", error.str())
