"""Synchronous data-parallel training under torchrun with antdt: what a DDP script swaps in.

A plain DDP script splits its dataset statically (``DistributedSampler``)
and averages equal batches (``DistributedDataParallel``). An
:class:`ElasticJob` keeps the script's loop and the process group torchrun
set up (gloo or NCCL), and instead

* reads **dynamic shards** from the sharder through a feed that never
  blocks a step (:class:`~antdt.worker.feeds.ShardFeed`): a rank out of
  data joins the others' steps with nothing until every rank is out, and
  while one is (the step's sums count them), the others give back the
  shards they have not begun, so it trains them instead of waiting while
  their holder does, and every rank pools what is left of the begun ones
  and takes a share by batch size (:mod:`~antdt.worker.elastic.pooling`),
  so no rank trains an epoch's tail alone; a batch that opens the next epoch is announced before
  it is trained, and the ranks without one then wait briefly for their own
  first shards of it, so no rank trains an epoch's first step alone;
* sizes each rank's batch by AntDT-DD, by default as the **DD controller**
  says: the changed ranks switch together at the command's effective step,
  later only if a command is late (agreed in-band,
  :mod:`~antdt.worker.elastic.resize`). Or, with
  ``sizing=BatchSizing.IN_BAND``, in-band: each step's samples and compute
  time so far ride in its first gradient bucket's all-reduce and every rank
  runs the same sizing on the same figures (:class:`~antdt.sizing.inband.InBandSizer`),
  so a new split takes effect at the very next step, with no round trip: the
  batch taken for it, not read yet, is cut to its new size, and that step's
  sizes are summed once more before its backward pass (a split that gains
  less than :data:`CUT_AT_ONCE_S` waits a step instead). It has no calibration
  step yet, and on short steps whose fixed costs it has not learnt it gives a
  slowed rank too little (docs/torchrun.md). Either way the global batch never moves. A rank's
  compute is its step's time less its waits for data and for the others
  (DDP's buffer broadcast before the forward pass among them:
  :mod:`~antdt.worker.booked_waits`); a step without samples here is all
  waiting;
* **averages gradients weighted by batch size** inside DDP's own bucketed
  all-reduce (a communication hook, :class:`~antdt.worker.ddp_hook.WeightedReduce`),
  so the all-reduce still overlaps the backward pass; each rank takes its
  batches one step ahead and announces the next one's size, with the loop's
  control numbers, in the first bucket's all-reduce: no collective of
  antdt's own per step. It reads that next batch while the last bucket is
  all-reduced, where the backward pass would only wait (a new in-band
  split that cuts it drops that read). Each rank counts its trained samples in the sample
  ledger, and the ranks sum their counts whenever it is saved, so the saved
  ledger is exactly what the saved model contains;
* **never hangs**: past a bound sized by the job's recent steps
  (:class:`~antdt.worker.ddp.StepSizedTimeout`) a rank waits on only while
  every rank still beats (:mod:`~antdt.worker.liveness`,
  :mod:`~antdt.worker.watchdog`, which also bounds DDP's waits inside
  ``backward()``): a rank that is slow is not a dead one. A broken group ends
  the process (exit 77) and torchrun restarts the group (``--max-restarts``);
* **checkpoints** model, optimizer, ledger, batch sizes and the shard-state
  version together about every ``checkpoint_every_s`` (rank 0 decides,
  in-band), and on a restart restores them and rewinds the shards before
  any rank reads data: what the lost generation trained is trained again,
  nothing else. After an elastic re-rendezvous with another world size the
  global batch is split evenly until the controller resizes it.

Use (see ``examples/``): the loop of a plain DDP script, the batches from the job::

    ddp = DistributedDataParallel(model)
    with ElasticJob(ddp, optimizer, dataset, batch_size=32, checkpoint="ckpt.pt") as job:
        for inputs, labels in job.batches():
            loss = loss_fn(ddp(inputs), labels)   # the mean over this rank's batch
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

Samples are ``(input, target)`` tensor pairs (any others with a
``collate``). Each step's one backward pass goes through the DDP model (not
``no_sync()``: gradient accumulation is not supported). Model buffers
(BatchNorm statistics) follow DDP's own rules.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from antdt.errors import AntdtError
from antdt.schemas.models import AckStatus, CommandAction, MitigationCommand
from antdt.sizing import BatchSizing
from antdt.sizing.inband import InBandSizer
from antdt.worker.booked_waits import book_as_sync_wait
from antdt.worker.dataset import shards_holding
from antdt.worker.ddp import (
    StepSizedTimeout,
    collective_device,
    gather_objects,
    world_size,
)
from antdt.worker.ddp_hook import WeightedReduce
from antdt.worker.elastic.pooling import Offer, share_of
from antdt.worker.elastic.resize import AgreedResize
from antdt.worker.feeds import Reserved, ShardFeed, stack_pairs
from antdt.worker.ledger import SyncedLedger
from antdt.worker.provenance import Tagged
from antdt.worker.training_job import TrainingJob

#: Shards a rank holds at least: the one it reads and the next, granted while it reads the first,
#: so a shard boundary never waits for the sharder's answer (with one, every boundary was a round
#: trip on the step's critical path: 13-15 s against 10.8 s for the user-style job,
#: bench/user_job.py). Shards smaller than the feed's two batches need more (:func:`shards_held`).
SHARDS_HELD = 2
#: How long a rank's trained samples may wait for their commit: a failure rewinds the job to its
#: checkpoint anyway, a checkpoint sends them first, and a rank out of data sends them at once
#: (:meth:`ElasticJob._out_of_data`), so only the sharder's view of progress waits. At 0.1 s a job
#: of 100 ms steps committed every step, and every commit costs the services on each of its
#: samples (decoded, checked, logged again) and the broker on each record (docs/torchrun.md, "The
#: services' work per commit").
COMMIT_EVERY_S = 1.0
#: A new in-band split applies to the batch already taken for the next step when it shortens the
#: modelled step by at least this much: well over what it costs, one small all-reduce (two gloo
#: ranks on 2 cores: 0.23 ms median, 2.5 ms p99). Smaller gains, the noise of short steps, wait
#: for the batch after, with no collective: on the 2.8 ms steps of the user-style job, cutting on
#: every move made in-band sizing 9-17 % slower.
CUT_AT_ONCE_S = 0.002
#: How long a rank without a next batch waits for its first shards once another rank's next batch
#: has opened an epoch: about a round trip to the sharder is enough (two on the embedded broker,
#: whose fetches wait 25 ms); past it the rank joins the next step with what it has.
OPENED_WAIT_S = 0.25


def shards_held(batch_size: int, shard_size: int) -> int:
    """Shards a rank holds for batches of ``batch_size``: what the feed buffers (two batches) and
    one more being granted, at least :data:`SHARDS_HELD`; fewer would put a sharder round trip on
    every step."""
    return max(SHARDS_HELD, shards_holding(2 * batch_size, shard_size) + 1)


def _size(reserved: Reserved | None) -> int:
    """Samples in a taken batch (None: none)."""
    return 0 if reserved is None else reserved.size


def _epoch(reserved: Reserved | None) -> int:
    """The latest epoch a taken batch's samples belong to (-1: none)."""
    return max((grant.epoch for grant, _ in reserved.chosen), default=-1) if reserved else -1


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` in ``parts`` sizes differing by at most one, the larger ones first."""
    return [total // parts + (1 if part < total % parts else 0) for part in range(parts)]


class ElasticJob(TrainingJob):
    """One rank's part of a synchronous job under torchrun (module docstring). Use as a context
    manager."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset,
        *,
        batch_size: int,
        checkpoint: str | Path,
        sizing: BatchSizing = BatchSizing.COMMANDS,
        collate: Callable[[list], Any] = stack_pairs,
        **options,
    ):
        """``model``: the ``DistributedDataParallel`` the loop trains (the module itself with one
        process); ``batch_size``: each rank's at the first start (the global batch is
        ``batch_size`` x the world); ``checkpoint`` and the ``options`` (epochs, shard size,
        seed, checkpoint interval, dataset name, ledger folder, agent) as
        :class:`~antdt.worker.training_job.TrainingJob` takes them.

        ``sizing``: who sizes the batches (module docstring); with ``IN_BAND`` the
        controller's commands are acknowledged IGNORED (set its ``batch_sizing`` to
        ``in-band`` and it sends none). ``collate``: a list of samples to a batch (a
        ``DataLoader``'s ``collate_fn``; by default ``(input, target)`` pairs stacked).
        """
        ddp = model if isinstance(model, DistributedDataParallel) else None
        if world_size() > 1 and ddp is None:
            raise AntdtError(
                "ElasticJob needs the model wrapped in DistributedDataParallel with more than one "
                "rank (it weights DDP's all-reduce by batch size): "
                "ElasticJob(DistributedDataParallel(model), ...); with Accelerate on CPUs, "
                "Accelerator(cpu=True) (without it each rank trains alone)"
            )
        super().__init__(
            ddp.module if ddp is not None else model,
            optimizer,
            dataset,
            batch_size=batch_size,
            checkpoint=checkpoint,
            **options,
        )
        self.ddp = ddp
        self.global_batch = batch_size * self.world
        self.sizing = BatchSizing(sizing)
        self.collate = collate
        self.sizes = [batch_size] * self.world  # every rank's, as last known (set by a restore)
        self.sizer: InBandSizer | None = None
        self.timeout = StepSizedTimeout()
        self.reduce: WeightedReduce | None = None
        self.counts = SyncedLedger(self.ledger, collective_device())
        # batches taken, oldest first, not yet begun: the next step's first (None: none)
        self._ahead: deque[Any] = deque([None])
        self.step_samples = 0  # every rank's samples in the last finished step
        self._pending = 0  # samples in the batch handed out, not yet stepped
        self._dry = False  # no rank had a next batch at the last step (the sums)
        self._epoch_begun: int | None = None  # the epoch of the last batch this rank began
        self._recount = False  # the next step's batches were resized after they were announced
        self._local_sums: list[int] = []  # this step's sums with one process
        self._resize = AgreedResize()
        self._offers = [0, 0, 0]  # this step's summed resize offers
        self.pooled = 0  # samples this rank took from the ranks' pooled epoch tails
        self._loop_thread: int | None = None  # the thread the loop runs on (reads ahead there)
        self._read_ahead_s = 0.0  # this step's read ahead, inside its last all-reduce
        self.agent.handle(CommandAction.ADJUST_BATCH_SIZE, self._on_resize)

    # ------------------------------------------------------------ lifecycle

    def _start(self) -> None:
        self.data.quota = shards_held(self.agent.batch_size, self.spec.shard_size)
        self.agent.commit_every_s = COMMIT_EVERY_S
        self._watch_peers(self.timeout.limit_s)
        self._set_up(self._restore_or_start)  # every rank alike: not the first step's compute
        if self.ddp is not None:
            self.reduce = WeightedReduce(self.ddp)
            # rooted at rank 0 and waiting for the slowest rank: not rank 0's compute
            book_as_sync_wait(self.ddp, "_sync_buffers", self.agent, self.reduce.device)
        if self.sizing is BatchSizing.IN_BAND and self.world > 1:
            # never below one sample: a rank sized to 0 would hand its shards back
            self.sizer = InBandSizer(self.world, self.rank, self.sizes, low=1)
        if self.reduce is not None:
            self._loop_thread = threading.get_ident()
            self.reduce.while_reducing = self._read_ahead
        self.feed = ShardFeed(self.data, lambda: 2 * self.agent.batch_size, self.collate).start()
        self._set_batch_size(self.agent.batch_size)  # as restored: the shards held for it
        self._ahead = deque([self._take()])
        if self.reduce is not None:
            self._set_up(lambda: self.reduce.prime(_size(self._next)))

    # ------------------------------------------------------------ the loop

    def batches(self) -> Iterator[tuple[Any, Any]]:
        """This rank's batches, until every rank is out of data: one forward, backward (through
        the DDP model) and optimizer step each.

        Where this rank has nothing while others still train, it joins their
        steps here (the averaged gradient, the optimizer step) without
        yielding. Commands apply between steps; RESTART and EVICT end the
        process from here.
        """
        while not self.finished:
            batch = self._advance()
            if batch is None:
                self._idle_step()
            else:
                yield batch
            self._end_step()

    @property
    def _next(self):
        """The batch taken for the next step (None: none)."""
        return self._ahead[0]

    def _advance(self):
        """Begin the next step: its batch (its samples this step's, None: none), the one after
        taken if a loader has not taken it already, the step's sums started."""
        reserved = self._ahead.popleft()
        if not self._ahead:
            self._ahead.append(self._take())
        self._begin_step(reserved)
        return None if reserved is None else self.agent.untag(self._read(reserved))

    def _take(self) -> Reserved | None:
        """The next step's batch, taken a step ahead (chosen, read when handed out): its size is
        announced in this step's sums."""
        with self.agent.data_wait():
            return self.feed.reserve(self.agent.batch_size)

    def _read(self, reserved: Reserved) -> Tagged:
        with self.agent.data_wait():
            return self.feed.read(reserved)

    def _read_ahead(self) -> None:
        """Read the next step's batch while this step's last bucket is all-reduced (the hook calls
        this once that all-reduce is on its way), time the backward pass otherwise spends
        waiting, so the next step does not begin with its read (docs/torchrun.md). Only on the
        loop's own thread: a GPU's backward runs the hook on autograd's device thread, and the
        user's dataset is read where the loop reads it. A read that fails is left to the loop,
        which reads again and raises there. Its time is booked as data wait, not as the wait for
        the others that the rest of the all-reduce is (:meth:`_book_sync`)."""
        taken = self._next
        if taken is None or taken.batch is not None or threading.get_ident() != self._loop_thread:
            return
        began = time.perf_counter()
        try:
            with self.agent.data_wait():
                self.feed.read(taken)
        except Exception:  # noqa: BLE001 - the user's dataset's error, raised where the loop reads
            pass
        self._read_ahead_s = time.perf_counter() - began

    def _drop_read_ahead(self) -> None:
        """Forget the next step's batch as read ahead, so it can be given back, pooled or resized
        as a batch not read: it has not been handed out, and reading it again costs only time (a
        batch a framework's loader has taken is kept: :meth:`_next_open`)."""
        if self._next is not None and self._next_open():
            self._next.batch = None

    def _begin_step(self, batch) -> None:
        """The step's sums: the next batch, data left, checkpoint due, ranks out of data for now,
        resize offers."""
        self._pending = _size(batch)
        if batch is not None:
            self._epoch_begun = _epoch(batch)
        due = int(self.rank == 0 and time.monotonic() >= self._checkpoint_at)
        with_data = int(self._next is not None or not self.feed.exhausted)
        # no next batch, and the sharder has none for it while others hold the epoch's last shards
        starving = int(self._next is None and self.data.waiting)
        # the sharder has opened an epoch for every rank
        opened = int(self._opens_an_epoch(self._next))
        # what this rank could share if another runs out of data (pooling)
        held = self.feed.buffered + _size(self._next) if self.world > 1 else 0
        counters = [
            with_data,
            due,
            starving,
            opened,
            held,
            *self._resize.offer(self.agent.batch_size),
        ]
        if self.watch is not None:
            self.watch.waiting(f"step {self.agent.step_count}")
        if self.reduce is None:
            self._local_sums = [_size(self._next), *counters]
            return
        self.reduce.begin(_size(self._next), counters, self._timing)
        if self._recount:
            self._recount = False
            with self.agent.sync_wait():
                self._collective(lambda: self.reduce.recount(self._pending))

    def _timing(self) -> list[int]:
        """In-band sizing's figures of this very step, sent with the first bucket: its samples and
        its compute so far (the forward pass and the backward's start). The split they give
        applies from the next step (:meth:`_resize_in_band`)."""
        if self.sizer is None:
            return []
        return self.sizer.encode(self._pending, self.agent.compute_so_far())

    def _sums(self) -> list[int]:
        return self._local_sums if self.reduce is None else self._collective(self.reduce.sums)

    def _idle_step(self) -> None:
        """Join a step with no samples here: the others' averaged gradient still updates this
        replica. All of it is waiting for the others (booked at the step's end)."""
        if self.reduce is None or not self.reduce.total:
            return  # no rank has samples: no rank runs a backward pass
        self.optimizer.zero_grad(set_to_none=True)
        self._collective(self.reduce.idle_step)
        self.optimizer.step()

    def _end_step(self) -> None:
        sums = self._sums()
        self.step_samples = self.reduce.total if self.reduce is not None else self._pending
        with_data, checkpoint_due, starving, opened, held, *rest = sums[1:]
        self._offers, timings = rest[:3], rest[3:]
        self.counts.count(self.agent.pending_tags)  # in every replica now
        self.samples += self._pending
        self._book_sync()
        self.timeout.completed(time.monotonic())
        # commits the samples: their update is in the model
        self.agent.step(samples=self._pending)
        if self._next is None:
            self._out_of_data(everyone_dry=not sums[0] and not self._dry)
        if opened:
            self._take_the_opened_epoch()
        elif starving:
            self._drop_read_ahead()  # the next batch may be given back or pooled
            self._share_the_last_shards()
            if self.reduce is not None and held > self.global_batch // self.world:
                self._pool_the_tail()
        self._dry = not sums[0]
        if self.sizer is not None:
            self._resize_in_band(timings)
        else:
            self._switch_if_agreed()
        if with_data and checkpoint_due:
            # every rank waits for it alike: not one rank's slow compute
            with self.agent.sync_wait():
                self._collective(self._checkpoint)
            # a checkpoint does not lengthen the step bound
            self.timeout.not_a_step(time.monotonic())
        if self.watch is not None:
            self.watch.done()  # the checkpoint's collectives were watched with the step's
        if not with_data:
            self.finished = True
            self._finish()

    def _share_the_last_shards(self) -> None:
        """A rank is out of data while others hold an epoch's last shards: the others give back
        the shards they have not begun (and those only the next batch has begun), so it trains
        them instead of waiting while their holders do; a rank without a next batch takes what
        has reached it since. Sizes announced in this step's sums change, so the next step's
        are summed again (every rank: the sums said so on every rank)."""
        if self._next is not None:
            # (its samples only if a loader has not read it)
            self.feed.give_back_unbegun(self._next)
        elif self._next_open():
            self._ahead[0] = self._late_take()
        self._recount = self.reduce is not None

    def _pool_the_tail(self) -> None:
        """A rank is out of data while others still hold more than a batch of begun shards: every
        rank pools what it has left (the next batch too, unless a loader has taken it) and takes
        a share in proportion to its batch size (:mod:`~antdt.worker.elastic.pooling`), so the
        tail ends on every rank at about the same step. A collective, on every rank alike (the
        sums said so on every rank); the next step's sizes are summed again."""
        if self._next_open() and self._next is not None:
            self.feed.put_back(self._next)
            self._ahead[0] = None
        offer = Offer(self.agent.batch_size, tuple(self.feed.pool_out()))
        reduce = self.reduce
        offers = self._collective(lambda: gather_objects(offer, reduce.group, reduce.device))
        self.pooled += self.feed.take_pooled(share_of(offers, self.rank))
        if self._next_open() and self._next is None:
            self._ahead[0] = self.feed.reserve(self.agent.batch_size, wait=False)
        self._recount = True

    def _late_take(self) -> Reserved | None:
        """What reached this rank since the step's start, unless it opens an epoch: a batch that
        does is announced in a step's sums before it is trained, so the others wait for their
        first shards of it too (:meth:`_take_the_opened_epoch`) instead of idling while the
        first granted trains."""
        taken = self.feed.reserve(self.agent.batch_size, wait=False)
        if self._opens_an_epoch(taken):
            self.feed.put_back(taken)
            return None
        return taken

    def _opens_an_epoch(self, reserved: Reserved | None) -> bool:
        """Whether a taken batch belongs to a later epoch than the last batch this rank began
        (never before its first)."""
        return self._epoch_begun is not None and _epoch(reserved) > self._epoch_begun

    def _take_the_opened_epoch(self) -> None:
        """A rank's next batch opens an epoch, so the sharder has opened it for every rank: a rank
        without a next batch asks for its shards at once and takes what arrives within
        :data:`OPENED_WAIT_S`, so the first granted does not train a step alone while the
        others' requests are on their way. Every rank sums the next step's sizes again."""
        if self._next is None and self._next_open():
            self.data.ask_again()
            with self.agent.data_wait():
                self._ahead[0] = self.feed.reserve_arriving(self.agent.batch_size, OPENED_WAIT_S)
        self._recount = self.reduce is not None

    def _next_open(self) -> bool:
        """Whether the next step's batch may still change: no loader has taken it."""
        return True

    def _out_of_data(self, everyone_dry: bool) -> None:
        """This rank has no next batch: the sharder can end the epoch (or grant the rest) only once
        it has every rank's last commits, so this rank's go now, not at the next commit tick, and
        it asks the sharder again at once after sending them, or once no rank has a next batch
        (every rank has sent its own)."""
        if self._pending:
            self.agent.commit_trained()
        if self._pending or everyone_dry:
            self.data.ask_again()

    def _book_sync(self) -> None:
        """A trained step waited for the others in the control sums and from its backward's last
        bucket on, less the next batch's read there (data wait); a step without samples here
        waited all along."""
        reduce = self.reduce
        if not self._pending:
            self.agent.waited_whole_step()
        elif reduce is not None and reduce.backward_done_at is not None:
            waited = time.perf_counter() - reduce.backward_done_at - self._read_ahead_s
            self.agent.book_sync_wait(max(0.0, waited))
        self._read_ahead_s = 0.0

    # ------------------------------------------------------------ batch sizes

    def _on_resize(self, command: MitigationCommand) -> None:
        if self.sizing is BatchSizing.IN_BAND:
            self.agent.acknowledge(
                command,
                AckStatus.IGNORED,
                "this job sizes its batches in-band (ElasticJob sizing); set the controller's "
                "batch_sizing to in-band",
            )
            return
        superseded = self._resize.receive(command)
        if superseded is not None:
            self.agent.acknowledge(
                superseded, AckStatus.IGNORED, "superseded by a later batch size"
            )

    def _set_batch_size(self, size: int) -> None:
        """This rank's batch from the next one taken, and the shards it holds for it."""
        self.agent.batch_size = size
        self.feed.quota = shards_held(size, self.spec.shard_size)

    def _resize_in_band(self, timings: list[int]) -> None:
        """Every rank's split from this step's figures, from the very next step on where it
        gains :data:`CUT_AT_ONCE_S`: the batch taken for it, not read yet, is cut to the new
        size here (a framework's loader may have read it already: it keeps its size). Its size
        announced in this step's sums is then stale, so the next step's sizes are summed again
        before its backward pass, on every rank alike. A smaller gain applies from the batch
        after."""
        size = self.sizer.decide(timings)
        self._set_batch_size(size)
        # the same figures on every rank: every rank decides alike whether to recount
        if self.sizer.saving_s < CUT_AT_ONCE_S:
            return
        self._recount = True
        taken = self._next
        if taken is not None and taken.size != size:
            self._drop_read_ahead()  # cut as a batch not read
            if taken.batch is None:
                self.feed.resize(taken, size)

    def _switch_if_agreed(self) -> None:
        """Apply the pending batch size from the next batch taken once every changed rank holds
        its command (the batch of the step after next: the next one is taken)."""
        step = self.agent.step_count + 1
        command = self._resize.agreed(self._offers, step, self.global_batch)
        if command is None:
            return
        self._set_batch_size(command.batch_size)
        self.global_batch = self._offers[1]
        late = step - (command.effective_step or step)
        self.agent.acknowledge(
            command,
            AckStatus.APPLIED,
            f"late by {late} steps: waited for every changed rank's command" if late else None,
            step,
        )

    # ------------------------------------------------------------ checkpoints

    def _resume_extra(self, extra: dict) -> None:
        self.global_batch = int(extra["global_batch"])
        sizes = list(extra["batch_sizes"])
        # a re-rendezvous with another world size: keep the global batch
        if len(sizes) != self.world:
            sizes = split_evenly(self.global_batch, self.world)
        self.sizes = sizes
        self.agent.batch_size = sizes[self.rank]

    def _checkpoint_extra(self) -> dict:
        """Every rank's counts summed into the ledger, and every rank's batch size."""
        self.counts.sum()
        sizes = torch.zeros(self.world, dtype=torch.int64, device=collective_device())
        sizes[self.rank] = self.agent.batch_size
        if self.world > 1:
            dist.all_reduce(sizes)
        return {"batch_sizes": sizes.tolist(), "global_batch": self.global_batch}

    # ------------------------------------------------------------ the end

    def _finish(self) -> None:
        with self.watched("the end's ledger sum"):
            self._collective(self.counts.sum)
        self._write_ledger()
