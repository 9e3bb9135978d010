"""An :class:`~antdt.worker.elastic.job.ElasticJob` driven by a framework's training loop (PyTorch
Lightning's, Hugging Face's ``Trainer``) instead of a ``for`` loop of the script's own.

The synchronous job's step is kept whole: its batches from the sharder, the
batch sizes, the weighted all-reduce with the step's sums in its first
bucket, the ledger, the bounded waits. Only who calls it differs:

* the framework **takes batches** from :class:`DrivenLoader`, possibly a
  batch ahead of the step it trains (Lightning's fetcher does, to know an
  epoch's last), which is what the job does anyway: the batches the loader
  took wait, oldest first, in the job's queue, and each step begins with
  the oldest (:meth:`DrivenJob.loader_batch`, :meth:`DrivenJob.begin`). A
  batch's samples count for the step that trains it, never for the one
  during which the loader took it;
* a rank **without samples** while others train still runs the framework's
  step, on a placeholder batch: its weight in the all-reduce is 0, so the
  step's gradient is the others' (what ``ElasticJob`` does without a
  forward pass, which a framework's loop cannot skip);
* the job **ends** at the step whose sums say no rank has data, on every
  rank at once (:meth:`DrivenJob.end` says so; the framework stops there);
* **checkpoints** are the framework's own: each holds antdt's state (the
  shard-state version, the summed ledger and the batch sizes:
  :meth:`DrivenJob.state`, a collective), and a restart that restores one
  rewinds the shards to it. A first start saves one before training, so a
  group killed before its first checkpoint restarts from the beginning of
  the data, not from wherever the sharder had got to.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from antdt.errors import AntdtError
from antdt.worker.checkpoint import CheckpointInfo
from antdt.worker.ddp import broadcast_int
from antdt.worker.elastic.job import ElasticJob


class DrivenLoader:
    """The training batches a framework iterates: the job's, started at the first ``iter()`` (by
    then the framework has built its DDP model and restored its checkpoint). No length: the
    sharder decides when data runs out."""

    def __init__(self, start: Callable[[], DrivenJob]):
        self._start = start
        self.job: DrivenJob | None = None

    def __iter__(self) -> Iterator[Any]:
        if self.job is None:
            self.job = self._start()
        return self

    def __next__(self) -> Any:
        return self.job.loader_batch()


class DrivenJob(ElasticJob):
    """One rank's synchronous job under a framework's training loop (module docstring)."""

    def __init__(
        self,
        ddp,
        optimizer,
        dataset,
        *,
        batch_size: int,
        first_checkpoint: Path,
        save: Callable[[Path], None],
        restored: dict | None,
        leftover_job: Callable[[Path], str | None],
        **options,
    ):
        """``first_checkpoint``: where a first start saves; ``save``: the framework's save of a
        checkpoint there (it asks :meth:`state`); ``restored``: antdt's state from the checkpoint
        the framework restored (None: a first start); ``leftover_job``: the job id of a checkpoint
        found at ``first_checkpoint`` (None: none, or not antdt's)."""
        super().__init__(
            ddp, optimizer, dataset, batch_size=batch_size, checkpoint=first_checkpoint, **options
        )
        self._save = save
        self._restored = restored
        self._leftover_job = leftover_job
        self._placeholder = self.collate([dataset[0], dataset[min(1, len(dataset) - 1)]])
        self._handed = 0  # batches of the queue the loader has taken

    # ------------------------------------------------------------ the loader and the step

    def loader_batch(self) -> Any:
        """The loader's next batch: one taken ahead already, or a new one (two real samples when
        this rank has none: its weight is 0; two, so a BatchNorm layer in training mode takes
        it)."""
        if self.finished:
            raise StopIteration
        if self._handed == len(self._ahead):
            self._ahead.append(self._take())
        reserved = self._ahead[self._handed]
        self._handed += 1
        return self._placeholder if reserved is None else self._read(reserved).data

    def begin(self) -> None:
        """Begin the step of the loader's oldest batch (the one the framework trains now)."""
        if not self._handed:
            raise AntdtError("a step began with no batch from the antdt loader")
        self._handed -= 1
        self._advance()

    def end(self) -> bool:
        """End the step (after its optimizer step); whether the job is over."""
        self._end_step()
        return self.finished

    def _next_open(self) -> bool:
        """The framework's loader may have taken the next step's batch already (a placeholder
        included): then it stays as it is."""
        return self._handed == 0

    @property
    def nobody_trains(self) -> bool:
        """No rank has samples this step (each trains a placeholder): no optimizer step."""
        return self.reduce is not None and not self.reduce.total

    # ------------------------------------------------------------ checkpoints

    def _start(self) -> None:
        super()._start()
        self._checkpoint_at = math.inf  # the framework decides when

    def _restore_or_start(self) -> None:
        if self._restored is None:
            self._refuse_own_leftover()
            self._start_new()
        else:
            state = self._restored
            self._resume(CheckpointInfo(state["shard_version"], state["step"], state))
        self._same_replicas()

    def _refuse_own_leftover(self) -> None:
        """A first start of a job that has a checkpoint would train its samples again on a fresh
        model: refuse (rank 0 looks; every rank raises)."""
        path, job = self.checkpoint_path, self.agent.spec.job_id
        own = self.rank == 0 and path.exists() and self._leftover_job(path) == job
        if broadcast_int(int(own)):
            raise AntdtError(
                f"{path} is a checkpoint of job {job!r}: resume from it "
                "(the framework's resume option), or start a new job id"
            )

    def _checkpoint(self) -> None:
        """The first start's checkpoint, through the framework (which asks :meth:`state`)."""
        self._save(self.checkpoint_path)

    def state(self) -> dict:
        """antdt's state for a framework's checkpoint, the same on every rank (a collective: every
        rank saves at the same step)."""
        with self.watched("a checkpoint's agreement"):  # after the step's end: not in its watch
            version, extra = self._collective(self._agreed_state)
        return {"shard_version": version, "step": self.agent.step_count, **extra}

    def close(self, exc: BaseException | None = None) -> None:
        """Leave the job: the ledger written if the loop stopped before the data ran out (a step
        limit, say), the agent's last report, the shards handed back."""
        if exc is None and not self.finished:
            self._finish()
        self.__exit__(type(exc) if exc else None, exc, exc.__traceback__ if exc else None)
