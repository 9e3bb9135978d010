"""The sharder's reads of its log up to a marker through the one consumer it keeps."""

from __future__ import annotations

import time
from types import SimpleNamespace

from antdt.bus.clients import make_producer
from antdt.schemas.codec import SingleObjectCodec
from antdt.services.sharder import eventlog
from antdt.services.sharder.core import CoreConfig
from antdt.services.sharder.eventlog import LogReads, LogWriter, MarkerReader, log_topic
from antdt.services.sharder.recovery import take_over
from antdt.services.sharder.state import fold
from tests.services.sharder.harness import job_log


def counting_consumers(monkeypatch) -> list:
    """Every consumer the kept reader makes, from now on."""
    made = []
    making = eventlog.make_consumer
    monkeypatch.setattr(
        eventlog, "make_consumer", lambda *a, **k: made.append(making(*a, **k)) or made[-1]
    )
    return made


def test_take_overs_read_through_one_kept_consumer_that_fetches_nothing_between(
    settings, topics, monkeypatch
):
    """Three take-overs (two jobs, then the first again by a new writer) read the snapshots and
    the log on one consumer; between reads it holds no partition, and what it read is the log."""
    made = counting_consumers(monkeypatch)
    codec = SingleObjectCodec()
    producer = make_producer(settings, **{"linger.ms": 0})
    writer = LogWriter(producer, log_topic(settings), codec)
    reader = MarkerReader(settings)
    reads = LogReads(settings, codec, producer, reader)
    now = int(time.time() * 1000)
    try:
        for job, who in (("job-a", "one"), ("job-b", "one"), ("job-a", "two")):
            core, _ = take_over(reads, job, writer, who, CoreConfig(), now)
            assert reader._consumer.assignment() == []
        assert len(made) == 1
        assert core.state.writer_epoch == 2
        assert core.state.logical_view() == fold("job-a", job_log(settings, "job-a")).logical_view()
    finally:
        reader.close()


def test_after_a_bus_reset_the_kept_reader_reads_on_a_new_consumer(settings, topics, monkeypatch):
    made = counting_consumers(monkeypatch)
    codec = SingleObjectCodec()
    producer = make_producer(settings, **{"linger.ms": 0})
    watch = SimpleNamespace(generation=0)
    reader = MarkerReader(settings, watch)
    reads = LogReads(settings, codec, producer, reader)
    try:
        list(reads.job_log("job-c"))
        watch.generation += 1  # the watch saw the bus come back empty
        list(reads.job_log("job-c"))
        assert len(made) == 2
    finally:
        reader.close()


def test_a_read_while_another_is_under_way_gets_a_consumer_of_its_own(
    settings, topics, monkeypatch
):
    """A read left unfinished holds the kept consumer: the next one is not kept waiting for it."""
    codec = SingleObjectCodec()
    producer = make_producer(settings, **{"linger.ms": 0})
    writer = LogWriter(producer, log_topic(settings), codec)
    now = int(time.time() * 1000)
    take_over(LogReads(settings, codec, producer), "job-d", writer, "one", CoreConfig(), now)
    made = counting_consumers(monkeypatch)
    reader = MarkerReader(settings)
    reads = LogReads(settings, codec, producer, reader)
    try:
        unfinished = reads.job_log("job-d")
        next(unfinished)  # the election: the read holds the kept consumer
        again = list(reads.job_log("job-d"))
        assert [event.seq for _, event in again] == [1]
        assert len(made) == 1  # the kept one; the second read made its own
        unfinished.close()
    finally:
        reader.close()
