"""AntDT for Hugging Face transformers: ``AntdtTrainer``, the ``Trainer`` with antdt inside.

A subclass, not a callback: a ``TrainerCallback`` is handed the unwrapped
model and never the trainer, so it can reach neither the DDP model (for
the communication hook) nor the training data, and Trainer saves a
callback's state on rank 0 alone (antdt's is a collective). One class
also means a script cannot add half of it. What it changes:

* **the gradient all-reduce**: Accelerate builds the DDP model as
  usual; antdt's communication hook goes on it when training starts,
  each bucket weighted by ``b_i / B`` and still overlapping the backward
  pass, the step's sums in the first bucket;
* **each rank's data** (``get_train_dataloader``): the training dataset
  is read in dynamic shards sized by AntDT-DD, batched by the trainer's
  data collator; Accelerate never prepares it (its sampler, its
  ``even_batches`` and its look-ahead would fight the sharder). The
  evaluation loaders are Trainer's own;
* **the step's boundaries** (a private callback): ``on_step_begin``
  begins the job's step, ``on_step_end`` ends it after the update (the
  step's samples committed as trained, commands applied), and the job ends
  through ``control.should_training_stop`` on every rank at once;
* **the length of training**: the sharder decides when data runs out, so
  Trainer runs one open-ended epoch. The learning-rate schedule is sized
  for ``num_train_epochs`` passes of the global batch (or ``max_steps``);
* **checkpoints**: Trainer's own ``checkpoint-N`` folders, each with an
  ``antdt.pt`` (the shard-state version covering every rank's commits,
  the summed ledger, the batch sizes: a collective every rank joins at
  the save). A first start saves ``checkpoint-0`` before training;
  ``train(resume_from_checkpoint=True)`` resumes the newest complete one
  (``trainer_state.json`` and ``antdt.pt`` both written), with the shards
  rewound to it before any rank reads;
* **the end**: a broken group ends the process with exit 77 and RESTART
  or EVICT with theirs, for torchrun to act on.

Supported: one process per device under torchrun with DDP (gloo or NCCL;
on CPUs ``TrainingArguments(use_cpu=True)``), a map-style training dataset,
``gradient_accumulation_steps=1``, ``save_strategy`` "steps" or "no".
docs/frameworks.md says what is refused and why.
"""

from __future__ import annotations

import math
import os
import re
import sys
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset
from transformers import Trainer, TrainerCallback

from antdt.errors import AntdtError
from antdt.sizing import BatchSizing
from antdt.worker.checkpoint import save_atomically
from antdt.worker.elastic.driven import DrivenJob, DrivenLoader

#: antdt's state in a Trainer checkpoint folder.
STATE_FILE = "antdt.pt"
#: Trainer's checkpoint folders: ``checkpoint-<global step>``.
FOLDER = re.compile(r"^checkpoint-(\d+)$")


def complete_checkpoints(output_dir: str | Path) -> list[Path]:
    """The checkpoint folders under ``output_dir`` that a restart can resume, oldest first: those
    with antdt's state and Trainer's (written last) both saved."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = [
        (int(match.group(1)), root / match.group(0))
        for match in map(FOLDER.match, os.listdir(root))
        if match
    ]
    return [
        folder
        for _, folder in sorted(found)
        if (folder / STATE_FILE).exists() and (folder / "trainer_state.json").exists()
    ]


def saved_job(path: Path) -> str | None:
    """The job id of antdt's state saved at ``path`` (None: none)."""
    return torch.load(path, map_location="cpu", weights_only=False).get("job_id")


class _Steps(TrainerCallback):
    """The job's step boundaries from Trainer's events (the trainer holds the job)."""

    def __init__(self, trainer: AntdtTrainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if args.max_steps <= 0:
            state.max_steps = sys.maxsize  # the data's end stops training, not a step count

    def on_step_begin(self, args, state, control, **kwargs):
        self.trainer.job.begin()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer.job.nobody_trains:  # placeholders only: no update
            self.trainer.accelerator.sync_gradients = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.trainer.job.end():
            control.should_training_stop = True


class AntdtTrainer(Trainer):
    """transformers' ``Trainer`` with antdt's dynamic shards, batch sizes and exactly-once (module
    docstring)."""

    def __init__(
        self,
        *args,
        sizing: BatchSizing = BatchSizing.COMMANDS,
        shard_size: int | None = None,
        seed: int = 0,
        name: str = "dataset",
        **kwargs,
    ):
        """``sizing``, ``shard_size``, ``seed`` and ``name`` as
        :class:`~antdt.worker.elastic.job.ElasticJob` takes them; the passes over the data are
        ``num_train_epochs``; the rest is ``Trainer``'s."""
        super().__init__(*args, **kwargs)
        self._job_options = {
            "sizing": BatchSizing(sizing),
            "shard_size": shard_size,
            "seed": seed,
            "name": name,
        }
        self._check_supported()
        # each rank's loss is its own mean; antdt weights it by its samples (not by tokens)
        self.args.average_tokens_across_devices = False
        self.add_callback(_Steps(self))
        self.job: DrivenJob | None = None
        self._restored: dict | None = None

    # ------------------------------------------------------------ set-up

    def _check_supported(self) -> None:
        args, dataset = self.args, self.train_dataset
        problems = {
            "gradient_accumulation_steps must be 1: each step's batch sizes weight one backward "
            "pass": args.gradient_accumulation_steps != 1,
            "DeepSpeed and FSDP are not supported: antdt weights DDP's all-reduce": (
                self.is_deepspeed_enabled or self.is_fsdp_enabled
            ),
            "auto_find_batch_size is not supported: antdt sizes the batches": (
                args.auto_find_batch_size
            ),
            "save_strategy must be 'steps' or 'no': one open-ended epoch": (
                str(getattr(args.save_strategy, "value", args.save_strategy)) not in ("steps", "no")
            ),
            "num_train_epochs must be a whole number of passes over the data": (
                args.num_train_epochs < 1 or args.num_train_epochs != int(args.num_train_epochs)
            ),
            "a map-style train_dataset (len() and [index]) is needed": (
                isinstance(dataset, IterableDataset) or not hasattr(dataset, "__len__")
            ),
            "with several processes the model must be in DDP: on CPUs pass "
            "TrainingArguments(use_cpu=True), or Accelerate trains each rank alone": (
                int(os.environ.get("WORLD_SIZE", "1")) > 1 and self.accelerator.num_processes == 1
            ),
        }
        wrong = [problem for problem, found in problems.items() if found]
        if wrong:
            raise AntdtError("AntdtTrainer: " + "; ".join(wrong))

    def get_train_dataloader(self) -> DrivenLoader:
        """The job's batches; the job starts at the first ``iter()``, once Accelerate has built the
        DDP model and Trainer has restored its checkpoint."""
        dataset, collate = self.train_dataset, self.data_collator
        try:
            import datasets

            is_arrow = isinstance(dataset, datasets.Dataset)
        except ImportError:
            is_arrow = False
        if is_arrow:
            dataset = self._remove_unused_columns(dataset, description="training")
        else:
            collate = self._get_collator_with_removed_columns(collate, description="training")
        return DrivenLoader(lambda: self._start_job(dataset, collate))

    def _start_job(self, dataset, collate) -> DrivenJob:
        output = Path(self.args.output_dir)
        ddp = getattr(self.model_wrapped, "_orig_mod", self.model_wrapped)  # torch.compile'd
        self.job = DrivenJob(
            ddp,
            self.optimizer,
            dataset,
            batch_size=self._train_batch_size,
            collate=collate,
            first_checkpoint=output / "checkpoint-0" / STATE_FILE,
            save=lambda _path: self._save_checkpoint(self.model_wrapped, None),
            restored=self._restored,
            leftover_job=saved_job,
            epochs=int(self.args.num_train_epochs),
            ledger_dir=output,
            **self._job_options,
        )
        return self.job.__enter__()

    # ------------------------------------------------------------ the length of training

    def set_initial_training_values(self, args, dataloader) -> tuple:
        """One open-ended epoch (the sharder ends it); the schedule sized for the passes asked."""
        passes, world = int(args.num_train_epochs), max(1, self.accelerator.num_processes)
        per_pass = math.ceil(len(self.train_dataset) / (self._train_batch_size * world))
        max_steps = args.max_steps if args.max_steps > 0 else passes * per_pass
        total_batch = self.get_total_train_batch_size(args)
        samples = passes * len(self.train_dataset)
        return 1, sys.maxsize, samples, samples, total_batch, per_pass, max_steps

    def _init_training_state(self, *args, **kwargs) -> tuple[int, int]:
        """Trainer's state restored, but no batches skipped: the shards were rewound instead."""
        super()._init_training_state(*args, **kwargs)
        return 0, 0

    # ------------------------------------------------------------ checkpoints

    def _save_checkpoint(self, model, trial) -> None:
        """antdt's state (every rank: a collective) into the folder, then Trainer's (whose
        ``trainer_state.json``, written last, marks the folder complete). Every rank waits for
        the save alike: its time is booked as waiting, not as the rank's compute."""
        if self.job is None:
            return super()._save_checkpoint(model, trial)
        with self.job.agent.sync_wait():
            state = self.job.state()
            if self.args.should_save:
                folder = Path(self._get_output_dir(trial)) / f"checkpoint-{self.state.global_step}"
                folder.mkdir(parents=True, exist_ok=True)
                save_atomically(state, folder / STATE_FILE)
            super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Trainer's, except on CPUs in a distributed job, where transformers before 5.23 maps the
        optimizer's state to an indexed CPU device ("cpu:0") that torch cannot restore: both
        states are loaded to the CPU here instead (where they live anyway)."""
        if checkpoint is None or self.args.world_size == 1 or self.args.device.type != "cpu":
            return super()._load_optimizer_and_scheduler(checkpoint)
        folder = Path(checkpoint)
        for target, name in ((self.optimizer, "optimizer.pt"), (self.lr_scheduler, "scheduler.pt")):
            if (folder / name).exists():
                state = torch.load(folder / name, map_location="cpu", weights_only=True)
                target.load_state_dict(state)

    def train(self, resume_from_checkpoint: str | bool | None = None, *args, **kwargs) -> Any:
        """Trainer's ``train``; ``resume_from_checkpoint=True`` takes the newest complete
        checkpoint (none: a first start), a path must hold antdt's state."""
        if resume_from_checkpoint is True:
            found = complete_checkpoints(self.args.output_dir)
            resume_from_checkpoint = str(found[-1]) if found else None
        elif resume_from_checkpoint:
            if not (Path(resume_from_checkpoint) / STATE_FILE).exists():
                raise AntdtError(f"{resume_from_checkpoint} holds no {STATE_FILE}: not antdt's")
        self._restored = None
        if resume_from_checkpoint:
            path = Path(resume_from_checkpoint) / STATE_FILE
            self._restored = torch.load(path, map_location="cpu", weights_only=False)
        try:
            output = super().train(resume_from_checkpoint or None, *args, **kwargs)
        except BaseException as exc:
            self._close_job(exc)
            raise
        self._close_job()
        return output

    def _close_job(self, exception: BaseException | None = None) -> None:
        job, self.job = self.job, None
        if job is not None:
            job.close(exception)
