"""The sharder service on the real embedded broker: serving, redelivery, recovery, fencing."""

from __future__ import annotations

import signal
import threading
import time

import pytest
from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from antdt.bus.clients import consuming, make_producer
from antdt.bus.deadletter import HEADER_ERROR
from antdt.bus.readers import assign_now, poll_batch
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import AssignmentStatus, DatasetSpec, ShardCommit, ShardState
from antdt.schemas.models import ProgressKind as K
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.core import CoreConfig
from antdt.services.sharder.eventlog import LogReads, LogWriter, log_topic
from antdt.services.sharder.recovery import recover_job, take_over
from antdt.services.sharder.service import SharderConfig, SharderService
from antdt.services.sharder.state import fold
from antdt.topics import topic_spec
from antdt.worker.shard_client import ShardClient
from tests.services.running import running_loop
from tests.services.sharder.harness import (
    accepted_done_counts,
    assert_exactly_once,
    job_log,
    run_workers,
    running_sharder,
    sharder_process,
)
from tests.services.sharder.helpers import JOB, report


def spec(size=2000, shard_size=50, epochs=2, lease_s=30.0) -> DatasetSpec:
    return DatasetSpec(
        name="it",
        size=size,
        shard_size=shard_size,
        epochs=epochs,
        shuffle_seed=3,
        max_attempts=5,
        lease_s=lease_s,
    )


def test_workers_train_every_sample_exactly_once(settings, topics):
    dataset = spec()
    with running_sharder(settings, SharderConfig(snapshot_every_events=100)):
        done = run_workers(settings, "job-a", dataset, count=4)
    assert sum(done.values()) == dataset.shard_count * dataset.epochs
    events = job_log(settings, "job-a")
    state = assert_exactly_once("job-a", dataset, events)
    assert state.stats.stale_writer == state.stats.duplicate_seq == state.stats.seq_gaps == 0


def test_several_jobs_are_served_at_once(settings, topics):
    datasets = {"job-x": spec(size=600, epochs=1), "job-y": spec(size=900, shard_size=30, epochs=2)}
    with running_sharder(settings):
        threads = [
            threading.Thread(target=run_workers, args=(settings, job, ds, 2), daemon=True)
            for job, ds in datasets.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    for job, dataset in datasets.items():
        assert_exactly_once(job, dataset, job_log(settings, job))


def test_redelivered_reports_change_nothing(settings, topics):
    dataset = spec(size=200, epochs=1)
    with running_sharder(settings), ShardClient(settings, "job-r", "w0", dataset) as client:
        answer = client.request(0, quota=2)
        shard = answer.shards[0]
        for _ in range(3):  # at-least-once delivery: the same report several times
            client.done(0, shard.shard_id, shard.attempt)
        client.request(0, quota=2)  # answered only after the DONEs were processed
        for _ in range(3):
            again = client.request(0, quota=2)
            assert again.shards == client.request(0, quota=2).shards
    counts, _ = accepted_done_counts("job-r", job_log(settings, "job-r"))
    assert counts[(0, shard.shard_id)] == 1
    granted = [e for e in job_log(settings, "job-r") if e.transition is T.GRANTED]
    assert len(granted) == len({(e.shard_id, e.attempt) for e in granted}) == 3


def test_bad_input_goes_to_the_dead_letter_topic_and_service_keeps_serving(settings, topics):
    dataset = spec(size=100, epochs=1)
    progress = topic_spec("shard", "progress").full_name(settings.topic_prefix)
    deadletter = topic_spec("", "deadletter").full_name(settings.topic_prefix)
    with running_sharder(settings), ShardClient(settings, "job-d", "w0", dataset) as client:
        assert client.request(0).status is AssignmentStatus.GRANTED  # w0 defines the dataset
        producer = make_producer(settings)
        producer.produce(progress, key=b"job-d", value=b"\x00garbage")
        producer.flush(5)
        other = ShardClient(settings, "job-d", "w1", spec(size=999, epochs=1))
        other.send(K.REQUESTED, 0, dataset=other.dataset)  # contradicts the job's dataset
        # on the bus before w0's next request (the job's partition keeps their order), so the
        # sharder has read it once w0 is answered, before it stops
        other.flush()
        assert client.request(0).status is AssignmentStatus.GRANTED
        other.close()
    with consuming(settings) as consumer:
        assign_now(consumer, [TopicPartition(deadletter, 0, OFFSET_BEGINNING)])
        errors = []
        deadline = time.monotonic() + 30  # on the bus already: read at once unless loaded
        while len(errors) < 2 and time.monotonic() < deadline:
            errors += [
                dict(m.headers())[HEADER_ERROR].decode() for m in poll_batch(consumer, 10, 0.1)
            ]
    assert any("Confluent" in e or "marker" in e for e in errors)
    assert any("is sharded as" in e for e in errors)


def test_checkpoint_and_rewind_across_an_epoch(settings, topics):
    dataset = spec(size=100, shard_size=50, epochs=2)
    with running_sharder(settings), ShardClient(settings, "job-c", "w0", dataset) as client:
        first = client.request(0, quota=1).shards[0]
        client.done(0, first.shard_id, first.attempt)
        version = client.checkpoint(0, step=10)
        second = client.request(0, quota=1).shards[0]
        client.done(0, second.shard_id, second.attempt)
        assert client.request(1, quota=1).epoch == 1  # epoch 0 closed, epoch 1 granted
        answer = client.rewind(1, version)
        assert answer.version is not None and answer.epoch == 0
        regrant = client.request(0, quota=1)
        assert [s.shard_id for s in regrant.shards] == [second.shard_id]
    state = fold("job-c", job_log(settings, "job-c"))
    assert state.epoch == 0 and state.slots[first.shard_id].state.value == "DONE"


def test_fencing_a_stale_writer(settings, topics):
    """A second sharder takes the job over; what the first writes afterwards is ignored."""
    dataset = spec(size=500, epochs=1)
    codec = SingleObjectCodec()
    with (
        running_sharder(settings, writer_id="old"),
        ShardClient(settings, "job-f", "w0", dataset) as client,
    ):
        client.request(0, quota=1)
        producer = make_producer(settings, **{"linger.ms": 0})
        new_core, _ = take_over(
            LogReads(settings, codec, producer),
            "job-f",
            LogWriter(producer, log_topic(settings), codec),
            "new",
            CoreConfig(),
            int(time.time() * 1000),
        )
        assert new_core.state.writer_epoch == 2
        zombie_answer = client.request(0, quota=3)  # the old sharder still answers...
        assert zombie_answer.writer_epoch == 1
    events = job_log(settings, "job-f")
    state = fold("job-f", events)
    assert state.stats.stale_writer > 0  # ...but its events are ignored by every reader
    assert state.logical_view() == new_core.state.logical_view()
    assert state.writer == "writer new"


def test_a_new_writer_writes_the_done_its_predecessor_died_before(settings, topics):
    """A sharder killed between an APPLIED and the DONE it implied leaves the shard DOING with
    every sample applied: no commit would ever complete it, and its holder held it forever (a drawn
    chaos run hung so). The next writer writes that DONE as it takes the job over."""
    dataset = spec(size=100, shard_size=50, epochs=1)
    codec = SingleObjectCodec()
    producer = make_producer(settings, **{"linger.ms": 0})
    writer = LogWriter(producer, log_topic(settings), codec)
    now = int(time.time() * 1000)
    core, _ = take_over(LogReads(settings, codec, producer), JOB, writer, "old", CoreConfig(), now)
    granted = core.on_progress(report(K.REQUESTED, "w0", 0, now, dataset=dataset, quota=1), now)
    shard = granted.assignment.shards[0]
    whole = ShardCommit(
        shard_id=shard.shard_id,
        attempt=shard.attempt,
        samples=list(range(shard.start, shard.start + shard.length)),
    )
    committed = core.on_progress(report(K.COMMIT, "w0", 0, now, commits=[whole]), now)
    writer.append(granted.events + [e for e in committed.events if e.transition is T.APPLIED])
    writer.flush()
    assert fold(JOB, job_log(settings, JOB)).slots[shard.shard_id].state is ShardState.DOING
    with running_sharder(settings), ShardClient(settings, JOB, "w0", dataset) as client:
        answer = client.request(0, quota=1)
    assert [s.shard_id for s in answer.shards] == [1 - shard.shard_id]
    done = [e for e in job_log(settings, JOB) if e.transition is T.DONE]
    assert [(e.shard_id, e.writer_epoch) for e in done] == [(shard.shard_id, 2)]


@pytest.mark.slow
@pytest.mark.e2e
def test_kill_9_mid_epoch_then_a_new_sharder_finishes_with_exactly_once(settings, topics):
    dataset = spec(size=3000, shard_size=30, epochs=2)
    progress = {"shards": 0}
    killed = threading.Event()

    def count(worker, shard):
        progress["shards"] += 1
        time.sleep(0.002)

    with sharder_process(settings, "--snapshot-every", "50") as first:
        workers = threading.Thread(
            target=run_workers, args=(settings, "job-k", dataset, 3, count), daemon=True
        )
        workers.start()
        while progress["shards"] < dataset.shard_count // 2 and workers.is_alive():
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        killed.set()
    assert progress["shards"] < dataset.shard_count * dataset.epochs  # it really died mid-job
    with sharder_process(settings, "--snapshot-every", "50"):
        workers.join(180)
    assert not workers.is_alive()
    events = job_log(settings, "job-k")
    state = assert_exactly_once("job-k", dataset, events)
    assert state.writer_epoch >= 2
    reads = LogReads(settings, SingleObjectCodec(), make_producer(settings))
    recovered = recover_job(reads, "job-k")
    assert recovered.from_snapshot and recovered.state.logical_view() == state.logical_view()


def test_the_sharder_is_ready_only_once_it_has_taken_over_the_jobs_waiting(settings, topics):
    """Readiness means take-over done: a request sent while no sharder ran is recovered, taken over
    (a new writer epoch) and answered by the time a new instance says it is ready, and not before
    its partitions are assigned."""
    dataset = spec(size=400, epochs=1)
    with running_sharder(settings):
        with ShardClient(settings, "job-r", "early", dataset) as early:
            early.request(0, quota=1)
    with ShardClient(settings, "job-r", "late", dataset) as late:
        waiting = late.ask(0, quota=1)
        late.flush()
        service = SharderService(settings, writer_id="writer two").start()
        assert not service.ready.is_set()  # no assignment yet: nothing known of its jobs
        with running_loop(service, "sharder"):
            assert service.ready.wait(60), "not ready within 60 s"
            assert service.jobs["job-r"].core.state.writer_epoch == 2
            assert late.wait_answer(waiting, 10).shards  # answered, not only recovered


def test_a_vanished_worker_loses_its_shards_by_lease_expiry(settings, topics):
    """A worker that dies without a word: its leases run out and the others finish its shards."""
    dataset = spec(size=400, epochs=1, lease_s=1.0)
    with running_sharder(settings, SharderConfig(lease_check_every_s=0.05)):
        with ShardClient(settings, "job-v", "ghost", dataset) as ghost:
            held = ghost.request(0, quota=3).shards  # ...and never heard from again
        run_workers(settings, "job-v", dataset, count=2)
    events = job_log(settings, "job-v")
    assert_exactly_once("job-v", dataset, events)
    expired = {e.shard_id for e in events if e.transition is T.LEASE_EXPIRED}
    assert {s.shard_id for s in held} <= expired


def test_a_worker_that_leaves_releases_its_shards_at_once(settings, topics):
    from antdt.schemas.models import LifecycleEvent, WorkerLifecycle
    from antdt.schemas.types import utc_now

    dataset = spec(size=400, epochs=1, lease_s=600.0)
    lifecycle = topic_spec("worker", "lifecycle").full_name(settings.topic_prefix)
    with running_sharder(settings):
        with ShardClient(settings, "job-l", "leaver", dataset) as leaver:
            held = leaver.request(0, quota=3).shards
            left = WorkerLifecycle(
                job_id="job-l",
                worker_id="leaver",
                incarnation=leaver.incarnation,
                event=LifecycleEvent.LEFT,
                timestamp=utc_now(),
                host="h",
                pid=1,
                exit_code=0,
                reason="evicted",
            )
            producer = make_producer(settings)
            producer.produce(lifecycle, key=b"job-l", value=SingleObjectCodec().encode(left))
            producer.flush(5)
        # would wait 600 s for the leases otherwise
        run_workers(settings, "job-l", dataset, count=2)
    events = job_log(settings, "job-l")
    assert_exactly_once("job-l", dataset, events)
    released = [e for e in events if e.transition is T.RELEASED]
    assert [(e.worker_id, e.reason) for e in released] == [("leaver", "evicted")]
    assert not {e.shard_id for e in events if e.transition is T.LEASE_EXPIRED} & {
        s.shard_id for s in held
    }


def test_the_farewell_of_a_replaced_process_does_not_release_its_successors_shards(
    settings, topics
):
    """A late LEFT from an old incarnation (lifecycle and progress are different topics) is
    ignored."""
    from antdt.schemas.models import LifecycleEvent, WorkerLifecycle
    from antdt.schemas.types import utc_now

    dataset = spec(size=400, epochs=1, lease_s=600.0)
    lifecycle = topic_spec("worker", "lifecycle").full_name(settings.topic_prefix)
    producer = make_producer(settings)

    def farewell(incarnation: str) -> None:
        left = WorkerLifecycle(
            job_id="job-f",
            worker_id="w",
            incarnation=incarnation,
            event=LifecycleEvent.LEFT,
            timestamp=utc_now(),
            host="h",
            pid=1,
            exit_code=1,
            reason=f"{incarnation} left",
        )
        producer.produce(lifecycle, key=b"job-f", value=SingleObjectCodec().encode(left))
        producer.flush(5)

    with running_sharder(settings):
        with ShardClient(settings, "job-f", "w", dataset, incarnation="old") as old:
            held = old.request(0, quota=2).shards
        with ShardClient(settings, "job-f", "w", dataset, incarnation="new") as new:
            # the same worker id: its shards, as they were
            assert new.request(0, quota=2).shards == held
            farewell("old")
            again = new.request(0, quota=2)  # a report after the late farewell: it changed nothing
            assert [s.shard_id for s in again.shards] == [s.shard_id for s in held]
            farewell("new")
            run_workers(settings, "job-f", dataset, count=1)
    events = job_log(settings, "job-f")
    # only the current one's farewell
    assert [e.reason for e in events if e.transition is T.RELEASED] == ["new left"]
