"""ShardClient against a real broker of its own (the test stops or restarts it)."""

from __future__ import annotations

import threading

import pytest

from antdt.errors import BusError
from antdt.schemas.models import ShardCommit
from antdt.worker.shard_client import ShardClient
from tests.fetches import count_reply_fetches
from tests.refusing import RefusingProducer
from tests.services.sharder.harness import running_sharder
from tests.services.sharder.test_service import spec
from tests.waiting import wait_until


def test_flush_says_when_a_commit_is_not_on_the_bus(own_bus):
    """A checkpoint version asked for after a silent flush could miss a commit: the flush raises
    instead."""
    broker, settings = own_bus
    client = ShardClient(settings, "job-flush", "w0")
    try:
        client.commit(0, [ShardCommit(holder="w0", shard_id=0, attempt=0, samples=[1, 2])])
        client.flush(timeout_s=10)  # delivered: nothing to say
        broker.stop()
        client.commit(0, [ShardCommit(holder="w0", shard_id=0, attempt=0, samples=[3])])
        with pytest.raises(BusError, match=r"w0: 1 record\(s\) undelivered after 0.5 s"):
            client.flush(timeout_s=0.5)
    finally:
        client._producer.purge()  # the broker is gone: do not wait out close's flush
        client.close(wait_read_s=0)


def test_a_client_closing_right_after_its_last_done_waits_until_the_sharder_has_read_it(own_bus):
    """A broker restart between a worker's last DONE and the sharder's read of it takes the report;
    an open client sends its recent reports again, a closed one cannot, and the shard waited out
    its lease (30 s) to be trained again. Closing now waits until the sharder has read past the
    last report, sending it again across the restart."""
    broker, settings = own_bus
    dataset = spec(size=40, shard_size=20, epochs=1)
    with running_sharder(settings) as service:
        reading, step = threading.Event(), service.step

        def gated_step():
            reading.wait(30.0)
            return step()

        reading.set()
        service.step = gated_step
        client = ShardClient(settings, "job-close", "w", dataset)
        first, second = client.request(0, quota=2).shards
        client.done(0, first.shard_id, first.attempt)
        state = lambda: service.jobs["job-close"].core.state  # noqa: E731
        wait_until(lambda: state().doing_count == 1)
        reading.clear()  # the sharder reads nothing more until the broker is restarted
        client.done(0, second.shard_id, second.attempt)
        client.flush()  # on the old broker, unread
        broker.restart()
        reading.set()
        assert client.wait_until_read()
        client.close()
        # read: at once, not after the lease (30 s); the bound leaves a slow day's group rejoin
        # after the restart room under it
        wait_until(lambda: state().finished, timeout_s=15.0)


def test_a_report_refused_for_a_topic_a_reset_took_goes_out_once_it_is_back(settings, topics):
    """librdkafka refuses a record at once for a topic its metadata saw a reset take; that refusal
    used to raise out of ``send`` into the training loop."""
    dataset = spec(size=40, shard_size=20, epochs=1)
    with running_sharder(settings), ShardClient(settings, "job-refused", "w", dataset) as client:
        refusing = client._producer = RefusingProducer(client._producer)
        answer = client.request(0, quota=1)
    assert refusing.refused == 1 and len(answer.shards) == 1


def test_the_answer_reader_fetches_only_while_an_answer_is_awaited(settings, topics, monkeypatch):
    """Grants are asked for a shard ahead: an idle reader polled the broker every fetch wait (40
    times a second at 25 ms on the embedded broker, about 1 ms of its CPU each) between requests,
    for answers that only come to a request."""
    counter = count_reply_fetches(monkeypatch)
    dataset = spec(size=40, shard_size=20, epochs=1)
    with running_sharder(settings), ShardClient(settings, "job-idle", "w", dataset) as client:
        idle_before = counter.during_idle(client._consumer, 1.0)
        answer = client.request(0, quota=1)  # the reader fetches again, and the answer comes
        idle_after = counter.during_idle(client._consumer, 1.0)
    assert len(answer.shards) == 1
    # unpaused, each second takes 1000 / (25 ms + a round trip) fetches: 38 measured (slow day)
    assert idle_before <= 1 and idle_after <= 1, (idle_before, idle_after)
