"""How a model's parameters are split between parameter-server shards.

Each tensor lives whole on one shard; tensors go, largest first, to the
shard holding the fewest values so far, so shards carry about the same load.
The split is a pure function of the names, shapes and shard count, so every
worker computes the same one; a server checks a worker's signature against
its own at the first contact.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

import torch

from antdt.errors import AntdtError


@dataclass(frozen=True)
class Layout:
    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    shards: int
    owners: tuple[int, ...]

    @classmethod
    def of(cls, model: torch.nn.Module, shards: int) -> Layout:
        params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        for name, param in params:
            if param.dtype is not torch.float32:
                raise AntdtError(
                    f"parameter {name} is {param.dtype}; "
                    "the parameter server holds float32 parameters"
                )
        names = tuple(name for name, _ in params)
        shapes = tuple(tuple(p.shape) for _, p in params)
        return cls(names, shapes, shards, _owners(shapes, shards))

    def members(self, shard: int) -> list[int]:
        """Indices (into ``names``) of the tensors shard ``shard`` holds."""
        return [i for i, owner in enumerate(self.owners) if owner == shard]

    def signature(self, shard: int) -> list:
        return [[self.names[i], list(self.shapes[i])] for i in self.members(shard)]

    def size(self, shard: int) -> int:
        return sum(prod(self.shapes[i]) for i in self.members(shard))

    def gather(self, tensors: list[torch.Tensor], shard: int) -> torch.Tensor:
        """Shard ``shard``'s tensors as one flat float32 tensor in host memory, as the wire sends it
        (zeros for a missing gradient); a model on a GPU is copied off it here."""
        parts = [
            tensors[i].detach().reshape(-1).cpu()
            if tensors[i] is not None
            else torch.zeros(prod(self.shapes[i]))
            for i in self.members(shard)
        ]
        return torch.cat(parts) if parts else torch.zeros(0)

    def scatter(self, flat: torch.Tensor, shard: int, targets: list[torch.Tensor]) -> None:
        """Copy a flat tensor of shard ``shard`` into its tensors, in place."""
        offset = 0
        for i in self.members(shard):
            n = prod(self.shapes[i])
            targets[i].data.copy_(flat[offset : offset + n].view(self.shapes[i]))
            offset += n


def _owners(shapes: tuple[tuple[int, ...], ...], shards: int) -> tuple[int, ...]:
    if shards < 1:
        raise AntdtError(f"a model needs at least one parameter-server shard, got {shards}")
    load, owners = [0] * shards, [0] * len(shapes)
    for i in sorted(range(len(shapes)), key=lambda i: (-prod(shapes[i]), i)):
        shard = min(range(shards), key=lambda k: (load[k], k))
        owners[i] = shard
        load[shard] += prod(shapes[i])
    return tuple(owners)
