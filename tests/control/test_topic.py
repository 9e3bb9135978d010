"""The control-config topic: who a change is for, and following the topic through the real
broker."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from antdt.bus.clients import producing
from antdt.control.topic import ControlFollower, changes_for, control_topic
from antdt.errors import BusError, ConfigError
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.examples import worker_metrics
from antdt.schemas.models import ControlComponent as Component
from antdt.schemas.models import ControlConfig

CODEC = SingleObjectCodec()


def change(config_id, changes, component=Component.MONITOR, job=None):
    return ControlConfig(
        config_id=config_id,
        job_id=job,
        component=component,
        changes=changes,
        issued_by="t",
        issued_at=datetime.now(UTC),
    )


def test_a_component_takes_its_own_prefixed_keys():
    record = change("1", {"monitor.k": "3", "monitor.window_s": "20"})
    assert changes_for(record, Component.MONITOR) == {"k": "3", "window_s": "20"}
    assert changes_for(record, Component.CONTROLLER) is None


def test_all_is_split_between_components():
    record = change("1", {"monitor.k": "3", "controller.dry_run": "true"}, Component.ALL)
    assert changes_for(record, Component.MONITOR) == {"k": "3"}
    assert changes_for(record, Component.CONTROLLER) == {"dry_run": "true"}
    assert changes_for(record, Component.SHARDER) == {}


def test_a_record_for_one_component_with_foreign_keys_is_refused():
    with pytest.raises(
        ConfigError, match="controller.dry_run: a MONITOR change takes monitor.\\* keys only"
    ):
        changes_for(
            change("1", {"monitor.k": "3", "controller.dry_run": "true"}), Component.MONITOR
        )


def test_the_follower_reads_the_history_then_follows(settings, topics):
    topic = control_topic(settings)
    with producing(settings) as producer:
        producer.produce(topic, key=b"*", value=CODEC.encode(change("a", {"monitor.k": "3"})))
        producer.produce(topic, key=b"*", value=b"not avro")
        producer.produce(topic, key=b"*", value=CODEC.encode(worker_metrics()))
        producer.produce(
            topic, key=b"job", value=CODEC.encode(change("b", {"monitor.k": "4"}, job="job"))
        )
    follower = ControlFollower(settings)
    try:
        assert [c.config_id for c in follower.catch_up()] == ["a", "b"]
        assert follower.refused == 2
        with producing(settings) as producer:
            producer.produce(topic, key=b"*", value=CODEC.encode(change("c", {"monitor.k": "5"})))
        seen = []
        for _ in range(100):
            seen += follower.poll(timeout_s=0.1)
            if seen:
                break
        assert [c.config_id for c in seen] == ["c"]
    finally:
        follower.close()


def test_reading_through_a_change_drops_nothing_read_with_it(settings, topics):
    """A controller reads on until its epoch claim comes back; a claim written just after it, in
    the same fetch, must still be seen (dropped, the controller later claimed an epoch another
    one held: the suite's two-controller test caught it)."""
    topic = control_topic(settings)
    follower = ControlFollower(settings)
    try:
        follower.catch_up()
        with producing(settings) as producer:
            for config_id in ("ours", "theirs"):
                value = CODEC.encode(change(config_id, {"monitor.k": "3"}))
                producer.produce(topic, key=b"*", value=value)
        seen = [c.config_id for c in follower.read_through("ours", timeout_s=30)]
        assert seen[0] == "ours"
        for _ in range(100):
            if len(seen) == 2:
                break
            seen += [c.config_id for c in follower.poll(timeout_s=0.1)]
        assert seen == ["ours", "theirs"]
        with pytest.raises(BusError, match="never did not come back within 1 s"):
            follower.read_through("never", timeout_s=1)
    finally:
        follower.close()
