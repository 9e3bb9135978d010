"""The example training job behind ``antdt worker``: a real torch model, the agent, dynamic shards.

A small MLP learns a synthetic 10-class problem (Gaussian clusters, generated
deterministically from a seed, so every worker sees the same dataset without
downloading anything). Each step is real torch work; ``step_sleep_s`` adds a
calibrated sleep so that several workers fit on a small machine, and the
straggler injector (``--slowdown``) makes chosen workers slower.

Batches are cut from the sample stream with the agent's *current* batch
size, so an ADJUST_BATCH_SIZE command takes effect at the next step.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from antdt.schemas.models import DatasetSpec
from antdt.worker.agent import Agent

log = logging.getLogger(__name__)


class SyntheticClassification(torch.utils.data.Dataset):
    """``size`` samples of ``features`` dims in ``classes`` Gaussian clusters, fixed by ``seed``."""

    def __init__(self, size: int, features: int = 32, classes: int = 10, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        centres = torch.randn(classes, features, generator=generator) * 3
        self.labels = torch.randint(0, classes, (size,), generator=generator)
        self.inputs = centres[self.labels] + torch.randn(size, features, generator=generator)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[index], self.labels[index]


def make_model(features: int = 32, classes: int = 10, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, classes))


@dataclass
class ExampleConfig:
    samples: int = 8192
    shard_size: int = 128
    epochs: int = 2
    batch_size: int = 32
    lr: float = 0.05
    step_sleep_s: float = 0.0
    seed: int = 0
    checkpoint: Path | None = None


def batches(agent: Agent, samples: Iterator) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Stack samples into batches of the agent's current batch size."""
    buffer = []
    for sample in agent.iterate(samples):
        buffer.append(sample)
        if len(buffer) >= agent.batch_size:
            yield torch.stack([x for x, _ in buffer]), torch.stack([y for _, y in buffer])
            buffer = []
    if buffer:
        yield torch.stack([x for x, _ in buffer]), torch.stack([y for _, y in buffer])


def train(agent: Agent, config: ExampleConfig, report=print) -> dict:
    """Train until the sharder says every epoch is done; returns a summary."""
    torch.manual_seed(config.seed)
    source = SyntheticClassification(config.samples, seed=config.seed)
    spec = DatasetSpec(name="synthetic-clusters", size=config.samples, shard_size=config.shard_size,
                       epochs=config.epochs, shuffle_seed=config.seed, max_attempts=3, lease_s=30.0)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    data = agent.shards(source, spec)
    if config.checkpoint is not None:
        agent.on_restart(lambda: agent.save_checkpoint(config.checkpoint, model, optimizer, data))
        if config.checkpoint.exists():
            agent.restore_checkpoint(config.checkpoint, model, optimizer, data)
    loss_fn = nn.CrossEntropyLoss()
    started, trained = time.monotonic(), 0
    while not data.finished:
        epoch, losses = data.epoch, []
        for inputs, labels in batches(agent, iter(data)):
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if config.step_sleep_s:
                time.sleep(config.step_sleep_s)
            losses.append(loss.item())
            trained += len(labels)
            agent.step(samples=len(labels))
        if losses:
            report(f"{agent.spec.worker_id} epoch {epoch}: {len(losses)} steps, mean loss {sum(losses) / len(losses):.3f}")
    data.close()
    elapsed = time.monotonic() - started
    return {"samples": trained, "seconds": elapsed, "samples_per_s": trained / elapsed if elapsed else 0.0}
