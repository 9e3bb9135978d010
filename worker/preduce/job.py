"""Partial reduce under torchrun: what a script swaps in to average models in small groups.

Each rank trains its own replica (a plain module: the loop's optimizer
step applies its own gradient, no ``DistributedDataParallel``), on dynamic
shards. After each step the job commits the step's samples (they are in
this replica now), announces the rank ready to the grouper
(``antdt grouper``, or ``antdt up --grouper``) and averages the replica
with the group it forms (:class:`~antdt.worker.preduce.averaging.GroupAverager`):
a straggler holds up only the group it joins, for one step (Miao et al.,
SIGMOD 2021).

The rest is every job's (:class:`~antdt.worker.training_job.TrainingJob`),
in partial reduce's form:

* **checkpoints** come from the grouper: a CHECKPOINT group of every rank
  averages the replicas, and the ranks agree on a shard-state version that
  rank 0 saves with the averaged model; a restart loads it on every rank;
* **the ledger**: each rank counts what it applied to its own replica since
  the last group of every rank, and such a group (a checkpoint, the end)
  sums the counts in the same all-reduce that averages the models, so the
  ledger holds exactly what the averaged model holds;
* **the end** is the FINAL group of every rank: one model, one ledger;
* **while the sharder says wait** (others hold the epoch's last shards) a
  rank goes on joining groups with its replica as it is: a checkpoint
  gathers every rank, and a rank that only waited for data would hold the
  others at it while they hold the data it waits for;
* every wait is bounded (a group: ``group_wait_s``; an exchange: the
  averager's bound), and a broken group ends the process (exit 77) for
  torchrun to restart the group (``--max-restarts``).

Use (see ``examples/``)::

    with PartialReduceJob(model, optimizer, dataset, batch_size=32, checkpoint="ckpt.pt") as job:
        for inputs, labels in job.batches():
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import torch

from antdt.errors import AntdtError
from antdt.schemas.models import WHOLE_GROUP_REASONS, GroupFormed, GroupReason
from antdt.worker.dataset import shards_holding
from antdt.worker.ddp import broadcast_int
from antdt.worker.feeds import ShardFeed
from antdt.worker.ledger import SampleLedger
from antdt.worker.preduce.averaging import GroupAverager
from antdt.worker.preduce.client import GroupClient
from antdt.worker.preduce.rounds import BackgroundRounds
from antdt.worker.training_job import TrainingJob, require_module_itself

#: Longest wait for a group: a checkpoint waits for the slowest rank's step, the end for its last
#: shards.
GROUP_WAIT_S = 120.0
#: A generation is rank 0's clock in seconds since this instant (2023-11-14): an Avro int to 2091.
GENERATION_EPOCH_S = 1_700_000_000


def agreed_generation() -> int:
    """This process group's generation, the same on every rank and greater than any earlier one of
    the job: rank 0's clock in whole seconds, broadcast (a collective).

    Not torchrun's restart count: each node's agent counts its own, and one restarted because
    another node joined or left (an eviction) does not count it, so in a job of several nodes the
    ranks of one group would announce different generations and the grouper would never group
    them. A group takes seconds to start again, and hosts' clocks agree far closer than that.
    """
    return broadcast_int(int(time.time()) - GENERATION_EPOCH_S)


def shards_read(batch_size: int, shard_size: int) -> int:
    """Shards a rank reads at once (its quota): those one batch spans, at least one.

    Few, since what a rank holds when the epoch's shards run out the others
    wait for; but a batch spanning shards granted one at a time waits on a
    sharder round trip per shard (the standard scenario's shards of 16 and
    batches of 32: 0.3 to 9 s of a worker's minute waiting for data,
    docs/partial-reduce.md). With the batch's shards held, the next ones are
    asked for as soon as a batch is read, while it trains.
    """
    return max(1, shards_holding(batch_size, shard_size))


class PartialReduceJob(TrainingJob):
    """One rank's part of a partial-reduce job (module docstring). Use as a context manager."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset,
        *,
        batch_size: int,
        checkpoint: str | Path,
        generation: int | None = None,
        group_wait_s: float = GROUP_WAIT_S,
        **options,
    ):
        """``model``: this rank's replica, the module itself; ``generation``: which start of the
        process group this is, greater at every restart, which tells this group's groups from a
        lost one's (default: :func:`agreed_generation`). The rest as
        :class:`~antdt.worker.training_job.TrainingJob` takes them (checkpoints come from the
        grouper: no interval here)."""
        require_module_itself(model, "PartialReduceJob averages whole replicas in groups")
        super().__init__(
            model, optimizer, dataset, batch_size=batch_size, checkpoint=checkpoint, **options
        )
        self.generation = generation  # agreed in the set-up when not given
        self.group_wait_s = group_wait_s
        # this replica's, since the last group of every rank
        self.applied = SampleLedger(self.spec.size, self.spec.epochs)
        self.averager = GroupAverager(model)
        self.groups: GroupClient | None = None
        self.rounds: BackgroundRounds | None = None
        self.reasons: dict[str, int] = {}  # groups joined, by reason

    # ------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        # a rank that stops beating breaks the group a wait for a group may need (an evicted node)
        self._watch_peers()
        if self.generation is None:
            self.generation = self._set_up(agreed_generation)
        self.groups = GroupClient.for_agent(self.agent, self.generation)
        self.rounds = BackgroundRounds(self.groups, self.averager, self.group_wait_s, self.peers)
        self.data.quota = shards_read(self.agent.batch_size, self.spec.shard_size)
        self._set_up(self._restore_or_start)
        # one batch read ahead: the next shards arrive while this step computes
        self.feed = ShardFeed(self.data, lambda: self.agent.batch_size).start()

    def _close_mode(self) -> None:
        idle = self.rounds is None or self.rounds.close()
        if self.groups is not None and idle:  # never under the background thread's feet
            self.groups.close()

    # ------------------------------------------------------------ the loop

    def batches(self) -> Iterator[tuple]:
        """This rank's batches until every epoch is done: one forward, backward and optimizer step
        each, on this replica; each followed here by the commit and, once its group has formed, a
        group average (:mod:`~antdt.worker.preduce.rounds`)."""
        while (batch := self._next_batch()) is not None:
            inputs, labels = self.agent.untag(batch)
            yield inputs, labels
            self.applied.add_tags(self.agent.pending_tags)
            self.samples += len(labels)
            self.agent.step(samples=len(labels))  # commits the samples: they are in this replica
            self._after_step()
        if self.rounds.in_flight:
            self._round_now()  # the last announcement's group first (a checkpoint, say)
        group = self._round_now(finished=True)
        if group.reason is not GroupReason.FINAL:
            raise AntdtError(f"the last group was {group.reason.value}, not FINAL")
        self.finished = True
        self._write_ledger()

    def _next_batch(self):
        """The next batch (short while the sharder has no more now), or None once every epoch is
        done; while the sharder says wait, a group round each time (module docstring)."""
        while True:
            with self.agent.data_wait():
                batch = self.feed.take(self.agent.batch_size)
            if batch is not None or self.feed.exhausted:
                return batch
            self._round_now()

    def _after_step(self) -> None:
        """The group of the announcement in flight applied once it has formed (no wait); then the
        next announcement."""
        rounds = self.rounds
        if rounds.in_flight and not rounds.done:
            return
        if rounds.in_flight:
            self._apply(rounds)
        rounds.start(self.agent.step_count)

    def _round_now(self, finished: bool = False) -> GroupFormed:
        """A group round waited for: the one in flight, else a new announcement's."""
        if not self.rounds.in_flight:
            self.rounds.start(self.agent.step_count, finished)
        return self._apply(self.rounds)

    def _apply(self, rounds: BackgroundRounds) -> GroupFormed:
        """The round's outcome (waited for if need be) applied, booked as synchronisation: a
        group's mean added, or a group of every rank averaged here, its ledgers summed and, for a
        checkpoint, saved."""
        with self.agent.sync_wait():
            done = self._collective(rounds.take)
            group = done.group
            if group.reason in WHOLE_GROUP_REASONS:
                with self.watched(f"the {group.reason.value} group of every rank"):
                    self._collective(lambda: self._whole_group(group))
            elif done.delta is not None:
                self.averager.add(done.delta)
        self.reasons[group.reason.value] = self.reasons.get(group.reason.value, 0) + 1
        return group

    def _whole_group(self, group: GroupFormed) -> None:
        """Every rank: the replicas averaged and the ledgers summed in one all-reduce; a checkpoint
        saved."""
        summed = self.averager.average(group, self.applied.counts)
        if summed is not None:
            self.applied.counts.zero_()
            self.ledger.counts += summed.to(torch.int32)  # every rank: the same sums
        if group.reason is GroupReason.CHECKPOINT:
            self._checkpoint()
