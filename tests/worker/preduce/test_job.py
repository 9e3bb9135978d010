"""A partial-reduce rank the sharder tells to wait keeps joining groups; every rank of a group
announces one generation; a rank reads the shards one batch spans at once.

A chaos run hung for good without it: a checkpoint fell due while one rank
waited for shards the two others held, and they waited at the checkpoint for
it. The loop is driven here with stand-ins for the feed and the group round.
"""

from __future__ import annotations

import os
import time
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist
import torch.multiprocessing as mp

from antdt.worker.preduce import job as job_module
from antdt.worker.preduce.job import PartialReduceJob, shards_read
from tests.worker.groups import join_gloo


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


def test_a_rank_reads_at_once_the_shards_one_batch_spans_and_never_fewer_than_one():
    # the standard scenario: a batch of 32 spans two shards of 16, both asked for together
    assert shards_read(32, 16) == 2
    assert shards_read(33, 16) == 3
    assert shards_read(32, 8) == 4
    # a shard that holds a batch or more: one at a time, what the others wait for at an epoch's end
    assert shards_read(32, 32) == 1
    assert shards_read(32, 1500) == 1
    assert shards_read(1, 1) == 1


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


def generation_main(rank: int, init_file: str, out_dir: str) -> None:
    """Each rank with its own node's restart count and a clock of its own: rank 1 as a node whose
    agent restarted it for another node's leaving (not counted) on a host 100 s ahead."""
    os.environ["TORCHELASTIC_RESTART_COUNT"] = str(3 - 3 * rank)
    if rank == 1:
        job_module.time = SimpleNamespace(time=lambda: time.time() + 100.0)
    join_gloo(init_file, rank, 2)
    before = int(time.time()) - job_module.GENERATION_EPOCH_S
    Path(out_dir, f"rank-{rank}.txt").write_text(f"{before} {job_module.agreed_generation()}")
    dist.destroy_process_group()


def test_every_rank_announces_rank_0_s_generation_whatever_its_node_s_restart_count(tmp_path):
    """torchrun counts restarts per node, and not the ones another node's joining or leaving
    caused: the generation is rank 0's, agreed in a broadcast, at least its clock's second."""
    mp.spawn(generation_main, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    (before0, got0), (_, got1) = (
        map(int, (tmp_path / f"rank-{r}.txt").read_text().split()) for r in (0, 1)
    )
    assert got0 == got1 >= before0 > 0
