"""One demo worker process: a real model, the agent, paced steps, async or synchronous training.

Started by the harness (:mod:`antdt.demo.harness`) as
``python -m antdt.demo.trainer``, configured by ``ANTDT_*`` variables (bus,
job, worker and node ids) and a few arguments. Its life:

1. build the model and the data source, join the process group (synchronous
   runs, gloo meeting through a file), enter the agent, open the shard
   feed;
2. tell the harness it is ready (a ``ready-<rank>`` file in the run's
   handshake directory) and wait for the start signal (the ``go`` file, which
   holds the run's start time): process start and ``import torch`` are the
   same for every run and are not measured;
3. train:

   * ``async`` (AntDT-ND's shared cluster): each worker pulls shards and
     steps at its own pace, as parameter-server style workers do (the
     parameter server itself is not modelled: each keeps its own model);
   * ``sync`` (dedicated cluster): every step ends in the batch-weighted
     gradient all-reduce (:class:`~antdt.worker.ddp.WeightedGradientAverager`,
     gloo, meeting through a file in the handshake directory),
     so each step waits for the slowest rank. Samples come from dynamic
     shards or, for the baseline, a static slice (:mod:`antdt.demo.feeds`);

4. write ``done-<rank>.json`` (finish time, samples, steps).

A RESTART or EVICT command ends the process with the agent's exit code; the
harness starts a RESTARTed worker again, and the new incarnation skips the
start signal (it is already set) and carries on pulling shards.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from antdt.demo.feeds import ShardFeed, StaticFeed
from antdt.demo.handshake import done_file, ready_file, wait_for_start, write_atomically
from antdt.demo.pacing import Pacer
from antdt.demo.scenario import Scenario
from antdt.schemas.models import DatasetSpec
from antdt.settings import load_settings
from antdt.worker.agent import Agent, WorkerExit
from antdt.worker.dataset import ShardedDataset
from antdt.worker.ddp import WeightedGradientAverager
from antdt.worker.example import SyntheticClassification, batches, make_model

GROUP_TIMEOUT = timedelta(seconds=300)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="antdt demo worker (started by the harness)")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--training", choices=("async", "sync"), required=True)
    parser.add_argument("--sharding", choices=("dynamic", "static"), required=True)
    parser.add_argument("--handshake", required=True, help="the run's handshake directory (ready, go, done files)")
    return parser.parse_args(argv)


def dataset_spec(scenario: Scenario) -> DatasetSpec:
    return DatasetSpec(name=f"synthetic-{scenario.name}", size=scenario.dataset_size, shard_size=scenario.shard_size,
                       epochs=scenario.epochs, shuffle_seed=scenario.seed, max_attempts=3, lease_s=30.0)


class Trainer:
    """The model, its optimizer and one training step."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.model = make_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)
        self.loss_fn = nn.CrossEntropyLoss()

    def backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> None:
        self.optimizer.zero_grad()
        self.loss_fn(self.model(inputs), labels).backward()


def train_async(agent: Agent, trainer: Trainer, pacer: Pacer, data: ShardedDataset) -> int:
    """Pull shards and step at this worker's own pace until the sharder says the job is finished."""
    trained = 0
    try:
        while not data.finished:
            for inputs, labels in batches(agent, iter(data)):
                started = pacer.now_s()
                trainer.backward(inputs, labels)
                trainer.optimizer.step()
                pacer.pace(len(labels), started)
                trained += len(labels)
                agent.step(samples=len(labels))
    finally:
        data.close()
    return trained


def train_sync(agent: Agent, trainer: Trainer, pacer: Pacer, feed) -> int:
    """Lockstep steps with the batch-weighted all-reduce, until every rank's feed is exhausted."""
    averager = WeightedGradientAverager()
    trained = 0
    while True:
        with agent.data_wait():
            batch = feed.take(agent.batch_size)
        started = pacer.now_s()
        count = 0 if batch is None else len(batch[1])
        if count:
            trainer.backward(*batch)
        pacer.pace(count, started)
        with agent.sync_wait():  # one collective: gradients, batch sizes, and how many ranks have data left
            global_batch, (ranks_with_data,) = averager.sync_counting(trainer.model, count, [int(not feed.exhausted)])
        if global_batch:
            trainer.optimizer.step()
        trained += count
        agent.step(samples=count)
        if not ranks_with_data:
            return trained


def sync_feed(agent: Agent, source, scenario: Scenario) -> ShardFeed:
    """Dynamic shards for a synchronous rank: one shard held at a time, two batches buffered.

    Whatever a rank holds or buffers when the epoch's shards run out is
    trained while the other ranks have nothing, so both are kept small; the
    feed thread fetches the next shard while two batches are still buffered.
    """
    data = agent.shards(source, dataset_spec(scenario))
    data.quota = 1
    return ShardFeed(data, lambda: 2 * agent.batch_size).start()


def run(args: argparse.Namespace) -> int:
    torch.set_num_threads(1)
    scenario = Scenario.load(args.scenario)
    world, rank = len(scenario.workers), args.rank
    handshake = Path(args.handshake)
    source = SyntheticClassification(scenario.dataset_size, seed=scenario.seed)
    trainer = Trainer(scenario.seed)
    if args.training == "sync":
        dist.init_process_group("gloo", init_method=f"file://{handshake / 'group'}", rank=rank, world_size=world,
                                timeout=GROUP_TIMEOUT)
    settings = load_settings()
    try:
        with Agent(settings=settings, rank=rank, batch_size=scenario.batch_size) as agent:
            feed = data = None
            if args.training == "async":
                data = agent.shards(source, dataset_spec(scenario))
                data.prepare()  # the job's first contact with the sharder, before the clock starts
            else:
                feed = (StaticFeed(source.inputs, source.labels, rank, world, scenario.epochs, scenario.seed)
                        if args.sharding == "static"
                        else sync_feed(agent, source, scenario))
            write_atomically(ready_file(handshake, rank), str(os.getpid()))
            pacer = Pacer(scenario, rank, wait_for_start(handshake))
            if feed is None:
                trained = train_async(agent, trainer, pacer, data)
            else:
                try:
                    trained = train_sync(agent, trainer, pacer, feed)
                finally:
                    feed.close()
            result = {"finished_s": pacer.now_s(), "samples": trained, "steps": agent.step_count}
            write_atomically(done_file(handshake, rank), json.dumps(result))
    except WorkerExit as exc:
        return int(exc.code)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(parse_args(argv)))


if __name__ == "__main__":
    main()
