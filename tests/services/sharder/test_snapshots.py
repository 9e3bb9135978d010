"""Snapshots written off the sharder's loop: what is written is the captured state, and nothing from
before a bus reset."""

from __future__ import annotations

import os
import signal
import time
from datetime import UTC, datetime

import pytest

from antdt.bus.clients import make_producer, producing
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import DatasetSpec, ShardState
from antdt.services.sharder import metrics
from antdt.services.sharder.eventlog import LogReads, snapshot_topic
from antdt.services.sharder.snapshots import BuilderFailed, BuilderProcess, SnapshotWriter
from antdt.services.sharder.state import JobState

CODEC = SingleObjectCodec()


def a_job(job_id: str) -> JobState:
    """A job half-way through an epoch: some shards done, one held under a lease, one with samples
    recorded."""
    state = JobState(
        job_id,
        dataset=DatasetSpec(
            name="snap",
            size=1000,
            shard_size=10,
            epochs=2,
            shuffle_seed=1,
            max_attempts=3,
            lease_s=30.0,
        ),
    )
    state._open_epoch(0, 1)
    for slot in state.slots[:40]:
        slot.state, slot.done_seq = ShardState.DONE, 5
        slot.applied.record_all(4)
    held = state.slots[50]
    held.state, held.worker, held.lease_ms, held.attempt = (
        ShardState.DOING,
        "w1",
        1_700_000_000_000,
        1,
    )
    held.applied.record([held.start], 6)
    state.last_seq = 6
    return state


def without_time(snapshot):
    return snapshot.model_copy(update={"timestamp": None})


@pytest.mark.parametrize("builder", ["thread", "process"])
def test_a_submitted_capture_is_written_as_the_snapshot_of_the_state_it_was_taken_from(
    settings, topics, builder
):
    job = f"snap-a-{builder}"
    state = a_job(job)
    captured = state.capture()
    expected = state.to_snapshot(datetime.now(UTC), log_offset=7)
    state.slots[60].state = ShardState.DONE  # changed after the capture: not in the snapshot
    producer = make_producer(settings)
    writer = SnapshotWriter(producer, snapshot_topic(settings), CODEC, builder=builder)
    failures = metrics.SNAPSHOT_BUILDER_FAILURES._value.get()
    writer.submit(captured, log_offset=7)
    writer.close()
    # built where it was asked to be
    assert metrics.SNAPSHOT_BUILDER_FAILURES._value.get() == failures
    producer.flush(10)
    with producing(settings) as reader_producer:
        written = LogReads(settings, CODEC, reader_producer).latest_snapshot(job)
    assert written is not None and without_time(written) == without_time(expected)


class Recording:
    """Stands in for the producer in a test of the writer's own bookkeeping (no bus involved)."""

    def __init__(self):
        self.produced = []

    def produce(self, topic, key, value):
        self.produced.append(key)


def test_a_capture_built_across_a_bus_reset_is_not_written():
    producer = Recording()
    writer = SnapshotWriter(producer, "snapshots", CODEC)
    captured = a_job("snap-b").capture()
    generation = writer._generation
    writer.discard_pending()  # the bus was reset while the capture was being built
    assert writer._write(captured, 3, generation) is False
    assert writer.write_now(captured, None) is True  # what the sharder re-publishes after the reset
    writer.close()
    assert producer.produced == [b"snap-b"]


def test_only_the_latest_capture_of_a_job_waits():
    producer = Recording()
    writer = SnapshotWriter(producer, "snapshots", CODEC)
    with writer._lock:  # the thread cannot take anything while both are submitted
        writer.submit(a_job("snap-c").capture(), 1)
        writer.submit(a_job("snap-c").capture(), 2)
        assert [offset for _, offset, _ in writer._pending.values()] == [2]
    deadline = time.monotonic() + 10
    writer.close()
    assert time.monotonic() < deadline and producer.produced == [b"snap-c"]


def test_when_the_builder_process_fails_the_thread_builds_the_snapshot_itself():
    producer = Recording()
    writer = SnapshotWriter(producer, "snapshots", CODEC, builder="process")
    gone = BuilderProcess()
    gone._process.kill()  # as a builder that died
    gone._process.wait()
    writer._process = gone
    failures = metrics.SNAPSHOT_BUILDER_FAILURES._value.get()
    writer.submit(a_job("snap-d").capture(), 1)
    writer.close()
    assert producer.produced == [b"snap-d"]
    assert metrics.SNAPSHOT_BUILDER_FAILURES._value.get() == failures + 1
    assert writer._process is None  # the next snapshot starts a fresh process


def test_a_builder_that_takes_no_request_fails_the_build_within_its_bound():
    """A builder wedged on an earlier request (here stopped) leaves a request of megabytes unread
    once the pipe is full: the thread gives up at the build's deadline and builds it itself."""
    wedged = BuilderProcess()
    os.kill(wedged._process.pid, signal.SIGSTOP)
    try:
        with pytest.raises(BuilderFailed, match="did not take its request in time"):
            wedged._send(bytes(4 << 20), deadline=time.monotonic() + 0.5)
    finally:
        wedged._process.kill()
        wedged._process.wait()


def test_the_snapshot_at_or_before_a_seq_is_the_newest_one_not_after_it(settings, topics):
    job = "snap-before"
    producer = make_producer(settings)
    writer = SnapshotWriter(producer, snapshot_topic(settings), CODEC, builder="thread")
    state = a_job(job)
    for seq in (6, 20, 35):
        state.last_seq = seq
        assert writer.write_now(state.capture(), log_offset=seq + 100)
    writer.close()
    producer.flush(10)
    with producing(settings) as reader:
        reads = LogReads(settings, CODEC, reader)
        found = {asked: reads.snapshot_at_or_before(job, asked) for asked in (5, 6, 25, 99)}
    assert found[5] is None
    assert [found[asked].seq for asked in (6, 25, 99)] == [6, 20, 35]
    assert found[25].log_offset == 120


def an_event(job: str, seq: int):
    from antdt.schemas.models import ShardLogEvent, ShardTransition

    return ShardLogEvent(
        job_id=job,
        seq=seq,
        writer_epoch=1,
        transition=ShardTransition.WRITER_ELECTED,
        epoch=0,
        timestamp=datetime.now(UTC),
    )


def test_appends_lost_to_a_bus_reset_do_not_fail_the_flush_after_the_log_starts_over(settings):
    """The appends caught in a reset fail (here: a topic that is not there, and a message timeout
    of 0.5 s); once the log starts over, the state written again is what counts (seed 21 of the
    partial-reduce chaos runs: the sharder exited on them with the only copy of the state)."""
    from antdt.errors import BusError
    from antdt.services.sharder.eventlog import LogWriter

    producer = make_producer(settings, **{"message.timeout.ms": 500})
    writer = LogWriter(producer, f"{settings.topic_prefix}.not-there", CODEC)
    writer.append([an_event("lost", 1)])
    with pytest.raises(BusError, match="shard log append failed"):
        writer.flush(5)
    writer.append([an_event("lost", 2)])
    writer.start_over()  # the reset noticed while that append was in flight
    writer.flush(5)
    assert writer.generation == 1
