"""A demo worker's synchronous training (dedicated cluster): lockstep steps, one all-reduce each.

Every step ends in the batch-weighted gradient all-reduce
(:class:`~antdt.worker.ddp.WeightedGradientAverager`, gloo), which also
carries how many ranks still have data and every rank's samples into the
ledger; then the optimizer step, then the agent commits the step's samples.
Samples come from dynamic shards (a non-blocking feed, :mod:`antdt.worker.feeds`)
or, for the baseline, a static slice.

A rank whose collective fails (a peer died) or outwaits the step-sized
timeout (a peer is stuck: :class:`~antdt.worker.ddp.StepSizedTimeout`) exits
at once with :data:`~antdt.worker.ddp.EXIT_GROUP_BROKEN`, saying nothing more on the bus: no leaving
announcement (which would return its shards while its last commits are
still on their way), no further report. Its generation is over; what it did
after the last checkpoint is rewound.

Failures are handled as torchelastic does: about every ``checkpoint_every_s``
of the scenario (rank 0 keeps the time and raises a flag in a step's
all-reduce, so every rank learns it at the same step) the ranks agree on a
shard-state version and rank 0 saves the model, the optimizer, the ledger,
every rank's batch size and that version together. When any rank dies the
harness stops them all and starts a new generation, which restores the
checkpoint and rewinds the shard state to its version before reading any
data: what the model lost is trained again, nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from antdt.demo.phases import Phase
from antdt.demo.steptrace import LOSS_SCALE, StepTrace, trace_path
from antdt.settings import Settings
from antdt.sizing.inband import InBandSizer
from antdt.worker.agent import Agent
from antdt.worker.checkpoint import load_checkpoint, save_atomically, save_checkpoint
from antdt.worker.ddp import (
    StepSizedTimeout,
    WeightedGradientAverager,
    agreed_checkpoint_version,
    broke_the_group,
    end_broken_group,
)
from antdt.worker.feeds import ShardFeed, StaticFeed
from antdt.worker.ledger import LedgerSlots, SampleLedger

# set-up and checkpoint collectives; steps have their own bound
GROUP_TIMEOUT = timedelta(seconds=45)
SNAPSHOT_EVERY_S = 1.0
#: Samples in the step that times every rank before the first (:meth:`Lockstep._calibrate`).
CALIBRATION_SAMPLES = 4
CHECKPOINT = "sync-checkpoint.pt"


def run_sync(worker, settings: Settings, started: float) -> None:
    run_in_group(worker, settings, started, lambda agent: Lockstep(worker, agent).run())


def run_in_group(
    worker, settings: Settings, started: float, train: Callable[[Agent], None]
) -> None:
    """Join the generation's gloo group and the agent, then ``train``; a broken group ends the rank
    (exit 77)."""
    args = worker.args
    joined = time.monotonic()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{worker.handshake / f'group-{args.generation}'}",
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


class Lockstep:
    """One rank's part of the synchronous run."""

    def __init__(self, worker, agent: Agent):
        self.worker, self.agent = worker, agent
        scenario = worker.scenario
        self.dynamic = worker.args.sharding == "dynamic"
        self.ledger = SampleLedger(scenario.dataset_size, scenario.epochs)
        cap = scenario.batch_size * worker.world  # a rank's batch never exceeds the global batch
        self.averager = WeightedGradientAverager(
            ledger=LedgerSlots(self.ledger, worker.world, worker.rank, cap),
            timeout=StepSizedTimeout(),
        )
        self.sizer = (
            InBandSizer(worker.world, worker.rank, [scenario.batch_size] * worker.world)
            if worker.args.sizing == "in-band"
            else None
        )
        self.checkpoint_path = worker.handshake / CHECKPOINT
        self.data = agent.shards(worker.source, worker.spec) if self.dynamic else None
        self.static = (
            None
            if self.dynamic
            else StaticFeed(
                worker.source.inputs,
                worker.source.labels,
                worker.rank,
                worker.world,
                scenario.epochs,
                scenario.seed,
            )
        )
        self.snapshots = ModelSnapshots(worker)  # every rank holds the same model
        self._checkpoint_at = time.monotonic() + self.worker.scenario.checkpoint_every_s
        # what checkpointing cost this rank (the job waits for it)
        self.checkpoints, self.checkpoint_s = 0, 0.0

    def run(self) -> None:
        began = time.monotonic()
        self._restore_or_start()
        feed = self._feed()
        print(
            f"generation {self.worker.args.generation}: rank {self.worker.rank} resumes at step "
            f"{self.agent.step_count}, batch {self.agent.batch_size} "
            f"({time.monotonic() - began:.2f} s to restore)",
            flush=True,
        )
        try:
            pacer = self.worker.ready_and_wait()
            if self.sizer is not None and self.agent.step_count == 0:
                self._calibrate(pacer)
            trained = self._steps(feed, pacer)
            self._final(pacer, trained)
        finally:
            feed.close()

    # ------------------------------------------------------------ checkpoints

    def _restore_or_start(self) -> None:
        """The last checkpoint, with the shard state rewound to it (before any rank reads data);
        else a first one."""
        if not self.checkpoint_path.exists():
            if self.dynamic:
                self.data.quota = 1
                # defines the job's dataset: the sharder can then issue versions
                self.data.prepare()
            self._checkpoint()
            return
        model, optimizer = self.worker.trainer.model, self.worker.trainer.optimizer
        info = load_checkpoint(self.checkpoint_path, model, optimizer)
        self.ledger.load_state_dict({"counts": info.extra["ledger"]})
        self.agent.step_count = info.step
        # as rebalanced before the failure
        self.agent.batch_size = info.extra["batch_sizes"][self.worker.rank]
        if self.sizer is not None:
            self.sizer.restore(info.extra["batch_sizes"])
        if self.static is not None:
            self.static.skip_to(info.extra["positions"][self.worker.rank])
        if self.dynamic and self.worker.rank == 0:
            self.data.rewind(info.shard_version)
        dist.barrier()

    def _checkpoint(self) -> None:
        """Every rank's commits so far covered by one version; rank 0 saves it with the model and
        the ledger."""
        began = time.monotonic()
        positions = torch.zeros((2, self.worker.world), dtype=torch.int64)
        positions[0, self.worker.rank] = self.static.position if self.static is not None else 0
        positions[1, self.worker.rank] = self.agent.batch_size
        dist.all_reduce(positions)
        client = self.agent.shard_client if self.dynamic else None
        version = agreed_checkpoint_version(
            client.flush if client else (lambda: None),
            (lambda: client.checkpoint(self.data.epoch, self.agent.step_count))
            if client
            else (lambda: 0),
        )
        if self.worker.rank == 0:
            trainer = self.worker.trainer
            save_checkpoint(
                self.checkpoint_path,
                trainer.model,
                trainer.optimizer,
                version,
                self.agent.step_count,
                {
                    "ledger": self.ledger.counts.clone(),
                    "positions": positions[0].tolist(),
                    "batch_sizes": positions[1].tolist(),
                },
            )
        self._checkpoint_at = time.monotonic() + self.worker.scenario.checkpoint_every_s
        self.checkpoints += 1
        self.checkpoint_s += time.monotonic() - began

    # ------------------------------------------------------------ steps

    def _calibrate(self, pacer) -> None:
        """Time a step of a few samples on every rank, so the first real step is already split by
        speed.

        The samples are random inputs, not data (no shard is read, nothing is
        committed) and their gradients are dropped; as LB-BSP profiles before
        it sizes, this costs one short step and saves a first step at the
        initial batch paced by the slowest rank. Booked as synchronisation:
        a one-off, not a slow first step.
        """
        trainer = self.worker.trainer
        features = self.worker.source.inputs.shape[1]
        inputs = torch.randn(
            CALIBRATION_SAMPLES, features, generator=torch.Generator().manual_seed(0)
        )
        labels = torch.zeros(CALIBRATION_SAMPLES, dtype=torch.long)
        with self.agent.sync_wait():
            began, started = time.perf_counter(), pacer.now_s()
            trainer.backward(inputs, labels)
            pacer.pace(CALIBRATION_SAMPLES, started)
            timed = torch.tensor(
                self.sizer.encode(CALIBRATION_SAMPLES, time.perf_counter() - began),
                dtype=torch.int64,
            )
            trainer.optimizer.zero_grad()
            dist.all_reduce(timed)
            self.agent.batch_size = self.sizer.decide(timed.tolist())

    def _feed(self):
        if self.static is not None:
            return self.static
        self.data.quota = 1
        # One shard held at a time, two batches buffered: what a rank holds when the epoch's shards
        # run out is trained while the others have nothing, so both are kept small.
        return ShardFeed(self.data, lambda: 2 * self.agent.batch_size).start()

    def _steps(self, feed, pacer) -> int:
        """Lockstep steps until every rank's feed is exhausted; returns this rank's samples."""
        agent, trainer, phases = self.agent, self.worker.trainer, self.worker.phases
        trained = 0
        trace = StepTrace(
            trace_path(self.worker.out, self.worker.scenario.workers[self.worker.rank].name)
        )
        try:
            while True:
                began = time.perf_counter()
                with agent.data_wait():
                    batch = feed.take(agent.batch_size)
                fed, started = time.perf_counter(), pacer.now_s()
                count, loss = 0, 0.0
                if batch is not None:
                    inputs, labels = agent.untag(batch)
                    count = len(labels)
                    loss = trainer.backward(inputs, labels)
                pacer.pace(count, started)
                computed = time.perf_counter()
                due = int(self.worker.rank == 0 and time.monotonic() >= self._checkpoint_at)
                sizing = self.sizer.encode(count, computed - fed) if self.sizer is not None else []
                with phases.during(Phase.ALLREDUCE), agent.sync_wait():
                    global_batch, (ranks_with_data, checkpoint_due, loss_sum, *sizes) = (
                        self.averager.sync_counting(
                            trainer.model,
                            count,
                            [
                                int(not feed.exhausted),
                                due,
                                round(loss * count * LOSS_SCALE),
                                *sizing,
                            ],
                            tags=agent.pending_tags,
                        )
                    )
                reduced = time.perf_counter()
                if self.sizer is not None:
                    agent.batch_size = self.sizer.decide(sizes)
                if global_batch:
                    trainer.optimizer.step()
                trained += count
                step = agent.step_count
                # commits this rank's samples: their update is in the model
                agent.step(samples=count)
                # Checkpoints and the evaluator's snapshots hold every rank up alike: they are
                # booked as synchronisation, so they do not read as one rank's slower compute and
                # skew its batch size.
                with agent.sync_wait():
                    self.snapshots.maybe()
                    if ranks_with_data and checkpoint_due:
                        self._checkpoint()
                trace.write(
                    step,
                    started,
                    count,
                    global_batch,
                    fed - began,
                    computed - fed,
                    reduced - computed,
                    time.perf_counter() - reduced,
                    loss_sum / LOSS_SCALE / global_batch if global_batch else None,
                )
                if not ranks_with_data:
                    return trained
        finally:
            trace.close()

    def _final(self, pacer, trained: int) -> None:
        print(
            f"generation {self.worker.args.generation}: rank {self.worker.rank}: "
            f"{self.agent.step_count} steps, {self.checkpoints} checkpoints taking "
            f"{self.checkpoint_s:.2f} s",
            flush=True,
        )
        if self.worker.rank == 0:
            self.ledger.write(self.worker.out)
            self.snapshots.maybe(final=True)
        self.worker.finish(self.agent, pacer, trained)


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
