"""How a dataset is cut into shards, and the per-epoch grant order.

Both are pure functions of the :class:`DatasetSpec`, so any process (the
sharder, a recovering sharder, the auditor) computes the same shards and the
same order without storing them.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from antdt.schemas.models import DatasetSpec


@dataclass(frozen=True, slots=True)
class ShardRange:
    """Samples ``[start, start + length)`` of the dataset index space."""

    shard_id: int
    start: int
    length: int


def split(spec: DatasetSpec) -> list[ShardRange]:
    """Contiguous shards of ``shard_size`` samples; the last one may be shorter."""
    return [
        ShardRange(i, i * spec.shard_size, min(spec.shard_size, spec.size - i * spec.shard_size))
        for i in range(spec.shard_count)
    ]


def grant_ranks(spec: DatasetSpec, epoch: int) -> list[int]:
    """``ranks[shard_id]``: position of the shard in the epoch's shuffled grant order.

    TODO shards are granted lowest rank first; a shard that returns to TODO
    keeps its rank, so retried shards go out before fresh ones.
    """
    order = list(range(spec.shard_count))
    random.Random(spec.shuffle_seed * 1_000_003 + epoch).shuffle(order)
    ranks = [0] * spec.shard_count
    for position, shard_id in enumerate(order):
        ranks[shard_id] = position
    return ranks
