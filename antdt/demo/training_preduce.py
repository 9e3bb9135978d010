"""A demo worker's partial-reduce training: local steps, then an average with whoever is ready.

Each worker trains its own replica at its own pace on dynamic shards (a
local SGD step per batch, so its samples are in its replica when the step
commits them), then announces readiness and waits for the group the
grouper forms (:mod:`antdt.services.grouper`) and averages its replica with
the group's (:class:`~antdt.worker.preduce.averaging.GroupAverager`). A
straggler holds up only the group it joins, for one step.

The ledger: each rank counts the samples it applied to its own replica
since the last group of every rank; such a group (a checkpoint, the end)
sums the counts into rank 0's ledger in the same all-reduce that averages
the models, so the ledger holds exactly what the averaged model holds.

Checkpoints come from the grouper (a CHECKPOINT group of every rank): the
models are averaged, the ranks agree on a shard-state version and rank 0
saves the model, the ledger and that version. A broken group restarts
from it as the synchronous demo does (:mod:`antdt.demo.training_sync`).
Rank 0 leaves its replica where the evaluator reads it every second.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from antdt.demo.phases import Phase
from antdt.demo.training_sync import ModelSnapshots, run_in_group
from antdt.schemas.models import GroupFormed, GroupReason
from antdt.settings import Settings
from antdt.worker.agent import Agent
from antdt.worker.checkpoint import load_checkpoint, save_checkpoint
from antdt.worker.ddp import agreed_checkpoint_version
from antdt.worker.feeds import ShardFeed
from antdt.worker.ledger import SampleLedger
from antdt.worker.preduce.averaging import GroupAverager
from antdt.worker.preduce.client import GroupClient

#: Longest wait for a group: a checkpoint waits for the slowest rank's step, the end for its last
#: shards.
GROUP_WAIT_S = 120.0
CHECKPOINT = "preduce-checkpoint.pt"


def run_preduce(worker, settings: Settings, started: float) -> None:
    run_in_group(worker, settings, started, lambda agent: PartialReduce(worker, agent).run())


class PartialReduce:
    """One rank's part of the partial-reduce run."""

    def __init__(self, worker, agent: Agent):
        self.worker, self.agent = worker, agent
        scenario = worker.scenario
        # rank 0: the job's; others: none
        self.ledger = SampleLedger(scenario.dataset_size, scenario.epochs)
        # this replica's, since the last whole group
        self.applied = SampleLedger(scenario.dataset_size, scenario.epochs)
        self.averager = GroupAverager(worker.trainer.model)
        self.groups = GroupClient.for_agent(agent, worker.args.generation)
        self.checkpoint_path = worker.handshake / CHECKPOINT
        self.data = agent.shards(worker.source, worker.spec)
        # what a rank holds when the epoch's shards run out, the others wait for: kept small
        self.data.quota = 1
        self.snapshots = ModelSnapshots(worker)  # rank 0's replica
        self.reasons: dict[str, int] = {}

    def run(self) -> None:
        feed = None
        try:
            self._restore_or_start()
            # One batch read ahead on the feed's thread: the next shards arrive while this step
            # computes.
            feed = ShardFeed(self.data, lambda: self.agent.batch_size).start()
            pacer = self.worker.ready_and_wait()
            trained = self._steps(feed, pacer)
            self._final(pacer, trained)
        finally:
            self.groups.close()
            if feed is not None:
                feed.close()
            else:
                self.data.close()

    # ------------------------------------------------------------ checkpoints

    def _restore_or_start(self) -> None:
        """The last checkpoint (every rank's replica starts from it), the shard state rewound; else
        a first one."""
        if not self.checkpoint_path.exists():
            self.data.prepare()  # defines the job's dataset: the sharder can then issue versions
            self._checkpoint()
            return
        info = load_checkpoint(
            self.checkpoint_path, self.worker.trainer.model, self.worker.trainer.optimizer
        )
        if self.worker.rank == 0:
            self.ledger.load_state_dict({"counts": info.extra["ledger"]})
            self.data.rewind(info.shard_version)
        self.agent.step_count = info.step
        dist.barrier()

    def _checkpoint(self) -> None:
        """Every rank's commits covered by one version; rank 0 saves it with the averaged model and
        the ledger."""
        client = self.agent.shard_client
        version = agreed_checkpoint_version(
            client.flush, lambda: client.checkpoint(self.data.epoch, self.agent.step_count)
        )
        if self.worker.rank == 0:
            trainer = self.worker.trainer
            save_checkpoint(
                self.checkpoint_path,
                trainer.model,
                trainer.optimizer,
                version,
                self.agent.step_count,
                {"ledger": self.ledger.counts.clone()},
            )

    # ------------------------------------------------------------ steps

    def _steps(self, feed: ShardFeed, pacer) -> int:
        """Local steps, each followed by a group average, until the sharder has nothing left;
        returns the samples."""
        agent, trainer = self.agent, self.worker.trainer
        trained = 0
        while (batch := self._next_batch(feed)) is not None:
            inputs, labels = agent.untag(batch)
            started = pacer.now_s()
            trainer.backward(inputs, labels)
            pacer.pace(len(labels), started)
            trainer.optimizer.step()
            self.applied.add_tags(agent.pending_tags)
            trained += len(labels)
            agent.step(samples=len(labels))  # commits the samples: their update is in this replica
            self._average(finished=False)
            self.snapshots.maybe()
        return trained

    def _next_batch(self, feed: ShardFeed):
        """The next batch (short while the sharder has no more now), or None once every epoch is
        done.

        While the sharder says wait (others hold the epoch's last shards),
        this rank goes on joining groups with its replica as it is: a
        checkpoint gathers every rank, and a rank that only waited for data
        would hold the others at it while they hold the data it waits for.
        """
        while True:
            with self.agent.data_wait():
                batch = feed.take(self.agent.batch_size)
            if batch is not None or feed.exhausted:
                return batch
            self._average(finished=False)

    def _average(self, finished: bool) -> GroupFormed:
        """Announce, wait for the group, average with it (and for a whole group, sum the ledgers and
        checkpoint)."""
        with self.worker.phases.during(Phase.ALLREDUCE), self.agent.sync_wait():
            group = self.groups.wait(
                self.groups.announce(self.agent.step_count, finished), GROUP_WAIT_S
            )
            summed = self.averager.average(group, self.applied.counts)
            if summed is not None:
                self.applied.counts.zero_()
                if self.worker.rank == 0:
                    self.ledger.counts += summed.to(torch.int32)
            if group.reason is GroupReason.CHECKPOINT:
                self._checkpoint()
        self.reasons[group.reason.value] = self.reasons.get(group.reason.value, 0) + 1
        return group

    def _final(self, pacer, trained: int) -> None:
        """The group of every rank at the end: one model, one ledger."""
        group = self._average(finished=True)
        if group.reason is not GroupReason.FINAL:
            raise RuntimeError(f"the last group was {group.reason.value}, not FINAL")
        print(
            f"generation {self.worker.args.generation}: rank {self.worker.rank}: "
            f"{self.agent.step_count} steps, groups {self.reasons}",
            flush=True,
        )
        if self.worker.rank == 0:
            self.ledger.write(self.worker.out)
            self.snapshots.maybe(final=True)
        self.worker.finish(self.agent, pacer, trained)
