"""An epoch's tail shared among the ranks: the samples left in begun shards, split by batch size.

The sharder's unit is a shard, and a rank that has begun one trains it to
the end. At an epoch's end that leaves one rank (often the straggler, whose
batches are the smallest) training the rest of its last shard alone while
the others join its steps with nothing: measured on the user-style job with
3 ranks, 9 steps at a third of the global batch; with rank 1 3x slower and
2 ranks, 11 steps of its 271 samples (docs/torchrun.md). Shards not begun
go back to the sharder (:meth:`~antdt.worker.feeds.ShardFeed.give_back_unbegun`),
but a begun shard cannot: samples of it are trained and not committed yet.

Under synchronous data parallelism every rank's samples are in the model
after every step, so which rank trains a sample does not matter to the
shard log: the rank that trains it commits it under its holder's grant
(the commit names the holder, as a DataLoader process's samples are
committed by its main process). So at the step where a rank is out of data
and the others still hold begun shards, every rank pools what it has left
(one gather of the positions, at most a few shards' worth, once or twice an
epoch), and each takes a share in proportion to its batch size: the tail
then ends on every rank at about the same step. The shares are parts of
their holders' grants (:attr:`~antdt.worker.dataset.ShardGrant.pooled`):
never given back to the sharder, whose grant stays with its holder.

Pure: what every rank computes alike from the same gathered offers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from antdt.errors import AntdtError
from antdt.worker.dataset import ShardGrant, positions_in


@dataclass(frozen=True)
class Offer:
    """What one rank puts in the pool: its batch size and, as grants, the positions it has left."""

    batch_size: int
    grants: tuple[ShardGrant, ...]

    @property
    def samples(self) -> int:
        return positions_in(self.grants)


def shares(total: int, weights: Sequence[int]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders first, ties to the lower
    rank); sums to ``total``. A weight of 0 gets nothing."""
    if any(weight < 0 for weight in weights) or not sum(weights):
        raise AntdtError(f"pooling needs a rank with a batch: got batch sizes {list(weights)}")
    whole = sum(weights)
    parts = [total * weight // whole for weight in weights]
    by_remainder = sorted(
        range(len(weights)), key=lambda rank: (-(total * weights[rank] % whole), rank)
    )
    for rank in by_remainder[: total - sum(parts)]:
        parts[rank] += 1
    return parts


def share_of(offers: Sequence[Offer], rank: int) -> list[ShardGrant]:
    """``rank``'s share of the pool: the positions of every offer in rank order, cut into
    consecutive parts sized by :func:`shares` of the batch sizes, still under their grants."""
    sizes = shares(sum(offer.samples for offer in offers), [o.batch_size for o in offers])
    start = sum(sizes[:rank])
    pooled = [grant for offer in offers for grant in offer.grants]
    return _slice(pooled, start, start + sizes[rank])


def _slice(grants: list[ShardGrant], start: int, stop: int) -> list[ShardGrant]:
    """The positions ``start:stop`` of the grants' positions laid end to end, under their grants."""
    taken, offset = [], 0
    for grant in grants:
        low, high = max(start - offset, 0), min(stop - offset, len(grant.positions))
        if low < high:
            taken.append(replace(grant, positions=grant.positions[low:high]))
        offset += len(grant.positions)
    return taken
