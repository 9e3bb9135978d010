"""What every antdt training job does around a script's loop, whatever its mode.

A job in any mode (synchronous DD, :class:`~antdt.worker.elastic.job.ElasticJob`;
partial reduce, :class:`~antdt.worker.preduce.job.PartialReduceJob`) is one
rank's part of a job started by torchrun, with the same loop shape
(``with Job(...) as job: for inputs, labels in job.batches(): ...``) and the
same duties, kept here once:

* the **dataset** it trains, defined once for the job (:class:`DatasetSpec`:
  a group restarted with another world size asks for the same one);
* the **agent**, the job's own unless the caller passes one in;
* **agreed checkpoints**: rank 0 decides whether one of this job exists and
  tells the others; a first start defines the dataset at the sharder and
  saves a first checkpoint, a restart loads it on every rank, rewinds the
  shard state to its version before any rank reads and gives every rank
  rank 0's parameters; each save holds the model, the optimizer, the ledger,
  the shard-state version and the mode's own figures;
* the **ledger** written by rank 0 at the end, and logged;
* a **broken group** (a peer died, a bounded wait ran out) ends the process
  with exit 77 for torchrun to restart the group.

A mode adds its step (how replicas agree), its data feed and its extra
checkpoint figures (:meth:`_checkpoint_extra`, :meth:`_resume_extra`).
"""

from __future__ import annotations

import gc
import logging
import math
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn, Self, TypeVar

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from antdt.errors import AntdtError
from antdt.schemas.models import DatasetSpec
from antdt.worker.agent import Agent
from antdt.worker.checkpoint import load_checkpoint, save_checkpoint
from antdt.worker.ddp import (
    CollectiveTimeout,
    StepSizedTimeout,
    agreed_checkpoint_version,
    broadcast_int,
    broke_the_group,
    collect_cycles_before_exit,
    end_broken_group,
    world_size,
)
from antdt.worker.feeds import ShardFeed
from antdt.worker.ledger import SampleLedger
from antdt.worker.liveness import PeerLiveness
from antdt.worker.watchdog import StepWatch

log = logging.getLogger(__name__)
T = TypeVar("T")
#: How long rank 0 waits for the sharder's checkpoint version (a busy sharder answers late; every
#: rank waits).
VERSION_WAIT_S = 30.0
#: A default shard is about 1/64 of the dataset, between 4 and 64 batches: enough shards for the
#: sharder to balance an epoch's end, each lasting well past the sharder's answer (docs/torchrun.md,
#: "Where the time goes"). Never the world size: the job's dataset is defined once, and a group
#: restarted with another world must ask for the same one.
SHARDS_PER_EPOCH = 64
SHARD_BATCHES = (4, 64)
#: How long a wait on the other ranks outside the steps (set-up, a group of every rank) goes
#: before a rank that stopped beating ends it: the steps' own bound before any step is known.
UNSTEPPED_LIMIT_S = StepSizedTimeout.first_s


def default_shard_size(size: int, batch_size: int) -> int:
    """About ``size / SHARDS_PER_EPOCH`` samples, clamped to ``SHARD_BATCHES`` batches."""
    low, high = (batches * batch_size for batches in SHARD_BATCHES)
    return max(low, min(high, size // SHARDS_PER_EPOCH))


def require_module_itself(model: torch.nn.Module, mode: str) -> None:
    """A mode whose ranks do not all-reduce every step's gradient takes the module itself; ``mode``
    says what it does instead (one clear error for a ``DistributedDataParallel``)."""
    if isinstance(model, DistributedDataParallel):
        raise AntdtError(
            f"{mode}: pass the module itself, not DistributedDataParallel (which would all-reduce "
            "every step's gradient)"
        )


def freeze_for_training() -> None:
    """Take the heap built before training (torch, the model, a framework, antdt's clients: it
    lives as long as the job) out of the cyclic collector's full passes (``gc.freeze``; freed as
    usual when its last reference goes). A full pass walks every tracked object with the
    interpreter held: 110-160 ms a pass in a rank of the user-style job, and in synchronous
    training one rank's pause holds every rank's step. The job's close thaws it, and so does the
    collection at exit, should a process end without closing its job (the DDP model's cycles
    must be collected while gloo's threads can still finish: :func:`collect_cycles_before_exit`).
    No ``gc.collect()`` first (itself a full pass in the set-up): garbage cycles made since the
    last full pass wait for the thaw (the first full pass after it collected 0-184 objects in
    the user-style job's ranks, ``bench/gc_probe``)."""
    collect_cycles_before_exit()
    gc.freeze()


def _rank() -> int:
    """The process group's rank; without one (a mode that needs no group), torchrun's ``RANK``."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


class TrainingJob:
    """One rank's part of a job (module docstring): a mode subclasses it. Use as a context
    manager."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset,
        *,
        batch_size: int,
        checkpoint: str | Path | None,
        epochs: int = 1,
        shard_size: int | None = None,
        seed: int = 0,
        checkpoint_every_s: float | None = None,
        name: str = "dataset",
        ledger_dir: str | Path | None = None,
        agent: Agent | None = None,
    ):
        """``model``: the module whose parameters are checkpointed; ``batch_size``: each rank's at
        the first start; ``checkpoint``: where rank 0 saves (every rank must be able to read it;
        None for a mode whose servers keep the checkpoints); ``ledger_dir``: where rank 0 writes
        the ledger at the end (default: beside the checkpoint)."""
        if batch_size < 1:
            raise AntdtError(f"batch_size must be >= 1, got {batch_size}")
        self.rank = _rank()
        self.world = world_size()
        self.model, self.optimizer, self.dataset = model, optimizer, dataset
        self.checkpoint_path = Path(checkpoint) if checkpoint is not None else None
        self.ledger_dir = Path(ledger_dir) if ledger_dir is not None else None
        if self.ledger_dir is None and self.checkpoint_path is not None:
            self.ledger_dir = self.checkpoint_path.parent
        self.spec = DatasetSpec(
            name=name,
            size=len(dataset),
            shard_size=shard_size or default_shard_size(len(dataset), batch_size),
            epochs=epochs,
            shuffle_seed=seed,
            max_attempts=3,
            lease_s=30.0,
        )
        self._own_agent = agent is None
        self.agent = agent if agent is not None else Agent(batch_size=batch_size)
        self.checkpoint_every_s = checkpoint_every_s or self.agent.settings.checkpoint_every_s
        self.ledger = SampleLedger(self.spec.size, epochs)
        self.data = None
        self.feed: ShardFeed | None = None  # the mode's reader of ``data``, once started
        #: the ranks' heartbeats, for a mode whose waits on its peers need them (set by its start)
        self.peers: PeerLiveness | None = None
        #: the bound on this rank's waits for the others (:meth:`_watch_peers`; None: one process)
        self.watch: StepWatch | None = None
        self.finished = False
        self.samples = 0  # this rank's samples trained
        self.restored_step: int | None = None  # the checkpoint's step when this process resumed one
        self._checkpoint_at = 0.0  # when the next checkpoint falls due (time.monotonic)
        #: A version known to cover every commit without asking the sharder: a new job's, from the
        #: answer to its first request (before any commit), for the first checkpoint; then None.
        self._version_known: int | None = None

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        """The agent entered (if the job's own), the data opened, then the mode's start; anything
        that fails on the way closes what was opened."""
        if self._own_agent:
            self.agent.__enter__()
        try:
            self.data = self.agent.shards(self.dataset, self.spec)
            self._start()
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        freeze_for_training()
        return self

    def _start(self) -> None:
        """The mode's set-up: restore or start (:meth:`_restore_or_start`), its feed, its parts."""
        raise NotImplementedError

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc is not None and broke_the_group(exc):
            self._end_broken(exc)  # a peer died under this rank's backward(), say
        self._close_mode()
        if self.peers is not None:
            self.peers.close()
        if self.feed is not None:
            self.feed.close()  # closes the dataset too
        elif self.data is not None:
            self.data.close()
        if self._own_agent:
            self.agent.__exit__(exc_type, exc, traceback)
        gc.unfreeze()  # the DDP model's cycles collectable again (collect_cycles_before_exit)

    def _watch_peers(self, limit_s: Callable[[], float] = lambda: UNSTEPPED_LIMIT_S) -> None:
        """The ranks' heartbeats and the watch on this rank's waits for the others, before the
        set-up's first collective: a rank that stops there (SIGSTOP, a wedged interpreter) ends
        its peers' wait past ``limit_s`` rather than the process group's timeout (30 minutes)."""
        self.peers = PeerLiveness.of_default_group()
        if self.peers is not None:
            self.watch = StepWatch(self.peers, limit_s, self._end_hung)
        elif self.world > 1:
            log.warning(
                "no store of the process group to beat in: waits on the other ranks are bounded "
                "by the process group's timeout alone"
            )

    @contextmanager
    def watched(self, what: str, cap_s: float | None = None) -> Iterator[None]:
        """Waits on the other ranks in here, outside antdt's steps (the set-up, a framework's own
        collective between steps), bounded as a step's (:mod:`~antdt.worker.watchdog`): a rank
        that stopped beating ends them past the limit, a live one is waited for up to ``cap_s``
        (the watch's 300 s; ``math.inf`` for the set-up, whose checkpoint load may be long).
        Inside a watched step or section, that one's wait goes on (a framework's checkpoint in
        the set-up, say). With one process, or no store to beat in, nothing is watched."""
        began = self.watch is not None and self.watch.waiting(what, cap_s)
        try:
            yield
        finally:
            if began:
                self.watch.done()

    def _set_up(self, run: Callable[[], T]) -> T:
        """A collective of the set-up, which holds every rank alike: watched, with no cap on
        live ranks (a large checkpoint's load), a broken group ending the process."""
        with self.agent.sync_wait(), self.watched("set-up", cap_s=math.inf):
            return self._collective(run)

    def _end_hung(self, reason: str) -> None:
        """The watchdog's verdict (on its thread): a peer stopped, or the wait outlived its cap."""
        self._end_broken(CollectiveTimeout(reason))

    def _close_mode(self) -> None:
        """Close what the mode opened beside the data (its group client); the peers' heartbeats
        are closed after it, here."""

    # ------------------------------------------------------------ checkpoints

    def _restore_or_start(self) -> None:
        """The last checkpoint of this job, shards rewound to it before any rank reads; else a first
        one.

        Rank 0 decides and tells the others, so the ranks never part ways
        over a file that changes under them.
        """
        info = self._own_checkpoint() if self.rank == 0 else None
        if not broadcast_int(int(info is not None)):
            self._start_new()
        else:
            self._resume(info or self._own_checkpoint(required=True))
        self._same_replicas()

    def _start_new(self) -> None:
        """A new job's set-up: its dataset defined at the sharder (the first request, whose
        answer's log position is a version no rank has committed past), then the first
        checkpoint at that version: rewound to on a restart before the next one, it gives back
        every shard (docs/sharding.md), with no round trip to ask for a version (18-30 ms of
        every job's set-up on the embedded broker)."""
        self._version_known = self.data.prepare()
        self._checkpoint()

    def _own_checkpoint(self, required: bool = False):
        """This job's checkpoint, loaded into the model and optimizer; None if there is none (or
        another job's)."""
        job = self.agent.spec.job_id

        def ours(info) -> bool:
            owner = info.extra.get("job_id")
            if owner != job:
                log.warning(
                    "not resuming %s: it is job %r's, this is %r", self.checkpoint_path, owner, job
                )
            return owner == job

        info = None
        if self.checkpoint_path.exists() or required:
            info = load_checkpoint(
                self.checkpoint_path, self.model, self.optimizer, map_location="cpu", only_if=ours
            )
        if info is None and required:
            raise AntdtError(
                f"{self.checkpoint_path} changed while the ranks read it: rank 0 resumed job "
                f"{job!r} from it, rank {self.rank} found another job's (two jobs share the path?)"
            )
        return info

    def _resume(self, info) -> None:
        self.ledger.load_state_dict({"counts": info.extra["ledger"]})
        self._resume_extra(info.extra)
        self.agent.step_count = info.step
        self.restored_step = info.step
        if self.rank == 0:
            self.data.rewind(info.shard_version)
        if self.world > 1:
            dist.barrier()  # nobody reads data before the rewind
        log.info(
            "resumed %s at step %d with batch %d",
            self.checkpoint_path,
            info.step,
            self.agent.batch_size,
        )

    def _resume_extra(self, extra: dict) -> None:
        """The mode's own figures from a checkpoint (batch sizes, say)."""

    def _checkpoint_extra(self) -> dict:
        """The mode's own figures for a checkpoint; runs on every rank (it may be collective)."""
        return {}

    def _checkpoint(self) -> None:
        """Every rank's commits so far covered by one version; rank 0 saves it with the model, the
        ledger and the mode's figures (every rank calls this at the same point)."""
        version, extra = self._agreed_state()
        if self.rank == 0:
            save_checkpoint(
                self.checkpoint_path,
                self.model,
                self.optimizer,
                version,
                self.agent.step_count,
                extra,
            )
        self._checkpoint_at = time.monotonic() + self.checkpoint_every_s

    def _agreed_state(self) -> tuple[int, dict]:
        """The shard-state version covering every rank's commits so far, and what a checkpoint
        holds beside the model: the ledger, the job, the world, the mode's figures (a
        collective)."""
        extra = self._checkpoint_extra()
        version, self._version_known = self._version_known, None
        if version is not None:
            version = broadcast_int(version)  # rank 0's: the same on every rank
        else:
            client = self.agent.shard_client
            version = agreed_checkpoint_version(
                lambda: (self.agent.commit_trained(), client.flush()),
                lambda: client.checkpoint(
                    self.data.epoch, self.agent.step_count, timeout_s=VERSION_WAIT_S
                ),
            )
        return version, {
            "ledger": self.ledger.counts.clone(),
            "job_id": self.agent.spec.job_id,
            "world": self.world,
            **extra,
        }

    def _same_replicas(self) -> None:
        """Rank 0's parameters and buffers everywhere, as DDP's constructor does (a restore loads
        them alike)."""
        if self.world == 1:
            return
        with torch.no_grad():
            for tensor in [*self.model.parameters(), *self.model.buffers()]:
                dist.broadcast(tensor.data, src=0)

    # ------------------------------------------------------------ the end

    def _write_ledger(self) -> None:
        """Rank 0 writes the ledger (every rank holds the summed counts by now) and says whether it
        is all ones."""
        if self.rank != 0:
            return
        self.ledger.write(self.ledger_dir)
        counts = self.ledger.counts
        wrong = int((counts != 1).sum())
        if wrong:
            log.error(
                "ledger: %d of %d sample-epochs not trained exactly once (%s)",
                wrong,
                counts.numel(),
                self.ledger_dir,
            )
        else:
            log.info(
                "ledger: all %d samples of %d epochs trained exactly once (%s)",
                counts.shape[1],
                counts.shape[0],
                self.ledger_dir,
            )

    def _collective(self, run: Callable[[], T]) -> T:
        """``run()``; a broken group ends the process for the launcher to restart the group (exit
        77)."""
        try:
            return run()
        except Exception as exc:
            if not broke_the_group(exc):
                raise
            self._end_broken(exc)

    def _end_broken(self, exc: BaseException) -> NoReturn:
        end_broken_group(f"{self.agent.spec.worker_id} (rank {self.rank})", exc)
