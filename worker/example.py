"""The example training job behind ``antdt worker``: a real torch model, the agent, dynamic shards.

A small MLP learns a synthetic 10-class problem (overlapping Gaussian
clusters, generated deterministically from a seed, so every worker sees the
same dataset without downloading anything; a held-out set comes from the
same clusters). Each step is real torch work; ``step_sleep_s`` adds a
calibrated sleep so that several workers fit on a small machine, and the
straggler injector (``--slowdown``) makes chosen workers slower.

With parameter-server addresses the workers share one model, through the
public :class:`~antdt.worker.ps.job.ParameterServerJob`; without, each
trains its own, and a sample counts once its local optimizer step has run.

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
DATASET = "synthetic-clusters"


class SyntheticClassification(torch.utils.data.Dataset):
    """``size`` samples of ``features`` dims in ``classes`` Gaussian clusters, fixed by ``seed``.

    The clusters overlap (centres drawn with ``spread`` 1 beside unit noise):
    the model needs thousands of samples to learn them, and a held-out set
    (:meth:`heldout`) shows how far it got (chance is one in ``classes``).
    """

    def __init__(
        self,
        size: int,
        features: int = 32,
        classes: int = 10,
        seed: int = 0,
        spread: float = 1.0,
        draw: int = 1,
    ):
        centres = (
            torch.randn(classes, features, generator=torch.Generator().manual_seed(seed)) * spread
        )
        generator = torch.Generator().manual_seed(seed * 7919 + draw)
        self.labels = torch.randint(0, classes, (size,), generator=generator)
        self.inputs = centres[self.labels] + torch.randn(size, features, generator=generator)
        self._args = (features, classes, seed, spread)

    def heldout(self, size: int) -> SyntheticClassification:
        """Other samples of the same clusters, never trained on."""
        features, classes, seed, spread = self._args
        return SyntheticClassification(size, features, classes, seed, spread, draw=2)

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
    parameter_servers: tuple[str, ...] = ()


def evaluate(model: nn.Module, data: SyntheticClassification) -> tuple[float, float]:
    """(loss, accuracy) of ``model`` on ``data``."""
    with torch.no_grad():
        outputs = model(data.inputs)
        loss = nn.functional.cross_entropy(outputs, data.labels).item()
        return loss, (outputs.argmax(1) == data.labels).float().mean().item()


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
    """Train until the sharder says every epoch is done; returns a summary with the held-out
    figures."""
    torch.manual_seed(config.seed)
    source = SyntheticClassification(config.samples, seed=config.seed)
    model = make_model()
    started = time.monotonic()
    losses = EpochLosses(agent, report)
    if config.parameter_servers:
        trained = _on_servers(agent, config, source, model, losses)
    else:
        trained = _locally(agent, config, source, model, losses)
    elapsed = time.monotonic() - started
    loss, accuracy = evaluate(model, source.heldout(2048))
    return {
        "samples": trained,
        "seconds": elapsed,
        "samples_per_s": trained / elapsed if elapsed else 0.0,
        "heldout_loss": loss,
        "heldout_accuracy": accuracy,
    }


class EpochLosses:
    """Each epoch's mean training loss, reported as the next one starts (and at the end)."""

    def __init__(self, agent: Agent, report):
        self.agent, self.report = agent, report
        self.epoch: int | None = None
        self.losses: list[float] = []

    def add(self, epoch: int, loss: float) -> None:
        if epoch != self.epoch:
            self.flush()
            self.epoch = epoch
        self.losses.append(loss)

    def flush(self) -> None:
        if self.losses:
            self.report(
                f"{self.agent.spec.worker_id} epoch {self.epoch}: {len(self.losses)} steps, "
                f"mean loss {sum(self.losses) / len(self.losses):.3f}"
            )
        self.losses = []


def _on_servers(agent: Agent, config: ExampleConfig, source, model, losses: EpochLosses) -> int:
    """One shared model on the parameter servers, through the public job (they apply the SGD)."""
    from antdt.worker.ps.job import ParameterServerJob

    loss_fn = nn.CrossEntropyLoss()
    with ParameterServerJob(
        model,
        source,
        batch_size=agent.batch_size,
        servers=config.parameter_servers,
        epochs=config.epochs,
        shard_size=config.shard_size,
        seed=config.seed,
        name=DATASET,
        agent=agent,
    ) as job:
        for inputs, labels in job.batches():
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            if config.step_sleep_s:
                time.sleep(config.step_sleep_s)
            losses.add(job.data.epoch, loss.item())
    losses.flush()
    return job.samples


def _locally(agent: Agent, config: ExampleConfig, source, model, losses: EpochLosses) -> int:
    """This worker's own model: a sample counts once its local optimizer step has run."""
    spec = DatasetSpec(
        name=DATASET,
        size=config.samples,
        shard_size=config.shard_size,
        epochs=config.epochs,
        shuffle_seed=config.seed,
        max_attempts=3,
        lease_s=30.0,
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr)
    data = agent.shards(source, spec)
    if config.checkpoint is not None:
        agent.on_restart(lambda: agent.save_checkpoint(config.checkpoint, model, optimizer, data))
        if config.checkpoint.exists():
            agent.restore_checkpoint(config.checkpoint, model, optimizer, data)
    loss_fn = nn.CrossEntropyLoss()
    trained = 0
    while not data.finished:
        for inputs, labels in batches(agent, iter(data)):
            loss = loss_fn(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            if config.step_sleep_s:
                time.sleep(config.step_sleep_s)
            optimizer.step()
            losses.add(data.epoch, loss.item())
            trained += len(labels)
            agent.step(samples=len(labels))
    losses.flush()
    data.close()
    return trained
