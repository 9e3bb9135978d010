"""A demo worker's synchronous training: a user's DDP loop, through antdt or through torch alone.

The antdt plans (``dd``, ``dd-commands``, chaos) train through the public
API, :class:`~antdt.worker.elastic.job.ElasticJob`, in the loop
docs/torchrun.md shows: dynamic shards, DD's batch sizes, the weighted
all-reduce, agreed checkpoints and restores, the in-model ledger are all
its own. The ``static-bsp`` baseline is what a user runs without antdt:
torch's ``DistributedDataParallel`` with a ``DistributedSampler``, no
checkpoints. Either way the demo only adds, around the loop body:

* pacing (:class:`~antdt.demo.pacing.Pacer`) between forward and backward,
  so a rank is as many times slower per sample as the scenario says, the
  all-reduce (inside ``backward()``) coming after it as on a slow device;
* the phase file (the backward, with its bucketed all-reduce, is
  ``ALLREDUCE``) so chaos can kill a rank mid-collective;
* the step trace (:mod:`~antdt.demo.steptrace`, from the agent's step
  records) and rank 0's model snapshots for the evaluator, both booked as
  synchronisation: the whole job waits for them, not one rank's compute.

The process group is the harness's (a ``file://`` rendezvous per
generation) rather than torchrun's; a rank that finds the group broken
exits 77 and the harness starts a new generation, which the job restores
from its last checkpoint, as torchrun's ``--max-restarts`` would.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from antdt.demo.phases import Phase
from antdt.demo.plans import Sharding
from antdt.demo.steptrace import StepTrace, trace_path
from antdt.settings import Settings
from antdt.training import TrainingMode
from antdt.worker.agent import Agent
from antdt.worker.checkpoint import save_atomically
from antdt.worker.ddp import broke_the_group, end_broken_group
from antdt.worker.elastic.job import ElasticJob
from antdt.worker.ledger import SampleLedger

# set-up and checkpoint collectives; steps have their own bound
GROUP_TIMEOUT = timedelta(seconds=45)
SNAPSHOT_EVERY_S = 1.0
CHECKPOINT = "sync-checkpoint.pt"


def run_sync(worker, settings: Settings, started: float) -> None:
    train = train_plain if worker.args.sharding is Sharding.STATIC else train_elastic
    run_in_group(worker, settings, started, lambda agent: train(worker, agent))


def group_init_method(handshake: Path, generation: int) -> str:
    """The generation's rendezvous file as a ``file://`` URL, absolute: a relative path (``antdt
    demo``'s default ``reports/...``) would read as a host name, and the rendezvous would wait for
    a file it can never create."""
    return (handshake / f"group-{generation}").absolute().as_uri()


def run_in_group(
    worker, settings: Settings, started: float, train: Callable[[Agent], None]
) -> None:
    """Join the generation's gloo group and the agent, then ``train``; a broken group ends the rank
    (exit 77)."""
    args = worker.args
    joined = time.monotonic()
    dist.init_process_group(
        "gloo",
        init_method=group_init_method(worker.handshake, args.generation),
        rank=worker.rank,
        world_size=worker.world,
        timeout=GROUP_TIMEOUT,
    )
    try:
        grouped = time.monotonic()
        with Agent(
            settings=settings,
            rank=worker.rank,
            world_size=worker.world,
            batch_size=worker.scenario.batch_size,
        ) as agent:
            print(
                f"generation {args.generation}: rank {worker.rank} set up in "
                f"{grouped - started:.2f} s (the process group {grouped - joined:.2f} s), "
                f"its agent {time.monotonic() - grouped:.2f} s",
                flush=True,
            )
            try:
                train(agent)
            except Exception as exc:
                if not broke_the_group(exc):  # a peer died, or one is stuck
                    raise
                end_broken_group(f"generation {args.generation}: rank {worker.rank}", exc)
    finally:
        dist.destroy_process_group()


class DemoSteps:
    """What the demo adds around a loop body (module docstring): pacing, phases, trace,
    snapshots."""

    def __init__(self, worker, agent: Agent):
        self.worker, self.agent = worker, agent
        # the servers apply an asynchronous update and hold the model the evaluator reads
        self.asynchronous = worker.args.training is TrainingMode.ASYNC
        self.pacer = worker.ready_and_wait()
        self.trace = StepTrace(trace_path(worker.out, worker.scenario.workers[worker.rank].name))
        self.snapshots = ModelSnapshots(worker)
        self.trained = 0
        self._loss: float | None = None
        self._traced: int | None = None  # the last step traced

    def train(self, model, inputs, labels) -> None:
        """Forward, paced, backward and the optimizer step (asynchronous: the servers' step).

        From the backward until the next batch the rank is in the job's
        exchange (the all-reduce inside ``backward()``, then the step's
        sums; partial reduce's group average after the step; the push to
        the parameter servers): the phase file says ``ALLREDUCE`` (``PUSH``)
        for chaos.
        """
        trainer, phases = self.worker.trainer, self.worker.phases
        phases.set(Phase.OTHER)
        started = self.pacer.now_s()
        loss = trainer.loss_fn(model(inputs), labels)
        trainer.optimizer.zero_grad()
        self.pacer.pace(len(labels), started)
        phases.set(Phase.PUSH if self.asynchronous else Phase.ALLREDUCE)
        loss.backward()
        if not self.asynchronous:
            trainer.optimizer.step()
        self.trained += len(labels)
        self._loss = float(loss.detach())

    def stepped(self, global_batch: int) -> None:
        """After a step's end (the agent's record written): trace it once, snapshot if due.

        The loss is rank 0's own batch's (the job's collectives carry no
        loss), so a trace of ``dd`` is noisier where rank 0's batch is small.
        """
        record = self.agent.last_step
        if record is not None and record.step != self._traced:
            self._traced = record.step
            spent = record.data_wait_s + record.compute_s + record.sync_wait_s
            self.trace.write(
                record.step,
                self.pacer.now_s() - spent,
                record.samples,
                global_batch,
                record.data_wait_s,
                record.compute_s,
                record.sync_wait_s,
                0.0,
                self._loss if record.samples else None,
            )
        self._loss = None
        if not self.asynchronous:
            with self.agent.sync_wait():
                self.snapshots.maybe()

    def finish(self) -> None:
        self.worker.phases.set(Phase.OTHER)
        self.trace.close()
        if not self.asynchronous:
            self.snapshots.maybe(final=True)
        self.worker.finish(self.agent, self.pacer, self.trained)


def job_options(worker, agent: Agent, checkpoint: str | None) -> dict:
    """What a demo job is given, whatever its mode: the scenario's dataset and batch, the worker's
    agent, and where the mode keeps them, the handshake folder's checkpoint and the run's ledger
    folder (none for the parameter server, whose servers keep both)."""
    scenario = worker.scenario
    options = {
        "batch_size": scenario.batch_size,
        "epochs": scenario.epochs,
        "shard_size": scenario.shard_size,
        "seed": scenario.seed,
        "name": worker.spec.name,
        "agent": agent,
    }
    if checkpoint is not None:
        options |= {"checkpoint": worker.handshake / checkpoint, "ledger_dir": worker.out}
    return options


def train_elastic(worker, agent: Agent) -> None:
    """The antdt plans: the user's loop over :meth:`ElasticJob.batches` (module docstring)."""
    trainer = worker.trainer
    ddp = DistributedDataParallel(trainer.model)
    with ElasticJob(
        ddp,
        trainer.optimizer,
        worker.source,
        checkpoint_every_s=worker.scenario.checkpoint_every_s,
        sizing=worker.args.sizing,
        **job_options(worker, agent, CHECKPOINT),
    ) as job:
        steps = DemoSteps(worker, agent)
        for inputs, labels in job.batches():
            steps.stepped(job.step_samples)  # the step before this one
            steps.train(ddp, inputs, labels)
        steps.stepped(job.step_samples)
    steps.finish()


def train_plain(worker, agent: Agent) -> None:
    """The ``static-bsp`` baseline: torch's DDP over a ``DistributedSampler``, no antdt in the
    loop.

    The agent only reports each step's timing (the demo's timeline). The
    ledger counts each rank's sampler indices as their steps finish and rank
    0 sums them at the end, so the baseline is checked like every plan.
    """
    scenario, trainer = worker.scenario, worker.trainer
    ddp = DistributedDataParallel(trainer.model)
    sampler = DistributedSampler(worker.source, seed=scenario.seed)
    loader = DataLoader(worker.source, batch_size=scenario.batch_size, sampler=sampler)
    ledger = SampleLedger(scenario.dataset_size, scenario.epochs)
    steps = DemoSteps(worker, agent)
    global_batch = scenario.batch_size * worker.world
    for epoch in range(scenario.epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for indices in _in_batches(list(sampler), scenario.batch_size):
            with agent.data_wait():
                inputs, labels = next(batches)
            steps.train(ddp, inputs, labels)
            agent.step(samples=len(labels))
            ledger.add(epoch, indices)
            steps.stepped(global_batch)
    dist.all_reduce(ledger.counts)
    if worker.rank == 0:
        ledger.write(worker.out)
    steps.finish()


def _in_batches(indices: list[int], size: int) -> list[list[int]]:
    return [indices[start : start + size] for start in range(0, len(indices), size)]


class ModelSnapshots:
    """Rank 0 leaves its model where the harness evaluates it: every second, and the final one."""

    def __init__(self, worker):
        self.worker = worker
        self._due_at = 0.0

    def maybe(self, final: bool = False) -> None:
        if self.worker.rank != 0 or (not final and time.monotonic() < self._due_at):
            return
        self._due_at = time.monotonic() + SNAPSHOT_EVERY_S
        path = self.worker.out / ("model-final.pt" if final else "model-latest.pt")
        # read by the evaluator only
        save_atomically(self.worker.trainer.model.state_dict(), path, durable=False)
