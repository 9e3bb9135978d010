"""The sharder across a bus reset, on a broker of its own restarted empty (restarting the shared one
would break the rest): the state it writes again, and its take-over after the reset."""

from __future__ import annotations

import time

import pytest

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin, make_producer
from antdt.embedded.broker import EmbeddedBroker
from antdt.schemas.codec import SingleObjectCodec
from antdt.services.sharder import metrics, recovery
from antdt.services.sharder.replay import audit_job
from antdt.settings import BrokerProfile, load_settings
from antdt.worker.shard_client import ShardClient
from tests.services.sharder.harness import job_log, run_workers, running_sharder
from tests.services.sharder.test_service import spec

JOB = "job-reset"


@pytest.fixture
def own_bus():
    with EmbeddedBroker() as broker:
        settings = load_settings(
            bootstrap_servers=broker.bootstrap_servers,
            broker_profile=BrokerProfile.EMBEDDED,
            topic_prefix="reset",
        )
        ensure_topics(make_admin(settings), settings)
        yield broker, settings


def wait_until(condition, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_after_a_reset_the_job_is_taken_over_from_the_state_held_and_finishes_exactly_once(
    own_bus, monkeypatch
):
    """The snapshot written into the emptied bus covers the events written again before it (a
    recovery reads nothing after it), and the sharder, whose partitions the reset revoked, takes
    its job over from the state it holds instead of reading it back; the job then finishes with
    every sample exactly once."""
    broker, settings = own_bus
    dataset = spec(size=600, shard_size=20, epochs=1)
    read_back: list[str] = []
    read_job = recovery.recover_job

    def counted(settings, job_id, *args, **kwargs):
        read_back.append(job_id)
        return read_job(settings, job_id, *args, **kwargs)

    monkeypatch.setattr(recovery, "recover_job", counted)
    with running_sharder(settings) as service:
        with ShardClient(settings, JOB, "before", dataset) as client:
            for _ in range(5):
                for shard in client.request(0, quota=1).shards:
                    client.done(0, shard.shard_id, shard.attempt)
        assert read_back == [JOB]  # its first take-over, from an empty log
        # a report the reset takes would hold its shard until its lease runs out (30 s)
        wait_until(lambda: service.jobs[JOB].core.state.doing_count == 0)
        resets = metrics.BUS_RESETS._value.get()
        broker.restart()
        wait_until(lambda: metrics.BUS_RESETS._value.get() > resets)  # the state written again
        again = read_job(settings, JOB, SingleObjectCodec(), make_producer(settings))
        assert again.from_snapshot and again.events_replayed == 0
        done = run_workers(settings, JOB, dataset, count=2)
    assert read_back == [JOB], "the take-over after the reset read the job back from the bus"
    assert sum(done.values()) + 5 >= dataset.shard_count
    report = audit_job(settings, JOB, job_log(settings, JOB), SingleObjectCodec())
    assert report.ok and report.finished, report.violations
    assert [epoch.samples_done_once for epoch in report.epochs] == [dataset.size]
