"""ShardedDataset with the real sharder: every sample of every epoch exactly once."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from torch.utils.data import DataLoader

from antdt.schemas.models import DatasetSpec
from antdt.worker.dataset import ShardedDataset
from tests.services.sharder.harness import assert_exactly_once, job_log, running_sharder


def spec(size: int, shard_size: int, epochs: int) -> DatasetSpec:
    return DatasetSpec(name="ds", size=size, shard_size=shard_size, epochs=epochs, shuffle_seed=5, max_attempts=3, lease_s=60)


def train(settings, job, worker, dataset_spec, num_workers, seen: Counter, epochs: int) -> None:
    dataset = ShardedDataset(list(range(dataset_spec.size)), dataset_spec, settings=settings, job_id=job, worker_id=worker, quota=2)
    # spawn: forking a process whose other threads hold Kafka clients can deadlock the child
    context = "spawn" if num_workers else None
    loader = DataLoader(dataset, batch_size=7, num_workers=num_workers, multiprocessing_context=context,
                        in_order=False)
    for epoch in range(epochs):
        dataset.set_epoch(epoch)
        for batch in loader:
            seen.update((epoch, int(i)) for i in batch)
    dataset.close()


@pytest.mark.parametrize(("trainers", "num_workers"), [(2, 0), (2, 2)], ids=["2-trainers-in-process", "2-trainers-2-loader-processes-each"])
def test_every_sample_exactly_once_per_epoch(settings, topics, trainers, num_workers):
    dataset_spec = spec(size=600, shard_size=25, epochs=2)
    job = f"job-ds-{num_workers}"
    seen: Counter = Counter()
    with running_sharder(settings):
        trainers = [threading.Thread(target=train, args=(settings, job, f"w{k}", dataset_spec, num_workers, seen, 2)) for k in range(trainers)]
        for trainer in trainers:
            trainer.start()
        for trainer in trainers:
            trainer.join(120)
    assert seen == Counter({(epoch, i): 1 for epoch in range(2) for i in range(600)})
    assert_exactly_once(job, dataset_spec, job_log(settings, job))


def test_the_dataset_size_must_match_the_spec(settings):
    with pytest.raises(ValueError, match="has 10 samples but the spec says 600"):
        ShardedDataset(list(range(10)), spec(600, 25, 1), settings=settings, job_id="j", worker_id="w")


def test_within_shard_order_is_shuffled_deterministically(settings, topics):
    dataset_spec = spec(size=100, shard_size=50, epochs=1)
    with running_sharder(settings):
        dataset = ShardedDataset(list(range(100)), dataset_spec, settings=settings, job_id="job-order", worker_id="w0")
        order = list(dataset)
        dataset.close()
    assert sorted(order) == list(range(100)) and order != list(range(100))
    again = ShardedDataset(list(range(100)), dataset_spec, settings=settings, job_id="x", worker_id="w")
    shard = type("S", (), {"start": 0, "length": 50, "shard_id": 0})()
    assert again._positions(0, shard) == again._positions(0, shard) != list(range(50))


def test_checkpoint_then_restore_retrains_exactly_what_the_model_has_not_seen(settings, topics, tmp_path):
    import torch

    from antdt.worker import Agent

    dataset_spec = spec(size=200, shard_size=20, epochs=1)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before, after_restore = [], []
    with running_sharder(settings), Agent("job-ckpt", "w0", settings=settings, listen_for_commands=False) as agent:
        data = agent.shards(list(range(200)), dataset_spec, shuffle=False)
        stream = iter(data)
        for _ in range(60):  # three shards, fully consumed and reported DONE
            before.append(next(stream))
            agent.step()
        version = agent.save_checkpoint(tmp_path / "ckpt.pt", model, optimizer, data)
        for _ in range(40):  # two more shards the model will "lose"
            before.append(next(stream))
            agent.step()
        stream.close()
        agent.restore_checkpoint(tmp_path / "ckpt.pt", model, optimizer, data)
        assert agent.step_count == 60
        after_restore = list(data)
        data.close()
    assert version > 0
    assert sorted(before[:60] + after_restore) == list(range(200))  # the rest of the epoch, exactly once
    assert set(before[60:]) <= set(after_restore)  # the lost shards are trained again
