"""The bus watch on a real broker that restarts empty (each test has its own broker: restarting the
shared one would break the rest)."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from antdt.bus.admin import ensure_topics, partition_counts
from antdt.bus.clients import make_admin, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.readers import BEGINNING, assign_now, poll_batch
from antdt.bus.watch import (
    FIRST_OFFSET,
    BusWatch,
    Rewinder,
    deliver_through_reset,
    produce_through_reset,
    shared_watch,
)
from antdt.embedded.broker import free_port
from antdt.errors import AuthenticationError, BusError, TopicMissing
from antdt.settings import BrokerProfile, load_settings
from antdt.topics import TOPICS
from tests.waiting import wait_until


@pytest.fixture
def bus(own_broker):
    settings = load_settings(
        bootstrap_servers=own_broker.bootstrap_servers,
        broker_profile=BrokerProfile.EMBEDDED,
        topic_prefix="watched",
    )
    ensure_topics(make_admin(settings), settings)
    return settings


def registry_counts(settings) -> dict[str, int]:
    return {spec.full_name(settings.topic_prefix): spec.partitions for spec in TOPICS}


def test_a_restarted_broker_is_noticed_and_its_topics_recreated_with_the_registry_counts(
    own_broker, bus
):
    watch = BusWatch(bus, every_s=0.05).start()
    called = threading.Event()
    watch.on_reset(called.set)
    try:
        wait_until(lambda: watch.cluster_id == own_broker.cluster_id)
        old_id = own_broker.cluster_id
        own_broker.restart()
        assert own_broker.cluster_id != old_id
        assert called.wait(10), "the reset callback was not called"
        assert watch.generation == 1 and watch.cluster_id == own_broker.cluster_id
        counts = registry_counts(bus)
        assert partition_counts(make_admin(bus), list(counts)) == counts
    finally:
        watch.close()


def test_a_lost_connection_is_looked_at_again_at_once_not_at_the_next_look(own_broker, bus):
    """The watch's own connection dropping (the broker went away) ends its wait: the restarted
    broker's reset is seen when it answers (0-18 ms in bench/reset_pickup_bench.py, up to half a
    second before). Here the next periodic look is a minute away, past the wait's bound."""
    watch = BusWatch(bus, every_s=60.0).start()
    try:
        wait_until(lambda: watch.cluster_id == own_broker.cluster_id)
        own_broker.restart()
        wait_until(lambda: watch.restored == 1 and watch.cluster_id == own_broker.cluster_id)
    finally:
        watch.close()
    assert not watch._thread.is_alive(), "a closed watch's thread ended within its join"


def test_a_lost_connection_hurries_the_next_look_only_after_an_answered_one():
    """While the bus stays away every failed reconnect is a lost connection too: looks that went
    unanswered keep their pace instead of following one another back to back."""
    settings = load_settings(bootstrap_servers=f"127.0.0.1:{free_port()}", topic_prefix="w")
    connected = BusWatch(settings, every_s=60.0)
    away = BusWatch(settings, every_s=0.2)
    try:
        connected._answered = True
        connected._lost.set()
        assert connected._until_next_look() and not connected._lost.is_set()
        away._lost.set()
        began = time.monotonic()
        assert away._until_next_look()
        assert time.monotonic() - began >= 0.2
    finally:
        connected.close()
        away.close()


def test_a_deleted_topic_on_the_same_cluster_is_recreated(bus):
    watch = BusWatch(bus, every_s=0.05).start()
    try:
        wait_until(lambda: watch.cluster_id is not None)
        name = f"{bus.topic_prefix}.shard.log"
        admin: AdminClient = make_admin(bus)
        admin.delete_topics([name])[name].result(10)
        wait_until(lambda: watch.generation == 1)
        # the watch counts the reset first, then re-creates the topics
        wait_until(lambda: live_count(admin, name) is not None)
        assert live_count(admin, name) == registry_counts(bus)[name]
    finally:
        watch.close()


def producer_told_topic_is_gone(settings, admin: AdminClient, name: str):
    """A producer that wrote to ``name``, then learnt that the topic is gone, as the controller's
    had at a broker roll: it refuses the topic's records at once. (librdkafka believes a topic
    gone only once its handle is older than ``topic.metadata.propagation.max.ms``, 30 s by
    default, so the stand-in for a long-lived producer makes that short.)"""
    producer = make_producer(settings, **{"topic.metadata.propagation.max.ms": 10})
    producer.produce(name, key=b"job", value=b"before")
    assert producer.undelivered_after_flush(10) == 0
    admin.delete_topics([name])[name].result(10)
    wait_until(lambda: live_count(admin, name) is None)
    wait_until(lambda: refuses(producer, name))
    return producer


def refuses(producer, name: str) -> bool:
    """Whether ``producer``, having asked for ``name``'s metadata, refuses a record for it at once
    (a record it takes instead fails when the metadata says the topic is gone)."""
    producer.list_topics(topic=name, timeout=5)
    try:
        producer.produce(name, key=b"job", value=b"probe")
    except KafkaException as exc:
        return "Unknown topic" in str(exc)
    return False


def test_a_record_for_a_topic_a_reset_took_is_written_once_the_topic_is_back(bus):
    """The controller once died of that refusal, writing its epoch claim in a rebalance before a
    broker roll's topics were back."""
    name = f"{bus.topic_prefix}.shard.log"
    admin: AdminClient = make_admin(bus)
    producer = producer_told_topic_is_gone(bus, admin, name)
    watch = BusWatch(bus)  # not started: the write itself asks it to look
    deliver_through_reset(producer, watch, [(name, b"job", b"written")], within_s=30)
    assert watch.generation == 1 and watch.restored == 1
    partitions = registry_counts(bus)[name]
    assert live_count(admin, name) == partitions
    consumer = make_consumer(bus, pace=FetchPace.LOW_LATENCY)
    try:
        assign_now(consumer, [TopicPartition(name, p, BEGINNING) for p in range(partitions)])
        seen = []
        wait_until(
            lambda: (
                seen.extend(m.value() for m in poll_batch(consumer, 100, 0.05))
                or b"written" in seen
            )
        )
    finally:
        consumer.close()


#: The two ways to write through a reset, each given a record it cannot write within 0.5 s.
WRITERS = {
    "deliver": lambda producer, watch, name: deliver_through_reset(
        producer, watch, [(name, b"job", b"lost")], within_s=0.5
    ),
    "produce": lambda producer, watch, name: produce_through_reset(
        producer, watch, name, within_s=0.5, key=b"job", value=b"lost"
    ),
}


@pytest.mark.parametrize("write", WRITERS.values(), ids=WRITERS.keys())
def test_a_write_whose_topic_never_comes_back_fails_naming_it(bus, monkeypatch, write):
    import antdt.bus.watch as watch_module

    name = f"{bus.topic_prefix}.shard.log"
    producer = producer_told_topic_is_gone(bus, make_admin(bus), name)
    watch = BusWatch(bus)
    monkeypatch.setattr(watch, "check_now", lambda: False)  # a watch that cannot put it back
    monkeypatch.setattr(watch_module, "RETRY_PAUSE_S", 0.01)
    with pytest.raises(TopicMissing, match=f"cannot write to {name}"):
        write(producer, watch, name)


def test_a_record_produced_for_a_topic_a_reset_took_goes_out_once_the_topic_is_back(bus):
    """What a worker's report, a grouper's answer, a marker and a dead letter go through: the
    refusal once raised into whoever wrote (a training rank, a service)."""
    name = f"{bus.topic_prefix}.shard.progress"
    producer = producer_told_topic_is_gone(bus, make_admin(bus), name)
    watch = BusWatch(bus)  # not started: the write itself asks it to look
    outcomes = []
    produce_through_reset(
        producer,
        watch,
        name,
        within_s=30,
        key=b"job",
        value=b"written",
        on_delivery=lambda e, m: outcomes.append(e),
    )
    assert producer.undelivered_after_flush(10) == 0 and outcomes == [None]
    assert watch.generation == 1 and watch.restored == 1


def live_count(admin: AdminClient, name: str) -> int | None:
    """The topic's partition count, None while it does not exist."""
    try:
        return partition_counts(admin, [name])[name]
    except BusError:
        return None


def test_nothing_is_noticed_while_the_bus_stays_the_same(bus):
    watch = BusWatch(bus, every_s=0.01)
    for _ in range(20):
        assert watch.check_now() is False
    assert watch.generation == 0 and watch.cluster_id is not None


def test_a_record_buffered_during_the_restart_is_delivered_and_read_from_offset_zero(
    own_broker, bus
):
    """The consumer was at offset 5 of the old topic; the new one holds fewer records: without the
    rewind it would skip them."""
    topic = f"{bus.topic_prefix}.control.config"
    producer = make_producer(bus)
    for i in range(5):
        producer.produce(topic, key=b"k", value=b"old %d" % i, partition=0)
    assert producer.undelivered_after_flush(10) == 0
    consumer = make_consumer(bus, pace=FetchPace.LOW_LATENCY)
    assign_now(consumer, [TopicPartition(topic, 0, BEGINNING)])
    seen = []
    wait_until(
        lambda: seen.extend(m.value() for m in poll_batch(consumer, 100, 0.05)) or len(seen) == 5
    )
    # looked at before the restart: a watch whose first look is still to come would take the
    # restarted cluster for the one it started on
    watch = shared_watch(bus, look_now=True)
    assert watch.cluster_id == own_broker.cluster_id
    rewinder = Rewinder(consumer, watch)
    try:
        own_broker.restart()
        # buffered: the topic does not exist yet
        producer.produce(topic, key=b"k", value=b"during", partition=0)
        wait_until(lambda: watch.generation == 1)
        producer.produce(topic, key=b"k", value=b"after", partition=0)
        undelivered = producer.undelivered_after_flush(10)
        assert undelivered == 0, "the buffered record was not delivered after the reset"
        assert rewinder.check() is True and rewinder.check() is False
        after = []
        wait_until(
            lambda: (
                after.extend(m.value() for m in poll_batch(consumer, 100, 0.05)) or len(after) >= 2
            )
        )
        assert after == [b"during", b"after"]
    finally:
        consumer.close()
        watch.release()


def spy_on_refreshes(monkeypatch) -> list:
    """The clients :func:`antdt.bus.watch.refresh_metadata` is called for, in order."""
    from antdt.bus import watch as watch_module

    refreshed, original = [], watch_module.refresh_metadata

    def spy(client, timeout_s: float = 2.0) -> None:
        refreshed.append(client)
        original(client, timeout_s)

    monkeypatch.setattr(watch_module, "refresh_metadata", spy)
    return refreshed


def test_a_producer_kept_fresh_is_refreshed_once_the_topics_are_back(own_broker, bus, monkeypatch):
    """Left alone, librdkafka holds what a producer sends to a re-created topic for 1-2 s."""
    refreshed = spy_on_refreshes(monkeypatch)
    producer = make_producer(bus)
    watch = BusWatch(bus).start()
    try:
        wait_until(lambda: watch.cluster_id is not None)
        watch.keep_fresh(producer)
        own_broker.restart()
        wait_until(lambda: watch.restored == 1)
        assert refreshed == [producer]
        watch.forget(producer)
        own_broker.restart()
        wait_until(lambda: watch.restored == 2)
        assert refreshed == [producer]
    finally:
        watch.close()


def test_a_rewound_reader_refreshes_its_metadata_once_the_topics_are_back(
    own_broker, bus, monkeypatch
):
    """On its own thread, at the first check after the topics are back (librdkafka would fetch
    from the new topics 0.4-0.9 s later otherwise), and once per reset."""
    from antdt.bus import watch as watch_module

    refreshed = spy_on_refreshes(monkeypatch)
    topic = f"{bus.topic_prefix}.control.config"
    consumer = make_consumer(bus, pace=FetchPace.LOW_LATENCY)
    assign_now(consumer, [TopicPartition(topic, 0, BEGINNING)])
    watch = BusWatch(bus)  # checked by hand: the reset is seen before its topics are back
    rewinder = Rewinder(consumer, watch)

    def not_yet(*_args, **_kwargs):
        raise BusError("the topics cannot be made yet")

    try:
        watch.check_now()
        own_broker.restart()
        monkeypatch.setattr(watch_module, "ensure_topics", not_yet)
        watch.check_now()
        assert watch.generation == 1 and watch.restored == 0
        assert rewinder.check() is True and refreshed == []
        assert rewinder.check() is False and refreshed == []
        monkeypatch.undo()
        refreshed = spy_on_refreshes(monkeypatch)
        watch.check_now()  # now they are
        assert watch.restored == watch.generation == 1
        assert rewinder.check() is False and refreshed == [consumer]
        assert rewinder.check() is False and refreshed == [consumer]
    finally:
        consumer.close()
        watch.close()


class AssignRecorder:
    """What a rewind asks of its consumer: its assignment, the partitions it assigns or seeks."""

    def __init__(self, partitions: list[TopicPartition]):
        self.partitions, self.assigned, self.sought = partitions, [], []

    def assignment(self) -> list[TopicPartition]:
        return self.partitions

    def assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned.append([(tp.topic, tp.partition, tp.offset) for tp in partitions])

    def seek(self, tp: TopicPartition) -> None:
        self.sought.append((tp.topic, tp.partition, tp.offset))

    def list_topics(self, timeout: float) -> None:
        return None


@pytest.mark.parametrize("group", [False, True])
def test_a_rewind_starts_the_new_topics_at_offset_0_not_at_a_beginning_looked_up(group):
    """A logical beginning is looked up first, and librdkafka waits 500 ms to look it up where the
    partition's leader is not known yet, as at a reader's first rewind (the first record read
    after the first restart of bench/reset_pickup_bench.py came 500-510 ms after it was sent; 3-10
    ms from offset 0). A reset's topics are new, so they begin at 0."""
    watch = BusWatch(load_settings(bootstrap_servers="127.0.0.1:1", topic_prefix="w"))
    consumer = AssignRecorder([TopicPartition("w.control.config", 0), TopicPartition("w.x", 2)])
    rewinder = Rewinder(consumer, watch, group=group)
    watch.generation = watch.restored = 1
    assert rewinder.check() is True
    expected = [("w.control.config", 0, FIRST_OFFSET), ("w.x", 2, FIRST_OFFSET)]
    assert FIRST_OFFSET == 0
    assert (consumer.sought if group else consumer.assigned) == (expected if group else [expected])


def test_shared_watches_are_one_per_bus_and_stop_with_their_last_user(bus):
    first, second = shared_watch(bus), shared_watch(bus)
    assert first is second
    first.release()
    assert first._thread.is_alive()
    second.release()
    first._thread.join(5)
    assert not first._thread.is_alive()
    third = shared_watch(bus)
    assert third is not first
    third.release()


def test_a_reader_that_saw_a_reset_can_wait_until_the_topics_are_back(monkeypatch):
    """The generation moves before the topics are re-created (so no reader skips a record written
    to them); a component that re-publishes the only copy of its state waits for them."""
    import antdt.bus.watch as watch_module

    watch = BusWatch(load_settings(bootstrap_servers="127.0.0.1:1", topic_prefix="w"))
    attempts = []

    def ensure(admin, settings):
        attempts.append(1)
        if len(attempts) == 1:
            raise BusError("the broker is still starting")

    monkeypatch.setattr(watch_module, "ensure_topics", ensure)
    monkeypatch.setattr(watch, "_reset_reason", lambda: "cluster id a became b")
    assert watch.check_now()
    assert watch.generation == 1 and watch.restored == 0
    assert not watch.wait_restored(0.1)
    monkeypatch.setattr(watch, "_reset_reason", lambda: None)
    assert not watch.check_now()  # no new reset; the unfinished restore is done now
    assert watch.wait_restored(0.1) and watch.restored == 1 and len(attempts) == 2


def test_a_process_starting_during_a_reset_finds_its_topic_once_it_is_back(monkeypatch):
    """It used to die at once on "topic ... does not exist"; a topic missing for good still ends
    it, after the bound."""
    import antdt.bus.readers as readers

    looks = []

    def counts(admin, names):
        looks.append(names)
        if names == ["back.refused"]:
            raise AuthenticationError("the broker refused the credentials")
        if len(looks) < 3 or names == ["back.never"]:
            raise TopicMissing(f"topic {names[0]} does not exist")
        return {names[0]: 3}

    monkeypatch.setattr(readers, "partition_counts", counts)
    settings = load_settings(bootstrap_servers="127.0.0.1:1", topic_prefix="back")
    assert readers.key_partition(settings, "back.topic", b"job", within_s=5) in range(3)
    assert len(looks) == 3
    with pytest.raises(TopicMissing, match="does not exist"):
        readers.key_partition(settings, "back.never", b"job", within_s=0.6)
    began = time.monotonic()  # anything else is not looked for again
    with pytest.raises(AuthenticationError):
        readers.key_partition(settings, "back.refused", b"job", within_s=30)
    assert time.monotonic() - began < 5
