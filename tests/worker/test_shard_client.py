"""ShardClient against a real broker of its own (the test stops it)."""

from __future__ import annotations

import pytest

from antdt.errors import BusError
from antdt.schemas.models import ShardCommit
from antdt.worker.shard_client import ShardClient


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
        with pytest.raises(BusError, match=r"w0: 1 report\(s\) undelivered after 0.5 s"):
            client.flush(timeout_s=0.5)
    finally:
        client._producer.purge()  # the broker is gone: do not wait out close's flush
        client.close()
