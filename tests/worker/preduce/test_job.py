"""A partial-reduce rank the sharder tells to wait keeps joining groups.

A chaos run hung for good without it: a checkpoint fell due while one rank
waited for shards the two others held, and they waited at the checkpoint for
it. The loop is driven here with stand-ins for the feed and the group round.
"""

from __future__ import annotations

from contextlib import nullcontext
from types import SimpleNamespace

from antdt.worker.preduce.job import PartialReduceJob


class Feed:
    """No batch for ``waits`` takes (others hold the last shards), then ``batches``, then done."""

    def __init__(self, waits: int, batches: list):
        self.waits, self.batches = waits, list(batches)

    @property
    def exhausted(self) -> bool:
        return self.waits == 0 and not self.batches

    def take(self, size: int):
        if self.waits:
            self.waits -= 1
            return None
        return self.batches.pop(0) if self.batches else None


def job_with(feed: Feed) -> tuple[SimpleNamespace, list[bool]]:
    """A stand-in for the job: its agent and feed, and its group rounds recorded."""
    rounds: list[bool] = []
    job = SimpleNamespace(
        agent=SimpleNamespace(batch_size=4, data_wait=nullcontext),
        feed=feed,
        _round_now=lambda finished=False: rounds.append(finished),
    )
    return job, rounds


def test_a_rank_waiting_for_shards_joins_a_group_round_each_time_it_is_told_to_wait():
    job, rounds = job_with(Feed(waits=3, batches=["batch"]))
    assert PartialReduceJob._next_batch(job) == "batch"
    assert rounds == [False, False, False]  # never as finished: it still has data to come


def test_a_rank_with_data_or_at_the_end_joins_no_extra_round():
    job, rounds = job_with(Feed(waits=0, batches=["batch"]))
    assert PartialReduceJob._next_batch(job) == "batch"
    job.feed = Feed(waits=0, batches=[])
    assert PartialReduceJob._next_batch(job) is None
    assert rounds == []
