"""The managed roll: the real embedded broker started again, empty, once it holds too much."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from antdt.bus.clients import CountingProducer
from antdt.embedded.broker import EmbeddedBroker
from antdt.embedded.roll import BrokerRoll


def stored(broker: EmbeddedBroker, topic: str) -> None:
    producer = CountingProducer({"bootstrap.servers": broker.bootstrap_servers})
    for i in range(50):
        producer.produce(topic, value=f"record {i}".encode())
    assert producer.undelivered_after_flush(30) == 0


def topics_of(broker: EmbeddedBroker) -> set[str]:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
    return set(admin.list_topics(timeout=10).topics)


def test_a_broker_past_the_bound_is_rolled_empty_and_its_topics_made_again(own_broker):
    stored(own_broker, "kept-until-the-roll")
    assert "kept-until-the-roll" in topics_of(own_broker)
    made_again = []
    roll = BrokerRoll(own_broker, bound_mb=1.0, recreate=lambda: made_again.append(True))
    before = own_broker.pid
    line = roll.check(now=0.0)
    assert line is not None and "roll 1" in line and "more than 1 MB" in line
    assert own_broker.pid != before and own_broker.is_running()
    assert made_again == [True] and len(roll.rolls) == 1
    assert "kept-until-the-roll" not in topics_of(own_broker), "the new broker holds no old log"


def test_a_broker_under_the_bound_is_left_and_checks_are_spaced(own_broker):
    roll = BrokerRoll(own_broker, bound_mb=100_000.0, recreate=lambda: None, every_s=5.0)
    pid = own_broker.pid
    assert roll.check(now=0.0) is None
    roll.bound_mb = 1.0
    assert roll.check(now=4.9) is None, "checked again before every_s"
    assert own_broker.pid == pid and not roll.rolls
    assert roll.check(now=5.0) is not None


def test_a_bound_that_is_not_positive_is_refused(own_broker):
    with pytest.raises(ValueError, match="positive"):
        BrokerRoll(own_broker, bound_mb=0.0, recreate=lambda: None)
