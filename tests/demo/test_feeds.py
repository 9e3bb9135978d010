"""Sample feeds for synchronous workers: static slices and the non-blocking shard buffer."""

from __future__ import annotations

import threading

import pytest
import torch

from antdt.demo.feeds import ShardFeed, StaticFeed
from antdt.worker.provenance import SampleTag, Tagged


def test_static_slices_partition_every_epoch_across_ranks():
    size, world, epochs = 24, 3, 2
    inputs = torch.arange(size, dtype=torch.float32).unsqueeze(1)
    labels = torch.arange(size)
    taken = {rank: [] for rank in range(world)}
    for rank in range(world):
        feed = StaticFeed(inputs, labels, rank, world, epochs, seed=5)
        while (batch := feed.take(5)) is not None:
            got = batch.data[1].tolist()
            assert [tag.index for tag in batch.tags] == got  # the tags name the samples taken
            taken[rank] += got
        assert feed.exhausted
    assert all(len(samples) == size * epochs // world for samples in taken.values())
    epochs_taken = [tag.epoch for tag in StaticFeed(inputs, labels, 0, world, epochs, seed=5).take(size).tags]
    assert epochs_taken == [0] * (size // world) + [1] * (size // world)
    per_epoch = size // world
    for epoch in range(epochs):
        seen = sorted(x for samples in taken.values() for x in samples[epoch * per_epoch:(epoch + 1) * per_epoch])
        assert seen == list(range(size))  # each sample exactly once per epoch


class ScriptedDataset:
    """Stands in for a ShardedDataset (no bus here): epochs of samples, then finished; can be told to WAIT."""

    def __init__(self, epochs: list[list[int]]):
        self.epochs = epochs
        self.finished = False
        self.waiting = False
        self.release = threading.Event()
        self.closed = False

    def __iter__(self):
        epoch = self.epochs.pop(0)
        for value in epoch:
            if value < 0:  # the sharder has nothing now: wait until released
                self.waiting = True
                self.release.wait(10)
                self.waiting = False
                continue
            yield Tagged((torch.tensor([float(value)]), torch.tensor(value)), (SampleTag(0, value, 0, 0, "w"),))
        if not self.epochs:
            self.finished = True

    def close(self):
        self.closed = True


def drain(feed: ShardFeed, wanted: int) -> list[list[int]]:
    batches = []
    while not feed.exhausted:
        batch = feed.take(wanted)
        batches.append([] if batch is None else batch.data[1].tolist())
    return batches


def test_full_batches_across_epochs_then_exhausted():
    feed = ShardFeed(ScriptedDataset([[0, 1, 2, 3, 4], [5, 6, 7]]), capacity=4).start()
    batches = drain(feed, 3)
    feed.close()
    assert [x for batch in batches for x in batch] == list(range(8))
    assert batches[:2] == [[0, 1, 2], [3, 4, 5]]
    assert feed.dataset.closed


def test_a_waiting_sharder_yields_a_short_batch_instead_of_blocking_the_step():
    dataset = ScriptedDataset([[0, 1, -1, 2, 3]])
    feed = ShardFeed(dataset, capacity=8).start()
    first = feed.take(4)
    assert first.data[1].tolist() == [0, 1] and [t.index for t in first.tags] == [0, 1]  # short: the sharder said WAIT, the other ranks must not wait for us
    assert feed.take(4) is None  # nothing buffered while still waiting
    dataset.release.set()
    rest = drain(feed, 4)
    feed.close()
    assert [x for batch in rest for x in batch] == [2, 3]


def test_an_error_in_the_feed_reaches_the_training_thread():
    class Broken(ScriptedDataset):
        def __iter__(self):
            raise RuntimeError("sharder unreachable")
            yield  # noqa: unreachable - makes this a generator

    feed = ShardFeed(Broken([[0]]), capacity=4).start()
    with pytest.raises(RuntimeError, match="sharder unreachable"):
        feed.take(1)
    feed.close()
