"""The sharder across a bus reset, on a broker of its own restarted empty (restarting the shared one
would break the rest): the state it writes again, its take-over after the reset, and an answer a
reset's missing topic refuses."""

from __future__ import annotations

from antdt.bus.clients import make_producer
from antdt.schemas.codec import SingleObjectCodec
from antdt.services.sharder import metrics, recovery
from antdt.services.sharder.eventlog import LogReads
from antdt.services.sharder.replay import audit_job
from antdt.services.sharder.service import SharderService
from antdt.worker.shard_client import ShardClient
from tests.refusing import RefusingProducer
from tests.services.running import running_loop
from tests.services.sharder.harness import job_log, run_workers, running_sharder
from tests.services.sharder.test_service import spec
from tests.waiting import wait_until

JOB = "job-reset"


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

    def counted(reads, job_id, *args, **kwargs):
        read_back.append(job_id)
        return read_job(reads, job_id, *args, **kwargs)

    monkeypatch.setattr(recovery, "recover_job", counted)
    with running_sharder(settings) as service:
        with ShardClient(settings, JOB, "before", dataset) as client:
            for _ in range(5):
                for shard in client.request(0, quota=1).shards:
                    client.done(0, shard.shard_id, shard.attempt)
        assert read_back == [JOB]  # its first take-over, from an empty log
        # a report the reset takes would hold its shard until its lease runs out (30 s)
        wait_until(lambda: service.jobs[JOB].core.state.doing_count == 0, timeout_s=30.0)
        resets = metrics.BUS_RESETS._value.get()
        broker.restart()
        wait_until(
            lambda: metrics.BUS_RESETS._value.get() > resets, timeout_s=30.0
        )  # written again
        again = read_job(LogReads(settings, SingleObjectCodec(), make_producer(settings)), JOB)
        assert again.from_snapshot and again.events_replayed == 0
        done = run_workers(settings, JOB, dataset, count=2)
    assert read_back == [JOB], "the take-over after the reset read the job back from the bus"
    assert sum(done.values()) + 5 >= dataset.shard_count
    report = audit_job(settings, JOB, job_log(settings, JOB), SingleObjectCodec())
    assert report.ok and report.finished, report.violations
    assert [epoch.samples_done_once for epoch in report.epochs] == [dataset.size]


def test_an_answer_refused_for_a_topic_a_reset_took_is_sent_once_it_is_back(settings, topics):
    """At a roll, the sharder's answer producer can see the assignments topic gone before the watch
    makes it again; the sharder once exited on that refusal with the only copy of the state. The
    answer is now delivered once the topic is there, and the sharder serves on."""
    dataset = spec(size=200, shard_size=20, epochs=1)
    service = SharderService(settings).start()
    refusing = service._answer_producer = RefusingProducer(service._answer_producer)
    with running_loop(service, "sharder"), ShardClient(settings, JOB, "w", dataset) as client:
        first = client.request(0, quota=1, timeout_s=10)
        client.done(0, first.shards[0].shard_id, first.shards[0].attempt)
        second = client.request(0, quota=1, timeout_s=10)
    assert refusing.refused == 1
    assert second.shards and second.shards != first.shards


def test_an_append_a_roll_refuses_has_the_state_written_again_and_the_job_finishes_once(own_bus):
    """A roll can have the sharder's log producer see the log topic gone before the watch makes it
    again; the refusal used to raise out of the append and end the sharder with the only copy of
    the state. It now fails the batch's flush, the state is written into the new bus, and the job
    finishes with every sample exactly once."""
    broker, settings = own_bus
    dataset = spec(size=400, shard_size=20, epochs=1)
    with running_sharder(settings) as service:
        with ShardClient(settings, JOB, "before", dataset) as client:
            for shard in client.request(0, quota=1).shards:
                client.done(0, shard.shard_id, shard.attempt)
        resets = metrics.BUS_RESETS._value.get()
        # the next append restarts the broker, then is refused as librdkafka refuses it
        refusing = service._log._producer = RefusingProducer(
            service._log._producer, before_refusing=broker.restart
        )
        done = run_workers(settings, JOB, dataset, count=2)
    assert refusing.refused == 1 and metrics.BUS_RESETS._value.get() > resets
    assert sum(done.values()) + 1 >= dataset.shard_count
    report = audit_job(settings, JOB, job_log(settings, JOB), SingleObjectCodec())
    assert report.ok and report.finished, report.violations
    assert [epoch.samples_done_once for epoch in report.epochs] == [dataset.size]
