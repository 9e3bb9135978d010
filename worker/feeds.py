"""Where a synchronous rank's samples come from: dynamic shards or a static slice.

Under synchronous all-reduce every rank must join every step's collective,
so a rank may never block on the sharder while the others wait for it: at
the end of an epoch the last shards are held by other ranks, which cannot
finish them unless this rank keeps stepping. :class:`ShardFeed` therefore
reads the :class:`~antdt.worker.dataset.ShardedDataset` on a thread of its
own, and :meth:`ShardFeed.take` hands out a full batch when there is one,
or whatever is buffered (possibly nothing) while the sharder has nothing
for this rank. Batches come as :class:`~antdt.worker.provenance.Tagged`: the
samples' provenance stays with them until the step that trains them is
committed (a sample in the buffer when a rank dies was never committed, and
is granted again). A rank sized to 0 sits steps out: its feed drops what it
buffered and holds nothing (quota 0: the sharder takes its shards back, and
grants the rest of them to the others) until it is sized up again.

:class:`StaticFeed` is the baseline's static sharding: rank ``r`` of ``n``
trains positions ``r, r + n, ...`` of a seeded per-epoch permutation, the
way ``DistributedSampler`` splits a dataset. Its tags carry epoch and index
only (there is no sharder to commit to; the ledger still counts them).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

import torch

from antdt.worker.dataset import ShardedDataset
from antdt.worker.provenance import SampleTag, Tagged


def _stacked(samples: list[Tagged]) -> Tagged:
    inputs = torch.stack([s.data[0] for s in samples])
    labels = torch.stack([s.data[1] for s in samples])
    return Tagged((inputs, labels), tuple(tag for s in samples for tag in s.tags))


class ShardFeed:
    """A bounded buffer filled from a ShardedDataset by a background thread."""

    def __init__(self, dataset: ShardedDataset, capacity: int | Callable[[], int]):
        """``capacity``: samples buffered at most; a callable is asked each time (say, twice the
        current batch)."""
        self.dataset = dataset
        self.capacity = capacity if callable(capacity) else (lambda: capacity)
        self._buffer: deque = deque()
        self._changed = threading.Condition()
        self._source_done = False
        self._stopped = False
        self._sitting_out = False
        self._quota = dataset.quota
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._fill, name="antdt-shard-feed", daemon=True)

    def start(self) -> ShardFeed:
        self._thread.start()
        return self

    def _fill(self) -> None:
        try:
            while not self.dataset.finished and not self._stopped:
                for sample in self.dataset:  # one epoch, or until the rank sits out
                    if not self._put(sample):
                        break
        except BaseException as exc:  # noqa: BLE001 - re-raised on the training thread by take()
            self.error = exc
        finally:
            with self._changed:
                self._source_done = True
                self._changed.notify_all()

    def _put(self, sample: Tagged) -> bool:
        """Buffer ``sample`` once there is room; False (the sample dropped, never trained) if
        stopping or sitting out."""
        with self._changed:
            while (
                len(self._buffer) >= self.capacity() and not self._stopped and not self._sitting_out
            ):
                self._changed.wait(0.1)
            if self._stopped or self._sitting_out:
                return False
            self._buffer.append(sample)
            self._changed.notify_all()
            return True

    def _sit_out(self, out: bool) -> None:
        """Start or end sitting out (module docstring); called with the lock held."""
        if out == self._sitting_out:
            return
        self._sitting_out = out
        if out:
            self._buffer.clear()
            self.dataset.quota = 0
        else:
            self.dataset.quota = self._quota
        self._changed.notify_all()

    @property
    def exhausted(self) -> bool:
        """Every epoch is finished and every buffered sample handed out."""
        with self._changed:
            return self._source_done and not self._buffer

    def take(self, wanted: int) -> Tagged | None:
        """Up to ``wanted`` samples stacked; a short (or no) batch only while the sharder has
        nothing more.

        ``wanted`` 0 sits the rank out (module docstring).
        """
        with self._changed:
            self._sit_out(wanted == 0)
            while (
                len(self._buffer) < wanted
                and not self._source_done
                and not self.dataset.waiting
                and not self._stopped
            ):
                self._changed.wait(0.05)
            if self.error is not None:
                raise self.error
            count = min(wanted, len(self._buffer))
            samples = [self._buffer.popleft() for _ in range(count)]
            self._changed.notify_all()
        if not samples:
            return None
        return _stacked(samples)

    def close(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        self._thread.join(5)
        self.dataset.close()


class StaticFeed:
    """Rank ``rank``'s fixed slice of every epoch, in order: no sharder, no dynamic balance."""

    def __init__(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        rank: int,
        world: int,
        epochs: int,
        seed: int,
    ):
        order = [
            torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed + epoch))[
                rank::world
            ]
            for epoch in range(epochs)
        ]
        self._positions = torch.cat(order)
        self._epochs = torch.cat(
            [torch.full((len(part),), epoch) for epoch, part in enumerate(order)]
        )
        self._inputs, self._labels = inputs, labels
        self._next = 0

    @property
    def position(self) -> int:
        """Samples handed out so far (a checkpoint keeps it)."""
        return self._next

    def skip_to(self, position: int) -> None:
        self._next = position

    @property
    def exhausted(self) -> bool:
        return self._next >= len(self._positions)

    def take(self, wanted: int) -> Tagged | None:
        chosen = self._positions[self._next : self._next + wanted]
        epochs = self._epochs[self._next : self._next + wanted]
        self._next += len(chosen)
        if not len(chosen):
            return None
        tags = tuple(SampleTag(int(e), int(i)) for e, i in zip(epochs, chosen))
        return Tagged((self._inputs[chosen], self._labels[chosen]), tags)

    def close(self) -> None:
        pass
