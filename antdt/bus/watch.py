"""Noticing that the bus was reset (a broker that came back empty), and putting the topics back.

The embedded broker keeps everything in memory: when it restarts, every
topic, record, committed offset and group is gone, and it answers with a new
cluster id (:class:`antdt.embedded.broker.EmbeddedBroker` gives each start its own).
A real Kafka cluster keeps its data and its id across restarts, so there
this fires only when the cluster was truly replaced, or when one of our
topics was deleted.

:class:`BusWatch` polls cluster metadata on a daemon thread, every
:data:`CHECK_EVERY_S` and at once when its connection to the bus is lost (a
broker that went away is looked at again as soon as one answers, not up to
half a second later). When the cluster id changes, or a topic of the
registry is missing, it

1. bumps :attr:`BusWatch.generation` first, so every consumer that checks it
   (:class:`Rewinder`) moves back to the beginning of its partitions before
   the new, empty topics exist, and cannot skip a record written to them;
2. re-creates the topics from the registry (auto-creation is off for every
   producer, so nothing else creates them, and never with the wrong counts);
3. calls the callbacks registered with :meth:`BusWatch.on_reset` (the
   monitor restarts its Faust worker in place). Components with a loop of
   their own (the sharder, the controller, the agent) see the new generation
   through their :class:`Rewinder` instead and re-announce their state there.

:func:`shared_watch` hands out one watch per process and bus, counted, so
the agent's parts share one thread and one metadata request per interval.
A reset is a change from what the watch saw before, so a watch that has not
looked yet cannot see one: a service takes its watch's first look before it
says it is ready (``look_now``), an agent leaves it to the thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.errors import AntdtError, BusError, TopicMissing
from antdt.settings import Settings
from antdt.topics import TOPICS

log = logging.getLogger(__name__)

#: How often the cluster is looked at. One metadata request on an open connection: cheap.
CHECK_EVERY_S = 0.5
#: The watch's client serves its error callback this often while it waits for the next look, so
#: a lost connection ends the wait (and a closed watch's thread ends) within it.
SERVE_EVERY_S = 0.1
#: librdkafka's errors for a lost connection: the broker went away (a restart, a roll, a crash).
CONNECTION_LOST = frozenset({KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN})
#: Where a reset's topics begin: they are made new, empty.
FIRST_OFFSET = 0
#: How long a write (or the sharder's re-publishing) waits for a reset's topics to come back.
TOPICS_BACK_WITHIN_S = 60.0
#: Between tries of a write whose topic is not back yet.
RETRY_PAUSE_S = 0.1
#: What a record for a topic a reset took fails with: the producer's own refusal, Kafka's answer,
#: and the embedded broker's (Tansu answers a missing topic's records with UNKNOWN, -1).
MISSING_TOPIC = frozenset(
    {KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError.UNKNOWN}
)


def produce_or_refused(producer: Producer, topic: str, **record) -> KafkaError | None:
    """``producer.produce(topic, **record)``: None if taken, the error if refused because a bus
    reset took the topic (the caller keeps the record and tries again once the topic is back);
    any other refusal raises, as ``produce`` does."""
    try:
        producer.produce(topic, **record)
    except KafkaException as exc:
        if exc.args[0].code() not in MISSING_TOPIC:
            raise
        return exc.args[0]
    return None


class BusWatch:
    """Watches one bus for resets; see the module docstring."""

    def __init__(self, settings: Settings, every_s: float = CHECK_EVERY_S):
        self.settings = settings
        self.every_s = every_s
        self.generation = 0
        #: the generation whose topics are back (``generation`` counts a reset before they are)
        self.restored = 0
        self.cluster_id: str | None = None
        self._topics = [spec.full_name(settings.topic_prefix) for spec in TOPICS]
        self._lost = threading.Event()
        self._answered = False  # whether the last look was answered
        self._admin = make_admin(settings, client_id="antdt-bus-watch", error_cb=self._on_error)
        self._callbacks: list[Callable[[], None]] = []
        self._kept_fresh: list[Producer] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="antdt-bus-watch", daemon=True)
        self._users = 0
        self._unfinished = False
        self._started = False

    def start(self) -> BusWatch:
        """Start watching (the first look is on the thread, so a caller never waits for an
        unreachable bus)."""
        with self._lock:
            if not self._started:
                self._started = True
                self._thread.start()
        return self

    def on_reset(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (on the watch's thread) after each reset, once the topics are back."""
        self._callbacks.append(callback)

    def keep_fresh(self, producer: Producer) -> None:
        """Refresh ``producer``'s metadata after each reset, once the topics are back
        (:func:`refresh_metadata`, on the watch's thread): left alone, it holds what it sends to
        the re-created topics for 1.4-1.9 s (measured on the embedded broker; a few ms refreshed,
        ``bench/reset_pickup_bench.py``).
        :meth:`forget` it before closing it. A consumer refreshes on its own thread instead
        (:class:`Rewinder`)."""
        with self._lock:
            self._kept_fresh.append(producer)

    def forget(self, producer: Producer) -> None:
        """Stop refreshing ``producer`` (it is being closed)."""
        with self._lock:
            self._kept_fresh = [kept for kept in self._kept_fresh if kept is not producer]

    def check_now(self) -> bool:
        """Look at the cluster now; True if it was reset (and is now handled). Never raises."""
        with self._lock:
            if self._unfinished:
                self._restore()
            why = self._reset_reason()
            if why is None:
                return False
            self.generation += 1
            log.warning(
                "the bus at %s was reset (%s): re-creating the topics",
                self.settings.bootstrap_servers,
                why,
            )
            self._restore()
            return True

    def wait_restored(self, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until the topics of the newest reset are back; True if
        they are. A reader that moved on when ``generation`` changed writes only after this."""
        deadline = time.monotonic() + timeout_s
        while self.restored < self.generation:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.05)
        return True

    def _reset_reason(self) -> str | None:
        try:
            metadata = self._admin.list_topics(timeout=2.0)
        except KafkaException:
            self._answered = False
            return None  # down or unreachable: nothing to conclude until it answers
        self._answered = True
        previous, self.cluster_id = self.cluster_id, metadata.cluster_id
        if previous is None:
            return None
        if metadata.cluster_id != previous:
            return f"cluster id {previous} became {metadata.cluster_id}"
        missing = [name for name in self._topics if name not in metadata.topics]
        return f"topics missing: {', '.join(missing)}" if missing else None

    def _restore(self) -> None:
        """Topics back, then the callbacks; if the topics cannot be made yet, again at the next
        check."""
        try:
            ensure_topics(self._admin, self.settings)
        except AntdtError as exc:
            log.error("re-creating the topics failed (trying again at the next check): %s", exc)
            self._unfinished = True
            return
        self._unfinished = False
        for producer in self._kept_fresh:  # before ``restored``: a writer waiting on it finds them
            refresh_metadata(producer)
        self.restored = self.generation
        for callback in self._callbacks:
            try:
                callback()
            except Exception:  # one component's failure must not stop the watch
                log.exception("a bus-reset callback failed")

    def _on_error(self, error: KafkaError) -> None:
        """The client's error callback (served by :meth:`_until_next_look`): a lost connection
        ends the wait for the next look. (A refused login is the process's other clients' to
        report: this one looks only once another has logged in.)"""
        if error.code() in CONNECTION_LOST:
            self._lost.set()

    def _run(self) -> None:
        self.check_now()
        while self._until_next_look():
            self.check_now()

    def _until_next_look(self) -> bool:
        """Wait :attr:`every_s`, serving the client's error callback, or less if the connection
        to the bus is lost meanwhile; False once the watch is closed. (The look after a lost
        connection waits, up to its bound, for a broker to answer again; while the bus stays
        away, looks that went unanswered are not hurried: each failed attempt to reconnect is a
        lost connection too.)"""
        deadline = time.monotonic() + self.every_s
        while not self._stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or (self._lost.is_set() and self._answered):
                self._lost.clear()
                return True
            self._lost.clear()
            self._admin.poll(min(left, SERVE_EVERY_S))
        return False

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)

    def release(self) -> None:
        """Give back a watch from :func:`shared_watch`; the last user stops it."""
        with _SHARED_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            _SHARED.pop(_key(self.settings), None)
        self.close()


_SHARED: dict[tuple[str, str], BusWatch] = {}
_SHARED_LOCK = threading.Lock()


def _key(settings: Settings) -> tuple[str, str]:
    return settings.bootstrap_servers, settings.topic_prefix


def shared_watch(settings: Settings, look_now: bool = False) -> BusWatch:
    """This process's running watch of the bus ``settings`` name; :meth:`BusWatch.release` it when
    done.

    ``look_now``: the watch looks at the cluster before this returns, not only on its thread.
    A service that says it is ready after taking its watch passes it: a reset between its ready
    and the thread's first look was seen as the cluster it started on, so nothing rewound (a
    chaos run's broker restart once fell there). An agent leaves it off: it must not wait on an
    unreachable bus (the look waits at most 2 s, and concludes nothing if the bus does not
    answer)."""
    with _SHARED_LOCK:
        watch = _SHARED.get(_key(settings))
        if watch is None:
            watch = _SHARED[_key(settings)] = BusWatch(settings)
        watch._users += 1
    watch.start()
    if look_now:
        watch.check_now()
    return watch


def refresh_metadata(client: Producer | Consumer, timeout_s: float = 2.0) -> None:
    """Ask for cluster metadata now: a producer learns that its topics exist again at once.

    Left alone, librdkafka notices only at its next periodic refresh, and
    holds the records it buffered for the lost topics until then (about 1-2 s).
    """
    try:
        client.list_topics(timeout=timeout_s)
    except (KafkaException, RuntimeError) as exc:  # RuntimeError: a client closed meanwhile
        log.debug("metadata refresh after a bus reset: %s", exc)


Record = tuple[str, bytes, bytes]  # topic, key, value


def deliver_through_reset(
    producer: Producer,
    watch: BusWatch,
    records: list[Record],
    within_s: float = TOPICS_BACK_WITHIN_S,
) -> None:
    """Deliver ``records`` (topic, key, value), even while a bus reset has taken their topics.

    Right after a reset a topic may be one the watch is still re-creating,
    or one it has not yet seen missing: a producer whose metadata says the
    topic is gone refuses its records at once ("Unknown topic"), and one that
    takes them has them fail on delivery. The controller once died of the
    first, writing its epoch claim in a rebalance a broker roll began before
    the topics were back; the second lost the record silently. So every
    record is confirmed delivered; one refused or failed for a missing topic
    is tried again once the watch has looked (it re-creates what is missing)
    and the producer's metadata is fresh, for at most ``within_s``. Any other
    failure, or the bound, raises BusError (TopicMissing) naming the topic.
    """
    deadline = time.monotonic() + within_s
    pending = list(records)
    while True:
        failed = _deliver(producer, pending, max(0.1, deadline - time.monotonic()))
        if not failed:
            return
        pending = [record for record, _ in failed]
        for (topic, _, _), error in failed:
            if error.code() not in MISSING_TOPIC:  # named as itself, not as the first failure
                raise BusError(f"cannot write to {topic}: {error.str()} ({error.code()})")
        (topic, _, _), error = failed[0]
        if time.monotonic() >= deadline:
            raise _topics_not_back(topic, error, within_s)
        _wait_for_topics(producer, watch, deadline)


def produce_through_reset(
    producer: Producer,
    watch: BusWatch | None,
    topic: str,
    within_s: float = TOPICS_BACK_WITHIN_S,
    **record,
) -> None:
    """``producer.produce(topic, **record)``, even while a bus reset has taken the topic.

    A producer whose metadata saw the topic gone before a watch made it
    again refuses the record at once ("Unknown topic"); raised, that
    refusal ended whoever wrote (a worker's report, a grouper's group, a
    dead letter). A refused record is produced again once ``watch`` has
    looked (it re-creates what is missing; with no watch, another process's
    does) and the producer's metadata is fresh, and this time waited for:
    the broker can still answer it for a missing topic while the topic is
    being made. For at most ``within_s``, then TopicMissing naming the
    topic. A record taken at once is not waited for (its ``on_delivery``
    says how it went), so the common path costs nothing.
    """
    refused = produce_or_refused(producer, topic, **record)
    if refused is None:
        return
    deadline = time.monotonic() + within_s
    on_delivery = record.pop("on_delivery", None)
    while True:
        if time.monotonic() >= deadline:
            raise _topics_not_back(topic, refused, within_s)
        _wait_for_topics(producer, watch, deadline)
        left_s = max(0.1, deadline - time.monotonic())
        error, message = _produce_and_wait(producer, topic, record, left_s)
        if error is None or error.code() not in MISSING_TOPIC:
            if on_delivery is not None and message is not None:
                on_delivery(error, message)
            return
        refused = error


def _wait_for_topics(producer: Producer, watch: BusWatch | None, deadline: float) -> None:
    """Between two tries of a write a missing topic refused or failed: the watch looks (it
    re-creates what is missing; with none, another process's does) and the topics are back, then
    the producer's metadata is made fresh."""
    if watch is not None:
        watch.check_now()
        watch.wait_restored(max(0.0, deadline - time.monotonic()))
    refresh_metadata(producer)
    time.sleep(RETRY_PAUSE_S)


def _topics_not_back(topic: str, error: KafkaError, within_s: float) -> TopicMissing:
    return TopicMissing(
        f"cannot write to {topic}: {error.str()} for {within_s:.0f} s "
        "(the bus was reset and its topics are not back)"
    )


def _produce_and_wait(
    producer: Producer, topic: str, record: dict, timeout_s: float
) -> tuple[KafkaError | None, object]:
    """Produce one record and flush: (None, message) delivered, (error, message) failed, (error,
    None) refused for a missing topic (any other refusal raises); BusError if it is still
    undelivered after ``timeout_s``."""
    outcome: list[tuple[KafkaError | None, object]] = []
    refused = produce_or_refused(
        producer, topic, on_delivery=lambda e, m: outcome.append((e, m)), **record
    )
    if refused is not None:
        return refused, None
    producer.flush(timeout_s)
    if not outcome:
        raise BusError(f"a record for {topic} still undelivered after {timeout_s:.0f} s")
    return outcome[0]


def _deliver(
    producer: Producer, records: list[Record], timeout_s: float
) -> list[tuple[Record, KafkaError]]:
    """Produce and flush ``records``; the ones refused or failed, with their errors."""
    failed: list[tuple[Record, KafkaError]] = []
    delivered: list[Record] = []

    def outcome(record: Record):
        def report(error, _message):
            if error is None:
                delivered.append(record)
            else:
                failed.append((record, error))

        return report

    for record in records:
        topic, key, value = record
        try:
            producer.produce(topic, key=key, value=value, on_delivery=outcome(record))
        except KafkaException as exc:
            failed.append((record, exc.args[0]))
    producer.flush(timeout_s)
    if len(failed) + len(delivered) < len(records):
        raise BusError(f"records for {records[0][0]} still undelivered after {timeout_s:.0f} s")
    return failed


class Rewinder:
    """Moves a consumer back to the beginning of its partitions once per bus reset.

    Call :meth:`check` from the thread that polls the consumer, before each
    poll. A reset empties every partition, so a consumer left at its old
    position would wait past records written to the new topics (or, if it
    asked before they existed, be reset by librdkafka, perhaps after some).
    With a group (``group=True``) it seeks, leaving the group's assignment
    alone; otherwise it assigns the same partitions again. Once the reset's
    topics are back, a later check refreshes the consumer's metadata: left
    alone, librdkafka fetches from the re-created topics only 0.4-0.9 s later
    (measured on the embedded broker; 4-41 ms refreshed).
    """

    def __init__(self, consumer: Consumer, watch: BusWatch, group: bool = False):
        self._consumer = consumer
        self._watch = watch
        self._group = group
        self._seen = watch.generation
        self._refresh_due = False

    def check(self) -> bool:
        """True if the bus was reset since the last check (the consumer is now at the beginning)."""
        if self._watch.generation == self._seen:
            self._refresh_if_back()
            return False
        self._seen = self._watch.generation
        self._refresh_due = True
        # offset 0, not OFFSET_BEGINNING: a reset's topics are new, so they begin at 0, and a
        # logical offset is looked up first, which waits 500 ms where the partition's leader is
        # not known yet (librdkafka's offset query timer) and the first time a reader rewinds
        partitions = [
            TopicPartition(tp.topic, tp.partition, FIRST_OFFSET)
            for tp in self._consumer.assignment()
        ]
        if not self._group:
            self._consumer.assign(partitions)
        else:
            self._seek(partitions)
        self._refresh_if_back()
        return True

    def _seek(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            try:
                self._consumer.seek(tp)
            # not fetching yet: it starts from the (lost) committed offset, i.e. the beginning
            except KafkaException as exc:
                log.debug("seek %s[%d] to the beginning: %s", tp.topic, tp.partition, exc)

    def _refresh_if_back(self) -> None:
        if self._refresh_due and self._watch.restored >= self._seen:
            self._refresh_due = False
            refresh_metadata(self._consumer)
