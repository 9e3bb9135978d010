"""Dead-letter: a bad record is copied with its provenance, counted, and nothing stops."""

from __future__ import annotations

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import consuming, producing
from antdt.bus.deadletter import (
    HEADER_ERROR,
    HEADER_ERROR_TYPE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_SERVICE,
    HEADER_TOPIC,
    DeadLetter,
    SourceRecord,
)
from antdt.bus.readers import decode_or_deadletter, poll_batch
from antdt.errors import TopicMissing
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.examples import worker_metrics
from antdt.topics import topic_spec
from tests.refusing import RefusingProducer


def _read_all(settings, topic, partitions, want, timeout_polls=100):
    with consuming(settings) as consumer:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        messages = []
        for _ in range(timeout_polls):
            messages += poll_batch(consumer, 100, 0.2)
            if len(messages) >= want:
                break
    return messages


def test_bad_records_go_to_the_dead_letter_topic_with_provenance(settings, topics):
    source = topic_spec("worker", "metrics").full_name(settings.topic_prefix)
    dlq_topic = topic_spec("", "deadletter").full_name(settings.topic_prefix)
    codec = SingleObjectCodec()
    good = worker_metrics()
    with producing(settings) as producer:
        producer.produce(
            source, key=b"job-x", value=codec.encode(good), headers=[("trace", b"abc")]
        )
        producer.produce(source, key=b"job-x", value=b"garbage", headers=[("trace", b"def")])
        producer.produce(source, key=b"job-x", value=None)
    consumed = _read_all(settings, source, topics[source], want=3)
    assert len(consumed) == 3
    with producing(settings) as producer:
        deadletter = DeadLetter(producer, dlq_topic, "test-service")
        decoded = [decode_or_deadletter(m, codec, deadletter) for m in consumed]
    assert decoded[0] == good
    assert decoded[1:] == [None, None]
    assert deadletter.count == 2

    dead = _read_all(settings, dlq_topic, topics[dlq_topic], want=2)
    assert [m.value() for m in dead] == [b"garbage", None]
    headers = dict(dead[0].headers())
    assert headers["trace"] == b"def"  # the original headers travel too
    assert headers[HEADER_TOPIC] == source.encode()
    assert int(headers[HEADER_PARTITION]) == consumed[1].partition()
    assert int(headers[HEADER_OFFSET]) == consumed[1].offset()
    assert headers[HEADER_SERVICE] == b"test-service"
    assert b"C3 01 marker" in headers[HEADER_ERROR]
    assert headers[HEADER_ERROR_TYPE] == b"CodecError"
    assert dead[0].key() == b"job-x"


def test_a_dead_letter_refused_for_a_topic_a_reset_took_is_sent_once_it_is_back(settings, topics):
    """At a broker roll a service's producer can see the dead-letter topic gone before a watch
    makes it again; that refusal used to end the service (the sharder, with the only copy of its
    state)."""
    dlq_topic = topic_spec("", "deadletter").full_name(settings.topic_prefix)
    source = SourceRecord("antdt.shard.progress", 2, 7, b"job-x", b"bad", ())
    with producing(settings) as producer:
        refusing = RefusingProducer(producer)
        deadletter = DeadLetter(refusing, dlq_topic, "test-service")
        deadletter.send(source, "a report the core rejected")
    assert refusing.refused == 1 and deadletter.count == 1
    [dead] = _read_all(settings, dlq_topic, topics[dlq_topic], want=1)
    assert dead.value() == b"bad"
    assert int(dict(dead.headers())[HEADER_OFFSET]) == 7


def test_a_dead_letter_topic_that_never_comes_back_is_a_clear_error(settings):
    """The wait is bounded: past it the service stops with the topic named, not a raw refusal."""
    dlq_topic = topic_spec("", "deadletter").full_name(settings.topic_prefix)
    with producing(settings) as producer:
        deadletter = DeadLetter(
            RefusingProducer(producer, times=10**6),
            dlq_topic,
            "test-service",
            topic_back_within_s=0.3,
        )
        with pytest.raises(TopicMissing, match=f"cannot write to {dlq_topic}"):
            deadletter.send(SourceRecord("src", 0, 1, None, b"bad", ()), "bad")
    assert deadletter.count == 0
