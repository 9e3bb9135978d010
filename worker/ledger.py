"""The ledger: per epoch, how many times each sample's update is in the model.

It is the model's own account of exactly-once, independent of the shard log:
a count tensor that changes in the same operation as the parameters (a
parameter server adds to it when it applies an update; synchronous ranks sum
its ranks' counts whenever it is saved, :class:`SyncedLedger`) and is
checkpointed and restored with them, so it can never disagree with what the
model has seen.
An epoch trained exactly once is all ones; :func:`~antdt.services.sharder.audit.compare_with_ledger`
checks the shard log against it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from antdt.errors import AntdtError

FILE_PATTERN = "ledger-epoch{epoch}.npy"
_FILE = re.compile(r"ledger-epoch(\d+)\.npy$")


class SampleLedger:
    """``counts[epoch, index]``: updates applied to the model that contained sample ``index`` of
    ``epoch``."""

    def __init__(self, size: int, epochs: int):
        self.counts = torch.zeros((epochs, size), dtype=torch.int32)

    @property
    def size(self) -> int:
        return self.counts.shape[1]

    def add(self, epoch: int, indices: Iterable[int]) -> None:
        index = torch.as_tensor(list(indices), dtype=torch.long)
        if len(index):
            self.counts[epoch].index_add_(0, index, torch.ones(len(index), dtype=torch.int32))

    def add_samples(self, samples: Iterable[tuple[int, int]]) -> None:
        """Count ``(epoch, index)`` pairs, of any epochs."""
        by_epoch: dict[int, list[int]] = {}
        for epoch, index in samples:
            by_epoch.setdefault(epoch, []).append(index)
        for epoch, indices in by_epoch.items():
            self.add(epoch, indices)

    def add_tags(self, tags) -> None:
        """Count the samples of :class:`~antdt.worker.provenance.SampleTag` s."""
        self.add_samples((tag.epoch, tag.index) for tag in tags)

    def state_dict(self) -> dict:
        return {"counts": self.counts.clone()}

    def load_state_dict(self, state: dict) -> None:
        counts = state["counts"]
        if counts.shape != self.counts.shape:
            raise AntdtError(
                f"a ledger of shape {tuple(counts.shape)} does not fit {tuple(self.counts.shape)}"
            )
        self.counts = counts.clone().to(torch.int32)

    def write(self, directory: str | Path, epochs: Iterable[int] | None = None) -> list[Path]:
        """``ledger-epoch<E>.npy`` (int32, one count per sample index) for each epoch; returns the
        paths."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        paths = []
        for epoch in range(self.counts.shape[0]) if epochs is None else epochs:
            path = directory / FILE_PATTERN.format(epoch=epoch)
            partial = path.with_name(path.name + ".partial.npy")
            np.save(partial, self.counts[epoch].numpy())
            partial.replace(path)
            paths.append(path)
        return paths


def read_ledgers(directory: str | Path) -> dict[int, np.ndarray]:
    """Every ``ledger-epoch<E>.npy`` directly in ``directory``, by epoch."""
    found = {}
    for path in sorted(Path(directory).glob("ledger-epoch*.npy")):
        match = _FILE.search(path.name)
        if match:
            found[int(match.group(1))] = np.load(path)
    return found


class SyncedLedger:
    """A synchronous rank's ledger: the counts the ranks last agreed, and this rank's samples since.

    After a synchronous step every rank's batch is in every replica, so each
    rank counts its own batch at the step that applies it, locally; the ranks
    sum what they counted (:meth:`sum`, a collective over the samples trained
    since the last sum) before the ledger is saved with the model: at each
    checkpoint and at the end. What is saved is then exactly what the saved
    model contains, and no step carries ledger numbers (sending every rank's
    samples with every step cost ``world x global batch`` integers a step).
    """

    def __init__(self, ledger: SampleLedger, device: torch.device | None = None):
        self.ledger = ledger
        self.device = device or torch.device("cpu")
        self._own: list[int] = []  # epoch * size + index of each sample this rank trained since

    def count(self, tags) -> None:
        """Count this rank's trained samples (their update is applied)."""
        size = self.ledger.size
        self._own.extend(tag.epoch * size + tag.index for tag in tags)

    def sum(self, group=None) -> None:
        """Add every rank's samples since the last sum to every rank's ledger (a collective)."""
        own, self._own = torch.tensor(self._own, dtype=torch.int64), []
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
            own = _gather_uneven(own.to(self.device), group).cpu()
        counts = self.ledger.counts.view(-1)  # epoch-major: epoch * size + index is the position
        counts.index_add_(0, own, torch.ones(len(own), dtype=counts.dtype))


def _gather_uneven(values: torch.Tensor, group) -> torch.Tensor:
    """Every rank's ``values`` (of any lengths) concatenated, on every rank."""
    longest = torch.tensor([len(values)], dtype=torch.int64, device=values.device)
    dist.all_reduce(longest, op=dist.ReduceOp.MAX, group=group)
    if not longest.item():
        return values  # no rank trained anything since: nothing to gather
    padded = torch.full((int(longest.item()),), -1, dtype=torch.int64, device=values.device)
    padded[: len(values)] = values
    parts = [torch.empty_like(padded) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, padded, group=group)
    gathered = torch.cat(parts)
    return gathered[gathered >= 0]
