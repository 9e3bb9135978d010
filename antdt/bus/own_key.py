"""What a worker-side request/reply client is made of: it sends requests and reads only its own
key's replies.

The sharder's answers and the grouper's groups are both keyed
``<job>/<worker>``, and each worker reads only its own partition. A client
is positioned at the end of its key's replies before it sends anything
(a marker read back, so that no earlier incarnation's reply is taken for
its own), dead-letters what it cannot read, and after a bus reset reads
its partition from offset 0 again.

Its reader fetches only while a reply is awaited (:meth:`OwnKeyClient._await_replies`): a reply
comes only to a request, and an idle reader polls its partition every fetch wait all the same,
each poll a fetch the broker answers (the embedded broker about 1 ms of its CPU each: 40 a
second for a rank's grant reader between requests, 200 for partial reduce's group reader between
steps, on cores the ranks train on).
"""

from __future__ import annotations

import logging
from typing import Self

from confluent_kafka import KafkaException, TopicPartition

from antdt.bus.clients import make_consumer, make_producer
from antdt.bus.config import FetchPace, collected_late
from antdt.bus.deadletter import DeadLetter
from antdt.bus.readers import follow_key
from antdt.bus.watch import Rewinder, shared_watch
from antdt.schemas.codec import Codec, make_codec
from antdt.settings import Settings
from antdt.topics import worker_key

log = logging.getLogger(__name__)


class OwnKeyClient:
    """The producer, the positioned reader of ``replies_topic``, the dead letters and the bus watch
    of one worker."""

    def __init__(
        self,
        settings: Settings,
        job_id: str,
        worker_id: str,
        replies_topic: str,
        client_id: str,
        codec: Codec | None = None,
        pace: FetchPace = FetchPace.LOW_LATENCY,
        replies_collected_late: bool = False,
    ):
        """``replies_collected_late``: replies are asked for ahead of need and read when needed,
        so the reader stops fetching while one waits unread (:func:`collected_late`)."""
        self.job_id, self.worker_id = job_id, worker_id
        self.codec = codec or make_codec(settings.schema_registry_url)
        self._key = worker_key(job_id, worker_id).encode()
        self._producer = make_producer(settings, client_id=client_id, **{"linger.ms": 0})
        late = collected_late(settings, pace) if replies_collected_late else {}
        self._consumer = make_consumer(settings, client_id=client_id, pace=pace, **late)
        self._deadletter = DeadLetter.for_settings(self._producer, settings, "agent")
        for _ in follow_key(
            settings, self._consumer, self._producer, replies_topic, self._key, timeout_s=30.0
        ):
            pass  # replies to an earlier incarnation: not ours
        self._watch = shared_watch(settings)
        # after a bus reset, replies come from offset 0 again, and requests go out at once
        self._rewinder = Rewinder(self._consumer, self._watch)
        self._watch.keep_fresh(self._producer)
        # asked once: librdkafka answers assignment() from its main thread, without a bound
        self._replies = self._consumer.assignment()
        self._paused = False
        self._await_replies(False)

    def _await_replies(self, awaited: bool) -> None:
        """Fetch the replies partition (``awaited``) or stop fetching it. Call it where the count of
        awaited replies changes, under the lock that guards that count, so that the last call wins
        (librdkafka only queues the change: it never blocks). A paused partition resumes at the
        first record not yet polled; a bus reset's fresh assignment fetches until the next call."""
        if awaited:
            self._consumer.resume(self._replies)
            if self._paused:
                wake_fetcher(self._consumer, self._replies)
        else:
            self._consumer.pause(self._replies)
        self._paused = not awaited

    def close(self) -> None:
        self._watch.forget(self._producer)
        self._producer.flush(5)
        self._consumer.close()
        self._watch.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def wake_fetcher(consumer, partitions: list[TopicPartition]) -> None:
    """Have a just resumed partition fetched now: seek it to where the application stands.

    librdkafka applies a resume on its main thread and starts fetching again only when the
    partition's broker thread next wakes up on its own, which with every partition of that broker
    paused is up to a second later (measured on the embedded broker: a reply written while the
    partition was paused read 0.61-0.68 s after the resume, 1-26 ms with this seek; the same
    ~1 s stall seen in librdkafka's own debug logs against Kafka, confluent-kafka-go #630). A seek
    is an op for that thread, which wakes it. Seeking to the position refetches nothing already
    polled; a record fetched but not yet polled is fetched again, and a reply read twice is
    dropped by its reader as not awaited. Nothing to seek to (no record polled yet) or the
    partition gone (a bus reset's reassignment): the resume stands alone."""
    try:
        for position in consumer.position(partitions):
            if position.offset >= 0:
                consumer.seek(position)
    except KafkaException as exc:
        log.debug("could not wake the fetcher of %s: %s", partitions, exc)
