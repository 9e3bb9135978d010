"""AntDT for PyTorch Lightning: one strategy, ``Trainer(strategy=AntdtStrategy())``.

Everything antdt changes in a Lightning run is a strategy's business in
Lightning's own design, so one object carries it and a script cannot add
half of it:

* **the gradient all-reduce**: this is Lightning's ``DDPStrategy``, with
  antdt's communication hook registered on the DDP model it builds
  (``configure_ddp``): each bucket weighted by ``b_i / B`` and still
  overlapping the backward pass, the step's sums in the first bucket;
* **each rank's data** (``process_dataloader``): the training
  ``DataLoader`` the module or data module returns gives its dataset and
  its batch size; the strategy hands Lightning an iterable of dynamic
  shards in its place, sized by AntDT-DD. Validation loaders are left as
  they are;
* **the step's boundaries**: ``on_train_batch_start`` begins the job's
  step and ``optimizer_step`` ends it (after the update: the step's
  samples are committed as trained, commands apply, the job ends through
  ``trainer.should_stop`` on every rank at once);
* **checkpoints**: Lightning's own, with antdt's figures added on save
  (``save_checkpoint``, a collective every rank joins) and read back on
  load (``load_model_state_dict``); a first start saves ``last.ckpt`` in
  the checkpoint callback's folder, and a restart resumes with
  ``trainer.fit(model, ckpt_path="last")``;
* **Lightning's own collectives** that wait for the slowest rank (its
  SIGTERM broadcast before each batch, a checkpoint's save) are booked as
  waiting, not as the rank's compute (:mod:`~antdt.worker.booked_waits`);
* **the end**: a broken group ends the process with exit 77 and RESTART
  or EVICT with theirs, for torchrun to act on (``on_exception``).

Supported: automatic optimisation with one optimizer, one training
dataloader of ``(input, target)`` samples, no gradient accumulation
(docs/frameworks.md says what happens otherwise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import IterableDataset

from antdt.errors import AntdtError
from antdt.sizing import BatchSizing
from antdt.worker.booked_waits import book_as_sync_wait
from antdt.worker.elastic.driven import DrivenLoader
from antdt.worker.lightning.job import CHECKPOINT_KEY, LightningJob


def training_data(dataloader) -> tuple[Any, int]:
    """The dataset and batch size of the training ``DataLoader`` the module returned (each rank's
    batch size at the first start), or an error saying what the strategy needs instead."""
    if getattr(dataloader, "batch_size", None) is None:
        raise AntdtError(
            "AntdtStrategy needs a training DataLoader with a batch_size (each rank's at the "
            "first start), not a batch_sampler"
        )
    if not hasattr(dataloader.dataset, "__len__") or isinstance(
        dataloader.dataset, IterableDataset
    ):
        raise AntdtError(
            "AntdtStrategy shards a map-style dataset (len() and [index]); the training "
            f"DataLoader holds a {type(dataloader.dataset).__name__}"
        )
    return dataloader.dataset, dataloader.batch_size


class AntdtStrategy(DDPStrategy):
    """Lightning's DDP with antdt's dynamic shards, batch sizes and exactly-once (module
    docstring)."""

    strategy_name = "antdt"

    def __init__(
        self,
        *,
        sizing: BatchSizing = BatchSizing.COMMANDS,
        shard_size: int | None = None,
        seed: int = 0,
        name: str = "dataset",
        **ddp_options,
    ):
        """``sizing``, ``shard_size``, ``seed`` and ``name`` as
        :class:`~antdt.worker.elastic.job.ElasticJob` takes them; the epochs are the trainer's
        ``max_epochs``; ``ddp_options`` go to ``DDPStrategy``."""
        super().__init__(**ddp_options)
        self._job_options = {
            "sizing": BatchSizing(sizing),
            "shard_size": shard_size,
            "seed": seed,
            "name": name,
        }
        self._restored: dict | None = None
        self.job: LightningJob | None = None

    # ------------------------------------------------------------ set-up

    def setup(self, trainer: pl.Trainer) -> None:
        self._check_supported(trainer)
        super().setup(trainer)

    def _check_supported(self, trainer: pl.Trainer) -> None:
        module = trainer.lightning_module
        if not module.automatic_optimization:
            raise AntdtError("AntdtStrategy supports automatic optimisation only")
        if trainer.accumulate_grad_batches != 1:
            raise AntdtError(
                "AntdtStrategy does not support accumulate_grad_batches: each step's batch sizes "
                "weight one backward pass"
            )
        if trainer.max_epochs is None or trainer.max_epochs < 1:
            raise AntdtError(
                "AntdtStrategy needs a finite Trainer(max_epochs=N): the passes over the data"
            )
        if self._last_checkpoint(trainer) is None:
            raise AntdtError(
                "AntdtStrategy resumes from Lightning's last checkpoint: give the Trainer a "
                "ModelCheckpoint(save_last=True, ...) and resume with fit(ckpt_path='last')"
            )

    @staticmethod
    def _last_checkpoint(trainer: pl.Trainer) -> ModelCheckpoint | None:
        """The checkpoint callback that saves ``last``: a restart resumes from its file."""
        for callback in trainer.checkpoint_callbacks:
            if isinstance(callback, ModelCheckpoint) and callback.save_last:
                return callback
        return None

    def process_dataloader(self, dataloader: object) -> object:
        dataloader = super().process_dataloader(dataloader)
        if self.lightning_module.trainer.training:
            dataset, batch_size = training_data(dataloader)
            return DrivenLoader(lambda: self._start_job(dataset, batch_size))
        return dataloader

    def _start_job(self, dataset, batch_size: int) -> LightningJob:
        """The job, once Lightning first iterates its training batches (after a restore)."""
        trainer = self.lightning_module.trainer
        last = self._last_checkpoint(trainer)

        def save_first(path: Path) -> None:
            last.last_model_path = str(path)  # the callback's next ``last`` replaces this one
            trainer.save_checkpoint(path)

        self.job = LightningJob(
            self.model,
            self.optimizers[0],
            dataset,
            batch_size=batch_size,
            first_checkpoint=Path(last.format_checkpoint_name({}, last.CHECKPOINT_NAME_LAST)),
            save=save_first,
            restored=self._restored,
            epochs=trainer.max_epochs,
            **self._job_options,
        )
        job = self.job.__enter__()
        # rooted at rank 0 before every batch, it waits for the slowest rank: not compute; and
        # before the step's watch begins, so bounded by a watch of its own
        book_as_sync_wait(
            trainer.fit_loop.epoch_loop,
            "_broadcast_sigterm_tensor",
            job.agent,
            self.root_device,
            lambda: job.watched("Lightning's SIGTERM broadcast"),
        )
        # every rank waits for a checkpoint alike, as ElasticJob's own: not one rank's compute;
        # after the step's end (its barriers, antdt's agreement), watched as a step's
        book_as_sync_wait(
            trainer,
            "save_checkpoint",
            job.agent,
            self.root_device,
            lambda: job.watched("a Lightning checkpoint"),
        )
        return job

    # ------------------------------------------------------------ the step

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        self.job.begin()

    def optimizer_step(self, optimizer, closure, model=None, **kwargs) -> Any:
        """The update, then the step's end. With no samples on any rank the placeholders' forward
        and backward still run (the step's sums ride in them) but nothing is updated."""
        if self.job.nobody_trains:
            output = closure()
        else:
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
        if self.job.end():
            self.lightning_module.trainer.should_stop = True
        return output

    # ------------------------------------------------------------ checkpoints

    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None) -> None:
        if self.job is not None:
            checkpoint[CHECKPOINT_KEY] = self.job.state()  # every rank saves: a collective
        super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_model_state_dict(self, checkpoint, strict: bool = True) -> None:
        super().load_model_state_dict(checkpoint, strict=strict)
        self._restored = checkpoint.get(CHECKPOINT_KEY)

    # ------------------------------------------------------------ the end

    def on_train_end(self) -> None:
        super().on_train_end()
        self._close_job()

    def on_exception(self, exception: BaseException) -> None:
        """A broken group ends the process with exit 77 from here; RESTART and EVICT leave with
        their exit codes."""
        super().on_exception(exception)
        self._close_job(exception)

    def _close_job(self, exception: BaseException | None = None) -> None:
        job, self.job = self.job, None
        if job is not None:
            job.close(exception)
