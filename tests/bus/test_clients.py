"""Client factories, topic creation, keyed readers and graceful shutdown on a real broker."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.admin import _wait_created, ensure_topics
from antdt.bus.clients import (
    consuming,
    drain,
    flush_or_raise,
    make_admin,
    make_consumer,
    make_producer,
    producing,
)
from antdt.bus.config import (
    FetchPace,
    admin_config,
    collected_late,
    common_config,
    consumer_config,
    describe_profile,
    fetch_wait_ms,
    producer_config,
)
from antdt.bus.readers import (
    BEGINNING,
    KeyedReader,
    commit_within,
    key_partition,
    poll_batch,
    resume_or_end,
)
from antdt.errors import BusError
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.examples import worker_metrics
from antdt.settings import BrokerProfile, load_settings
from antdt.topics import TOPICS, topic_spec


def test_producer_defaults_are_durable_and_murmur2():
    conf = producer_config(load_settings())
    assert conf["partitioner"] == "murmur2_random"
    assert conf["acks"] == "all"
    assert conf["enable.idempotence"] is True
    assert conf["allow.auto.create.topics"] is False
    assert conf["linger.ms"] <= 5


def test_embedded_producers_survive_a_broker_that_forgets_them():
    """The embedded broker loses producer ids on restart: idempotence would hang, so it is off, with
    order kept."""
    conf = producer_config(load_settings(broker_profile=BrokerProfile.EMBEDDED))
    assert conf["enable.idempotence"] is False
    assert conf["max.in.flight.requests.per.connection"] == 1
    assert conf["allow.auto.create.topics"] is False
    assert conf["reconnect.backoff.max.ms"] <= 1000


def test_embedded_clients_reconnect_soon_after_the_bootstrap_connection_drops():
    """Every fresh client's first request waits half the reconnect backoff for its second
    connection (antdt.bus.config): on the embedded profile that is librdkafka's 11 ms floor."""
    embedded = common_config(load_settings(broker_profile=BrokerProfile.EMBEDDED))
    assert embedded["reconnect.backoff.ms"] <= 22
    assert "reconnect.backoff.ms" not in common_config(load_settings())


def test_no_client_pushes_metrics_to_the_broker():
    """KIP-714's push costs the embedded broker a request about every 1.7 s per client, and nothing
    reads the metrics (docs/embedded-broker.md)."""
    for profile in BrokerProfile:
        settings = load_settings(broker_profile=profile)
        for conf in (
            producer_config(settings),
            consumer_config(settings, "g"),
            admin_config(settings),
        ):
            assert conf["enable.metrics.push"] is False


def test_embedded_profile_shortens_sessions_and_fetch_waits():
    embedded = consumer_config(load_settings(broker_profile=BrokerProfile.EMBEDDED), "g")
    kafka = consumer_config(load_settings(), "g")
    assert embedded["session.timeout.ms"] == 2000
    assert embedded["heartbeat.interval.ms"] == 200
    assert embedded["fetch.wait.max.ms"] <= 50
    assert "session.timeout.ms" not in kafka


def test_a_reader_of_replies_collected_late_stops_fetching_while_one_waits_unread():
    """On the embedded broker one record in librdkafka's queue stops the fetches; it looks again
    every fetch wait. Kafka answers a waiting fetch at once: nothing changes there."""
    embedded = load_settings(broker_profile=BrokerProfile.EMBEDDED)
    assert collected_late(embedded, FetchPace.STEADY) == {
        "queued.min.messages": 1,
        "fetch.queue.backoff.ms": fetch_wait_ms(embedded, FetchPace.STEADY),
    }
    assert collected_late(load_settings(), FetchPace.STEADY) == {}


def test_a_reader_of_replies_collected_late_reads_every_record_once_polled(settings, topics):
    """The flow control loses nothing: a burst written while nobody polls is read whole, in
    order, once the reader polls."""
    topic = topic_spec("shard", "assignments").full_name(settings.topic_prefix)
    codec = SingleObjectCodec()
    key = "job-late/worker-0"
    late = collected_late(settings, FetchPace.STEADY)
    with consuming(settings, **late) as consumer:
        consumer.assign([TopicPartition(topic, key_partition(settings, topic, key), 0)])
        with producing(settings) as producer:
            for seq in range(200):
                producer.produce(
                    topic, key=key.encode(), value=codec.encode(worker_metrics(seq=seq))
                )
        seen = []
        for _ in range(200):
            seen += [codec.decode(m.value()).seq for m in poll_batch(consumer, 500, 0.1)]
            if len(seen) >= 200:
                break
    assert seen == list(range(200))


def test_each_profile_names_the_settings_its_clients_get():
    """The line every process prints at start, which the kafka-profile demo test reads back."""
    assert describe_profile(load_settings()) == (
        "kafka clients: broker profile kafka, enable.idempotence=true, "
        "session.timeout.ms=default, fetch.wait.max.ms=100"
    )
    assert describe_profile(load_settings(broker_profile=BrokerProfile.EMBEDDED)) == (
        "kafka clients: broker profile embedded, enable.idempotence=false, "
        "session.timeout.ms=2000, fetch.wait.max.ms=25"
    )


def test_security_settings_reach_the_client(tmp_path):
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    settings = load_settings(
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="u",
        sasl_password="p",
        tls_ca_path=ca,
    )
    conf = producer_config(settings)
    assert (
        conf["security.protocol"],
        conf["sasl.mechanism"],
        conf["sasl.username"],
        conf["sasl.password"],
    ) == (
        "SASL_SSL",
        "SCRAM-SHA-256",
        "u",
        "p",
    )
    assert conf["ssl.ca.location"] == str(ca)


def test_ensure_topics_creates_every_registry_topic_idempotently(settings):
    first = ensure_topics(make_admin(settings), settings)
    second = ensure_topics(make_admin(settings), settings)
    assert first == second
    assert first == {spec.full_name(settings.topic_prefix): spec.partitions for spec in TOPICS}


def test_a_topic_whose_creation_is_not_answered_in_time_is_one_bus_error_naming_it():
    class Unanswered:
        def result(self, timeout):
            raise TimeoutError

    with pytest.raises(BusError, match="^topic t.x was not created within 2 s$"):
        _wait_created("t.x", Unanswered(), 2.0)


def test_keyed_reader_sees_only_its_key_in_order(settings, topics):
    topic = topic_spec("controller", "commands").full_name(settings.topic_prefix)
    codec = SingleObjectCodec()
    mine, other = "job-a/worker-1", "job-a/worker-2"
    with producing(settings) as producer:
        for seq in range(20):
            for key in (mine, other):
                producer.produce(
                    topic, key=key.encode(), value=codec.encode(worker_metrics(seq=seq))
                )
    with KeyedReader(settings, topic, mine, codec, start=BEGINNING) as reader:
        seen = []
        for _ in range(50):
            seen += [m.seq for m in reader.poll(0.2)]
            if len(seen) >= 20:
                break
    assert seen == list(range(20))


def test_keyed_reader_from_end_skips_history(settings, topics):
    topic = topic_spec("shard", "assignments").full_name(settings.topic_prefix)
    codec = SingleObjectCodec()
    key = "job-b/worker-0"
    with producing(settings) as producer:
        producer.produce(topic, key=key.encode(), value=codec.encode(worker_metrics(seq=1)))
    with KeyedReader(settings, topic, key, codec) as reader:
        # the end as the reader was made: no wait for librdkafka to look it up
        with producing(settings) as producer:
            producer.produce(topic, key=key.encode(), value=codec.encode(worker_metrics(seq=2)))
        seen = []
        for _ in range(50):
            seen += [m.seq for m in reader.poll(0.2)]
            if seen:
                break
    assert seen == [2]


def test_a_group_that_never_committed_resumes_at_the_end_and_commits_it(settings, topics):
    """Whoever holds the partition next starts at that end too: a record written after it is read
    by some member even if this one dies first."""
    topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    with producing(settings) as producer:
        for seq in range(3):
            producer.produce(topic, key=b"w", value=SingleObjectCodec().encode(worker_metrics(seq)))
    partition = TopicPartition(topic, key_partition(settings, topic, "w"))
    group = f"{settings.topic_prefix}.resuming"
    with consuming(settings, group) as first:
        _, end = first.get_watermark_offsets(partition, timeout=10)
        (resumed,) = resume_or_end(first, [partition])
    with consuming(settings, group) as next_holder:
        (stored,) = next_holder.committed([partition], timeout=10)
    assert resumed.offset == stored.offset == end > 0


def test_a_commit_and_a_close_the_broker_cannot_take_end_within_their_bounds(own_bus):
    """A synchronous commit would wait for the group's coordinator for good (a rebalance callback
    holding its service's loop), and so can librdkafka's close, for the commits still owed (a
    service told to stop would hang at its exit): both give up at their bounds."""
    broker, settings = own_bus
    topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    consumer = make_consumer(settings, f"{settings.topic_prefix}.stranded")
    consumer.committed([TopicPartition(topic, 0)], timeout=10)  # the group's coordinator known
    broker.stop()
    began = time.monotonic()
    with pytest.raises(BusError, match=rf"{topic}\[0\]@5 was not confirmed within 1 s"):
        commit_within(consumer, [TopicPartition(topic, 0, 5)], timeout_s=1.0)
    consumer.close(timeout_s=1.0)
    assert time.monotonic() - began < 10.0


def test_producing_flushes_everything_on_exit(settings, topics):
    topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    with producing(settings) as producer:
        for i in range(2000):
            producer.produce(topic, key=b"job", value=str(i).encode())
    with consuming(settings) as consumer:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(topics[topic])])
        values = set()
        for _ in range(100):
            values |= {m.value() for m in poll_batch(consumer, 1000, 0.2)}
            if len(values) == 2000:
                break
    assert values == {str(i).encode() for i in range(2000)}


def test_undeliverable_records_are_reported_not_lost_silently_and_counted_as_records(topic_prefix):
    """librdkafka's own length counts its queued requests too; the count said is the records'."""
    settings = load_settings(bootstrap_servers="127.0.0.1:1", topic_prefix=topic_prefix)
    producer = make_producer(settings, **{"message.timeout.ms": 60_000})
    for i in range(3):
        producer.produce("anything", value=str(i).encode())
    with pytest.raises(BusError, match=r"^3 record\(s\) still undelivered after 0.2 s$"):
        flush_or_raise(producer, timeout_s=0.2)
    assert drain(producer, timeout_s=0.1) == 3
    producer.purge()
    producer.poll(0)  # a purged record's delivery is reported (failed) at the next poll
    assert producer.in_flight == 0


def test_a_counted_record_still_gets_its_own_delivery_report(settings, topics):
    topic = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    reports = []
    with producing(settings) as producer:
        producer.produce(topic, value=b"x", key=b"k", on_delivery=lambda e, m: reports.append(e))
        producer.produce(topic, value=b"y", key=b"k")
        assert producer.in_flight == 2
        flush_or_raise(producer)
        assert producer.in_flight == 0
    assert reports == [None]
