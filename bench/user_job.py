"""A user's own training script, as ``bench/torchrun_bench.py`` runs it under torchrun.

An MLP on synthetic data, written twice the way a script author would:
``--mode plain`` is torch's own DDP with ``DistributedSampler`` (the
baseline), ``--mode dd`` the same loop through :class:`antdt.worker.ElasticJob`
as docs/torchrun.md shows. Both share the model, the data and the pacing, so
the two loops are the only difference.

Pacing (the benchmark's only addition, the same in both modes): with
``--slow-rank R --slow-factor F`` rank R sleeps ``(F - 1)`` times its
measured forward and backward after each backward, so it is F times slower
per sample, as a slower device would be.

Rank 0 prints one JSON line, ``{"train_s": ..., "steps": ..., "samples": ...}``:
the time from the process group's start to the end of training (the job's
set-up included).
"""

from __future__ import annotations

import argparse
import json
import time

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

    def __init__(self, slow_rank: int, factor: float):
        self.extra = factor - 1.0 if dist.get_rank() == slow_rank else 0.0
        self.started = time.perf_counter()

    def begin(self) -> None:
        self.started = time.perf_counter()

    def after_backward(self) -> None:
        if self.extra > 0:
            time.sleep(self.extra * (time.perf_counter() - self.started))


def train_plain(model, optimizer, dataset, args, pacing: Pacing) -> tuple[int, int]:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader, DistributedSampler

    ddp = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    steps = samples = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for inputs, labels in loader:
            pacing.begin()
            loss = F.cross_entropy(ddp(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            pacing.after_backward()
            optimizer.step()
            steps, samples = steps + 1, samples + len(labels)
    return steps, samples


def train_dd(model, optimizer, dataset, args, pacing: Pacing) -> tuple[int, int]:
    from antdt.worker import ElasticJob

    steps = samples = 0
    with ElasticJob(
        model,
        optimizer,
        dataset,
        batch_size=args.batch_size,
        epochs=args.epochs,
        checkpoint=args.checkpoint,
    ) as job:
        for inputs, labels in job.batches():
            pacing.begin()
            loss = F.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            pacing.after_backward()
            job.sync()
            optimizer.step()
            steps, samples = steps + 1, samples + len(labels)
    return steps, samples


TRAINERS = {"plain": train_plain, "dd": train_dd}


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
    args = parser.parse_args()
    dist.init_process_group("gloo")
    began = time.perf_counter()
    torch.manual_seed(0)
    model = mlp(args.features, args.hidden, args.classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    dataset = Synthetic(args.samples, args.features, args.classes)
    pacing = Pacing(args.slow_rank, args.slow_factor)
    steps, samples = TRAINERS[args.mode](model, optimizer, dataset, args, pacing)
    dist.barrier()
    train_s = time.perf_counter() - began
    if dist.get_rank() == 0:
        print(json.dumps({"train_s": round(train_s, 3), "steps": steps, "samples": samples}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
