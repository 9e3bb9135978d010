"""A user's own training script, as ``bench/torchrun_bench.py`` runs it under torchrun.

An MLP on synthetic data, written twice the way a script author would:
``--mode plain`` is torch's own DDP with ``DistributedSampler`` (the
baseline), ``--mode dd`` the same loop through :class:`antdt.worker.ElasticJob`
as docs/torchrun.md shows, ``--mode preduce`` the same loop through
:class:`antdt.worker.preduce.PartialReduceJob` (partial reduce, no DDP),
``--mode ps`` through :class:`antdt.worker.ps.ParameterServerJob`
(asynchronous training on the servers ``antdt up --mode async`` starts). All
share the model, the data and the pacing, so the loops are the only
difference. ``--mode lightning`` and ``--mode lightning-dd`` fit the same
model with PyTorch Lightning's ``Trainer``, with its own DDP and with
``AntdtStrategy``; ``--mode hf`` and ``--mode hf-dd`` with transformers'
``Trainer`` and with ``AntdtTrainer``. ``--mode hook`` (for the breakdown in
docs/torchrun.md) is the plain loop with only antdt's weighted all-reduce
hook added.

Pacing (the benchmark's only addition, the same in both modes): with
``--slow-rank R --slow-factor F`` rank R sleeps, between each forward and
backward, ``(F - 1)`` times the batch's compute at the per-sample cost
measured before training (a local copy of the model, no communication), so
it is F times slower per sample, as a slower device would be; a smaller
batch gets a shorter sleep.

Rank 0 prints one JSON line, ``{"train_s": ..., "steps": ..., "samples": ...}``
(``dd`` and ``preduce`` add ``ledger_all_ones``: every sample trained exactly once,
``job_steps``: the job's steps, those where rank 0 had no samples included, and ``pooled``: the
samples rank 0 took from epoch tails pooled among the ranks; ``ps``
leaves that to the bench, which reads the servers' ledger): the
time from every rank's being ready (model, data and pacing built) to the
end of training, the job's set-up included (imports are not: a script
makes them at its top, before torch is even initialised).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


class Synthetic(torch.utils.data.Dataset):
    """Separable synthetic classes: ``size`` samples of ``features`` floats, ``classes`` labels."""

    def __init__(self, size: int, features: int, classes: int, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, classes, (size,), generator=generator)
        centres = torch.randn(classes, features, generator=generator)
        self.inputs = centres[self.labels] + 0.5 * torch.randn(size, features, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.inputs[index], self.labels[index]


def mlp(features: int, hidden: int, classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(features, hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.ReLU(),
        nn.Linear(hidden, classes),
    )


class Pacing:
    """Makes one rank ``factor`` times slower per sample (module docstring)."""

    def __init__(self, slow_rank: int, factor: float, model: nn.Module, dataset, batch: int):
        self.extra = factor - 1.0 if dist.get_rank() == slow_rank else 0.0
        self.per_sample_s = per_sample_cost(model, dataset, batch) if self.extra > 0 else 0.0

    def before_backward(self, samples: int) -> None:
        if self.extra > 0:
            time.sleep(self.extra * self.per_sample_s * samples)


def per_sample_cost(model: nn.Module, dataset, batch: int, repeats: int = 21) -> float:
    """The median forward and backward of one ``batch`` on a copy of ``model``, per sample."""
    local = copy.deepcopy(model)
    inputs, labels = (torch.stack(t) for t in zip(*(dataset[i] for i in range(batch))))
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        F.cross_entropy(local(inputs), labels).backward()
        times.append(time.perf_counter() - started)
    return statistics.median(times) / batch


def every_epoch(loader, sampler, epochs: int):
    """The loader's batches, epoch after epoch, as a ``DistributedSampler`` loop reads them."""
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        yield from loader


def one_ahead(iterable):
    """Each item with the one after it (None after the last): the hook takes sizes a step ahead."""
    iterator = iter(iterable)
    current = next(iterator, None)
    while current is not None:
        following = next(iterator, None)
        yield current, following
        current = following


def train_plain(model, optimizer, dataset, args, pacing: Pacing, weighted: bool = False) -> dict:
    """Torch's DDP with ``DistributedSampler``; ``weighted`` (``--mode hook``, a part of ``dd``
    measured apart) adds only antdt's weighted all-reduce hook, the batch sizes announced a
    step ahead in its first bucket: no shards, no agent."""
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    ddp = DistributedDataParallel(model)
    reduce = None
    if weighted:
        from antdt.worker.ddp_hook import WeightedReduce

        reduce = WeightedReduce(ddp)
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    steps = samples = 0
    for (inputs, labels), following in one_ahead(every_epoch(loader, sampler, args.epochs)):
        if reduce is not None:
            if reduce.total is None:
                reduce.prime(len(labels))
            reduce.begin(len(following[1]) if following else 0)  # announced a step ahead
        loss = F.cross_entropy(ddp(inputs), labels)
        optimizer.zero_grad()
        pacing.before_backward(len(labels))
        loss.backward()
        if reduce is not None:
            reduce.sums()
        optimizer.step()
        steps, samples = steps + 1, samples + len(labels)
    return {"steps": steps, "samples": samples}


def train_dd(model, optimizer, dataset, args, pacing: Pacing) -> dict:
    from torch.nn.parallel import DistributedDataParallel

    from antdt.worker import ElasticJob  # imported before the clock starts (main)

    ddp = DistributedDataParallel(model)
    job = ElasticJob(
        ddp,
        optimizer,
        dataset,
        batch_size=args.batch_size,
        epochs=args.epochs,
        checkpoint=args.checkpoint,
        sizing=args.sizing,
    )
    return train_through(job, ddp, optimizer, pacing)


def train_preduce(model, optimizer, dataset, args, pacing: Pacing) -> dict:
    """The same loop through :class:`antdt.worker.preduce.PartialReduceJob`: no DDP, each rank
    steps its own replica and the job averages it with the first ranks ready."""
    from antdt.worker.preduce import PartialReduceJob  # imported before the clock starts (main)

    job = PartialReduceJob(
        model,
        optimizer,
        dataset,
        batch_size=args.batch_size,
        epochs=args.epochs,
        checkpoint=args.checkpoint,
    )
    return train_through(job, model, optimizer, pacing)


def train_ps(model, optimizer, dataset, args, pacing: Pacing) -> dict:
    """The loop through :class:`antdt.worker.ps.ParameterServerJob`: no DDP and no optimizer step
    (the servers ``antdt up --mode async`` starts apply each push); the ledger is the servers'
    (the bench reads it)."""
    from antdt.worker.ps import ParameterServerJob  # imported before the clock starts (main)

    steps = samples = 0
    with ParameterServerJob(model, dataset, batch_size=args.batch_size, epochs=args.epochs) as job:
        for inputs, labels in job.batches():
            loss = F.cross_entropy(model(inputs), labels)
            pacing.before_backward(len(labels))
            loss.backward()
            steps, samples = steps + 1, samples + len(labels)
    return {"steps": steps, "samples": samples}


def train_through(job, model, optimizer, pacing: Pacing) -> dict:
    """The plain loop over an antdt job's batches (the forward through ``model``: the DDP model,
    or the replica itself); its figures and whether its ledger is all ones."""
    steps = samples = 0
    with job:
        for inputs, labels in job.batches():
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            pacing.before_backward(len(labels))
            loss.backward()
            optimizer.step()
            steps, samples = steps + 1, samples + len(labels)
    # exactly once, by the in-model ledger (every rank holds the summed counts)
    all_ones = bool((job.ledger.counts == 1).all())
    return {
        "steps": steps,
        "samples": samples,
        "ledger_all_ones": all_ones,
        "job_steps": job.agent.step_count,
        "pooled": getattr(job, "pooled", 0),
    }


def framework_figures(module, ledgers: str | Path | None, epochs: int) -> dict:
    """A framework run's figures: the steps and samples its module counted and, where antdt wrote
    its ledgers (``ledgers``: their folder), whether every epoch's is all ones."""
    figures = {"steps": module.steps, "samples": module.samples}
    if ledgers is not None:
        from antdt.worker.ledger import read_ledgers

        written = read_ledgers(ledgers)
        figures["ledger_all_ones"] = len(written) == epochs and all(
            bool((counts == 1).all()) for counts in written.values()
        )
    return figures


def train_lightning(model, optimizer, dataset, args, pacing: Pacing, antdt: bool = False) -> dict:
    """The model as a ``LightningModule`` fitted by Lightning's ``Trainer`` on the process group
    already up: ``--mode lightning`` with Lightning's own DDP (the baseline a Lightning user has),
    ``--mode lightning-dd`` with ``AntdtStrategy`` (docs/frameworks.md): the one line that
    differs."""
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from torch.utils.data import DataLoader

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model, self.steps, self.samples = model, 0, 0

        def training_step(self, batch, batch_idx):
            inputs, labels = batch
            loss = F.cross_entropy(self.model(inputs), labels)
            pacing.before_backward(len(labels))
            self.steps, self.samples = self.steps + 1, self.samples + len(labels)
            return loss

        def configure_optimizers(self):
            return optimizer

        def train_dataloader(self):
            return DataLoader(dataset, batch_size=args.batch_size, shuffle=True)

    if antdt:
        from antdt.worker.lightning import AntdtStrategy

        strategy = AntdtStrategy(sizing=args.sizing)
    else:
        strategy = "ddp"
    module = Module()
    folder = Path(args.checkpoint).with_suffix("")
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=dist.get_world_size(),
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=[ModelCheckpoint(folder, save_last=True, every_n_train_steps=500)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, ckpt_path="last")
    return framework_figures(module, folder if antdt else None, args.epochs)


class DictSamples(torch.utils.data.Dataset):
    """The dataset's ``(input, label)`` pairs as the dicts a transformers data collator takes."""

    def __init__(self, pairs):
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> dict:
        inputs, labels = self.pairs[index]
        return {"inputs": inputs, "labels": labels}


def train_hf(model, optimizer, dataset, args, pacing: Pacing, antdt: bool = False) -> dict:
    """The model fitted by transformers' ``Trainer`` (``--mode hf``, the baseline a Hugging Face
    user has) or by ``AntdtTrainer`` (``--mode hf-dd``): the one name that differs. The script's
    SGD, Trainer's default schedule, no logging; a checkpoint every 500 steps."""
    from transformers import Trainer, TrainingArguments

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.model, self.steps, self.samples = model, 0, 0

        def forward(self, inputs, labels):
            loss = F.cross_entropy(self.model(inputs), labels)
            pacing.before_backward(len(labels))
            self.steps, self.samples = self.steps + 1, self.samples + len(labels)
            return {"loss": loss}

    if antdt:
        from antdt.worker.hf import AntdtTrainer as Trainer  # noqa: N814 - the one name
    module = Classifier()
    training = TrainingArguments(
        str(Path(args.checkpoint).with_suffix("")),
        per_device_train_batch_size=args.batch_size,
        num_train_epochs=args.epochs,
        save_strategy="steps",
        save_steps=500,
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
    )
    trainer = Trainer(
        model=module,
        args=training,
        train_dataset=DictSamples(dataset),
        optimizers=(optimizer, None),
    )
    trainer.train(resume_from_checkpoint=True if antdt else None)
    return framework_figures(module, training.output_dir if antdt else None, args.epochs)


TRAINERS = {
    "plain": train_plain,
    "lightning": train_lightning,
    "lightning-dd": functools.partial(train_lightning, antdt=True),
    "hf": train_hf,
    "hf-dd": functools.partial(train_hf, antdt=True),
    "hook": functools.partial(train_plain, weighted=True),
    "dd": train_dd,
    "preduce": train_preduce,
    "ps": train_ps,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=sorted(TRAINERS), required=True)
    parser.add_argument("--samples", type=int, default=96_000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--slow-rank", type=int, default=-1)
    parser.add_argument("--slow-factor", type=float, default=1.0)
    parser.add_argument("--checkpoint", default="checkpoints/user_job.pt")
    parser.add_argument(
        "--sizing", default="commands", choices=["commands", "in-band"], help="dd's batch sizing"
    )
    args = parser.parse_args()
    if args.mode.startswith("lightning"):
        import lightning.pytorch  # noqa: F401 - a script's top
    if args.mode == "lightning-dd":
        from antdt.worker.lightning import AntdtStrategy  # noqa: F401 - a script's top
    if args.mode.startswith("hf"):
        import transformers  # noqa: F401 - a script's top
    if args.mode == "hf-dd":
        from antdt.worker.hf import AntdtTrainer  # noqa: F401 - a script's top
    if args.mode not in ("plain", "lightning", "hf"):
        from antdt.worker import (  # noqa: F401 - a script's top
            ElasticJob,
            ParameterServerJob,
            PartialReduceJob,
        )

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = mlp(args.features, args.hidden, args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = Synthetic(args.samples, args.features, args.classes)
    pacing = Pacing(args.slow_rank, args.slow_factor, model, dataset, args.batch_size)
    dist.barrier()
    began = time.perf_counter()
    figures = TRAINERS[args.mode](model, optimizer, dataset, args, pacing)
    dist.barrier()
    train_s = time.perf_counter() - began
    if dist.get_rank() == 0:
        print(json.dumps({"train_s": round(train_s, 3), **figures}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
