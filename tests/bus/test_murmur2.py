"""Key partitioning: our murmur2 agrees with Kafka, librdkafka and aiokafka (Faust)."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from antdt.bus.clients import make_producer
from antdt.bus.murmur2 import murmur2, partition_for
from antdt.topics import topic_spec


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # vectors from Apache Kafka's UtilsTest.testMurmur2
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_kafka_reference_vectors(data, expected):
    assert murmur2(data) == expected


@given(st.binary(max_size=64))
def test_agrees_with_aiokafka(data):
    assert murmur2(data) & 0xFFFFFFFF == aiokafka_murmur2(data) & 0xFFFFFFFF


def test_rejects_zero_partitions():
    with pytest.raises(ValueError):
        partition_for("k", 0)


def test_agrees_with_librdkafka_on_a_real_broker(settings, topics):
    """Every key lands where partition_for says, so manual-assignment readers find it."""
    topic = topic_spec("shard", "assignments").full_name(settings.topic_prefix)
    partitions = topics[topic]
    landed: dict[str, int] = {}

    def record(err, message):
        assert err is None, err
        landed[message.key().decode()] = message.partition()

    producer = make_producer(settings)
    keys = [f"job-{j}/worker-{w}" for j in range(5) for w in range(40)]
    for key in keys:
        producer.produce(topic, key=key.encode(), value=b"x", on_delivery=record)
    assert producer.undelivered_after_flush(10) == 0
    assert landed == {key: partition_for(key, partitions) for key in keys}
    assert len(set(landed.values())) == partitions  # the keys really spread
