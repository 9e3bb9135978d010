"""One demo worker process: a real model, the agent, paced steps, one shared model.

Started by the harness (:mod:`antdt.demo.harness`) as
``python -m antdt.demo.trainer``, configured by ``ANTDT_*`` variables (bus,
job, worker and node ids) and a few arguments. Its life:

1. build the model and the data source, enter the agent, open the data
   (and, for synchronous runs, join the process group and restore the last
   checkpoint);
2. tell the harness it is ready (a ``ready-<rank>`` file in the run's
   handshake directory) and wait for the start signal (the ``go`` file, which
   holds the run's start time): process start and ``import torch`` are the
   same for every run and are not measured;
3. train, one shared model either way:

   * ``async`` (AntDT-ND's shared cluster): each worker pulls shards and
     steps at its own pace against the parameter server
     (:mod:`antdt.demo.training_async`);
   * ``sync`` (dedicated cluster): the user's DDP loop, through
     :class:`~antdt.worker.elastic.job.ElasticJob` (AntDT-DD) or, for the
     ``static-bsp`` baseline, torch's own DDP with ``DistributedSampler``
     (:mod:`antdt.demo.training_sync`);
   * ``preduce`` (partial reduce): the user's loop through
     :class:`~antdt.worker.preduce.job.PartialReduceJob`: each worker steps
     its own replica, then averages it with the first workers ready
     (:mod:`antdt.demo.training_preduce`);

4. write ``done-<rank>.json`` (finish time, samples, steps).

A RESTART or EVICT command ends the process with the agent's exit code; the
harness starts a RESTARTed worker again, and the new incarnation skips the
start signal (it is already set) and carries on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from antdt.bus.config import describe_profile
from antdt.demo.handshake import done_file, ready_file, wait_for_start, write_atomically
from antdt.demo.pacing import Pacer
from antdt.demo.phases import PhaseWriter
from antdt.demo.plans import Sharding
from antdt.demo.scenario import Scenario
from antdt.errors import ShardStateLost
from antdt.schemas.models import DatasetSpec
from antdt.settings import load_settings
from antdt.sizing import BatchSizing
from antdt.training import TrainingMode
from antdt.worker.agent import Agent, WorkerExit
from antdt.worker.example import SyntheticClassification, make_model

LR = 0.05


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="antdt demo worker (started by the harness)")
    parser.add_argument("--scenario", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--training", type=TrainingMode, choices=list(TrainingMode), required=True)
    parser.add_argument("--sharding", type=Sharding, choices=list(Sharding), required=True)
    parser.add_argument(
        "--handshake", required=True, help="the run's handshake directory (ready, go, done files)"
    )
    parser.add_argument(
        "--out", required=True, help="the run's directory: ledger files, model snapshots"
    )
    parser.add_argument(
        "--ps", default="", help="async: the parameter-server shards, HOST:PORT,... in shard order"
    )
    parser.add_argument(
        "--generation", type=int, default=0, help="sync: how many times the group was restarted"
    )
    parser.add_argument(
        "--node", default=None, help="the scenario node it runs on (default: where it starts)"
    )
    parser.add_argument(
        "--sizing",
        type=BatchSizing,
        choices=list(BatchSizing),
        default=BatchSizing.COMMANDS,
        help="sync: who sizes the local batches (the controller's commands, or every step in-band)",
    )
    return parser.parse_args(argv)


def dataset_spec(scenario: Scenario, static: bool = False) -> DatasetSpec:
    """The demo's dataset; ``static``: every worker owns its own shards (the static-async
    baseline)."""
    return DatasetSpec(
        name=f"synthetic-{scenario.name}",
        size=scenario.dataset_size,
        shard_size=scenario.shard_size,
        epochs=scenario.epochs,
        shuffle_seed=scenario.seed,
        max_attempts=3,
        lease_s=30.0,
        owners=[w.name for w in scenario.workers] if static else [],
    )


class Trainer:
    """The model, its optimizer and one backward pass."""

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        self.model = make_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=LR)
        self.loss_fn = nn.CrossEntropyLoss()

    def backward(self, inputs: torch.Tensor, labels: torch.Tensor) -> float:
        """Gradients of the batch's mean loss; returns that loss."""
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(inputs), labels)
        loss.backward()
        return float(loss.detach())


class Worker:
    """What a demo worker is given: its scenario, place, files, data and model."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.scenario = Scenario.load(args.scenario)
        self.rank, self.world = args.rank, len(self.scenario.workers)
        self.handshake, self.out = Path(args.handshake), Path(args.out)
        self.source = SyntheticClassification(self.scenario.dataset_size, seed=self.scenario.seed)
        self.spec = dataset_spec(
            self.scenario,
            static=args.training is TrainingMode.ASYNC and args.sharding is Sharding.STATIC,
        )
        self.trainer = Trainer(self.scenario.seed)
        self.phases = PhaseWriter(self.handshake, self.rank)

    def ready_and_wait(self) -> Pacer:
        """Tell the harness this worker can train; the pacer, once the run has started."""
        write_atomically(ready_file(self.handshake, self.rank), str(os.getpid()))
        return Pacer(self.scenario, self.rank, wait_for_start(self.handshake), self.args.node)

    def finish(self, agent: Agent, pacer: Pacer, trained: int) -> None:
        result = {"finished_s": pacer.now_s(), "samples": trained, "steps": agent.step_count}
        write_atomically(done_file(self.handshake, self.rank), json.dumps(result))


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    torch.set_num_threads(1)
    worker = Worker(args)
    settings = load_settings()
    print(f"{settings.worker_id}: {describe_profile(settings)}", flush=True)
    try:
        if args.training is TrainingMode.ASYNC:
            from antdt.demo.training_async import train_async

            with Agent(
                settings=settings, rank=worker.rank, batch_size=worker.scenario.batch_size
            ) as agent:
                train_async(worker, agent, [a for a in args.ps.split(",") if a])
        elif args.training is TrainingMode.PREDUCE:
            from antdt.demo.training_preduce import run_preduce

            run_preduce(worker, settings, started)
        else:
            from antdt.demo.training_sync import run_sync

            run_sync(worker, settings, started)
    except WorkerExit as exc:
        return int(exc.code)
    except ShardStateLost as exc:  # a restart cannot help: the harness ends the run on the code
        print(f"{settings.worker_id}: {exc}", flush=True)
        return exc.exit_code
    return 0


def forked(argv: list[str]) -> int:
    """The fork server's entry (:mod:`antdt.demo.launcher`)."""
    return run(parse_args(argv))


def main(argv: list[str] | None = None) -> None:
    sys.exit(run(parse_args(argv)))


if __name__ == "__main__":
    main()
