"""Where a rank's samples come from: dynamic shards, read without blocking a step.

Under synchronous all-reduce every rank must join every step's collective,
so a rank may never block on the sharder while the others wait for it: at
the end of an epoch the last shards are held by other ranks, which cannot
finish them unless this rank keeps stepping. :class:`ShardFeed` therefore
reads the :class:`~antdt.worker.dataset.ShardedDataset` on a thread of its
own, a granted shard at a time, and :meth:`ShardFeed.take` hands out a
full batch when there is one, or whatever is buffered (possibly nothing)
while the sharder has nothing for this rank. The thread handles only
grants; the samples of a batch are read on the training thread when it is
taken (``dataset[i]`` and a stack, what a ``DataLoader`` without worker
processes does), so the thread's work is per shard, not per sample.
Batches come as :class:`~antdt.worker.provenance.Tagged`: the samples'
provenance stays with them until the step that trains them is
committed (a sample in the buffer when a rank dies was never committed, and
is granted again). A rank sized to 0 sits steps out: its feed drops what it
buffered and holds nothing (quota 0: the sharder takes its shards back, and
grants the rest of them to the others) until it is sized up again.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from antdt.errors import AntdtError
from antdt.worker.dataset import ShardedDataset, ShardGrant, positions_in
from antdt.worker.provenance import Tagged


def stack_pairs(samples: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The default batch of ``(input, target)`` samples: each side stacked."""
    return torch.stack([sample[0] for sample in samples]), torch.stack([s[1] for s in samples])


class _Reading:
    """A grant in the feed's buffer: its positions not handed out yet, and when its lease is next
    renewed."""

    def __init__(self, grant: ShardGrant, keepalive_s: float):
        self.grant = grant
        self.next = 0
        self.renew_at = time.monotonic() + keepalive_s

    @property
    def left(self) -> int:
        return len(self.grant.positions) - self.next

    def take(self, count: int) -> list[int]:
        taken = self.grant.positions[self.next : self.next + count]
        self.next += len(taken)
        return taken


@dataclass
class Reserved:
    """A batch's samples chosen from the feed but not read yet: a batch taken a step ahead, whose
    size may still change (:meth:`ShardFeed.resize`); ``batch`` once read
    (:meth:`ShardFeed.read`)."""

    chosen: list[tuple[ShardGrant, list[int]]]
    batch: Tagged | None = None

    @property
    def size(self) -> int:
        return sum(len(positions) for _, positions in self.chosen)


class ShardFeed:
    """A bounded buffer of granted shards' positions, filled from a ShardedDataset by a background
    thread; batches are read from the source on the training thread, as a ``DataLoader`` without
    worker processes reads them."""

    def __init__(
        self,
        dataset: ShardedDataset,
        capacity: int | Callable[[], int],
        collate: Callable[[list], Any] = stack_pairs,
    ):
        """``capacity``: samples buffered before another grant is asked for; a callable is asked
        each time (say, twice the current batch); ``collate``: a list of samples to a batch (a
        ``DataLoader``'s ``collate_fn``; by default ``(input, target)`` pairs stacked)."""
        self.dataset = dataset
        self.collate = collate
        dataset.read_in_background()
        self.capacity = capacity if callable(capacity) else (lambda: capacity)
        self._keepalive_s = dataset.keepalive_s
        self._buffer: deque[_Reading] = deque()
        lock = threading.RLock()
        #: Waited on by the training thread (samples arrived, the source ended) ...
        self._changed = threading.Condition(lock)
        #: ... and by the filling thread (room in the buffer, sitting out, stopping): apart, so a
        #: step's take does not wake the filler while the buffer is still full.
        self._room = threading.Condition(lock)
        self._source_done = False
        self._stopped = False
        self._sitting_out = False
        self._arriving: ShardGrant | None = None  # a grant waiting for room in the buffer
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._fill, name="antdt-shard-feed", daemon=True)

    def start(self) -> ShardFeed:
        self._thread.start()
        return self

    def _fill(self) -> None:
        try:
            while not self.dataset.finished and not self._stopped:
                for grant in self.dataset.grants():  # one epoch, or until the rank sits out
                    if not self._put(grant):
                        break
        except BaseException as exc:  # noqa: BLE001 - re-raised on the training thread by take()
            self.error = exc
        finally:
            with self._changed:
                self._source_done = True
                self._changed.notify_all()

    def _put(self, grant: ShardGrant) -> bool:
        """Buffer ``grant`` once there is room; False (its samples dropped, never trained) if
        stopping or sitting out. While waiting, the leases of the buffered grants are kept."""
        with self._changed:
            self._arriving = grant
            while (
                not self._has_room
                and not self._stopped
                and not self._sitting_out
                and self._arriving is grant
            ):
                self._room.wait(0.1)
                self._keep_leases()
            if self._arriving is not grant:
                return True  # given back while it waited (give_back_unbegun)
            self._arriving = None
            if self._stopped or self._sitting_out:
                return False
            if grant.positions:
                self._buffer.append(_Reading(grant, self._keepalive_s))
            self._changed.notify_all()
            return True

    @property
    def _has_room(self) -> bool:
        """Fewer positions buffered than the capacity: the filling thread may add its grant (and
        a take wakes it only then)."""
        return self._buffered < self.capacity()

    @property
    def _buffered(self) -> int:
        """Positions in the buffer not handed out (a few grants: summed when asked)."""
        return sum(reading.left for reading in self._buffer)

    def _keep_leases(self) -> None:
        """Renew the lease of each buffered grant every quarter lease (with the lock held)."""
        now = time.monotonic()
        for reading in self._buffer:
            if now >= reading.renew_at:
                self.dataset.keep_alive(reading.grant)
                reading.renew_at = now + self._keepalive_s

    @property
    def quota(self) -> int:
        """Shards the rank holds while it is not sitting out: the dataset's, which a
        SET_SHARD_QUOTA command may also set (one owner: the feed keeps no copy)."""
        return self.dataset.quota

    @quota.setter
    def quota(self, value: int) -> None:
        if value == self.dataset.quota:  # set every step by in-band sizing: no lock for no change
            return
        with self._changed:
            self.dataset.quota = value

    def _sit_out(self, out: bool) -> None:
        """Start or end sitting out (module docstring); called with the lock held."""
        if out == self._sitting_out:
            return
        if out and any(reading.grant.pooled for reading in self._buffer):
            # their holders keep the grants: dropped here, they would never be trained
            raise AntdtError(
                "a rank holding its share of an epoch's pooled tail cannot be sized to 0"
            )
        self._sitting_out = out
        if out:
            self._buffer.clear()
        self.dataset.holding = not out
        self._notify_all()

    def give_back_unbegun(self, taken: Reserved | None = None) -> int:
        """Give back every held grant none of whose samples was handed out: the buffered ones and
        the one waiting for room. For an epoch's end, when other ranks are out of data: they
        train these while this rank trains what it has begun, instead of waiting while it
        trains them alone. ``taken``: a batch taken ahead and not read yet, whose samples
        past its first grant's that begin a grant are handed back first, so that grant goes
        too. Decided under the lock, so no sample of them is ever handed out here; returns the
        samples given back."""
        with self._changed:
            if taken is not None and taken.batch is None:
                self._hand_back_begun_grants(taken)
            revoked = self.dataset.revoked
            unbegun = [
                reading
                for reading in self._buffer
                if reading.next == 0
                and not reading.grant.pooled
                and reading.grant.key not in revoked
            ]
            for reading in unbegun:
                self._buffer.remove(reading)
            grants = [reading.grant for reading in unbegun]
            if self._arriving is not None and self._arriving.positions:
                grants.append(self._arriving)
                self._arriving = None
            self._notify_all()
        if grants:
            self.dataset.give_back(grants)
        return positions_in(grants)

    @property
    def buffered(self) -> int:
        """Positions buffered and not handed out yet."""
        with self._changed:
            return self._buffered

    def pool_out(self) -> list[ShardGrant]:
        """Every buffered position not handed out, taken out of the buffer, each grant's as a
        grant of those positions (for :mod:`~antdt.worker.elastic.pooling`; revoked grants
        dropped, never trained)."""
        with self._changed:
            revoked = self.dataset.revoked
            left = [
                replace(reading.grant, positions=reading.grant.positions[reading.next :])
                for reading in self._buffer
                if reading.grant.key not in revoked and reading.left
            ]
            self._buffer.clear()
            self._notify_all()
        return left

    def take_pooled(self, grants: list[ShardGrant]) -> int:
        """This rank's share of a pooled tail, handed out before anything else buffered; returns
        its samples."""
        with self._changed:
            for grant in reversed(grants):
                pooled = replace(grant, pooled=True)
                self._buffer.appendleft(_Reading(pooled, self._keepalive_s))
            self._notify_all()
        return positions_in(grants)

    @property
    def exhausted(self) -> bool:
        """Every epoch is finished and every buffered sample handed out."""
        with self._changed:
            return self._source_done and not self._buffered

    def take(self, wanted: int) -> Tagged | None:
        """Up to ``wanted`` samples stacked; a short (or no) batch only while the sharder has
        nothing more.

        ``wanted`` 0 sits the rank out (module docstring).
        """
        reserved = self.reserve(wanted)
        return None if reserved is None else self.read(reserved)

    def reserve(self, wanted: int, wait: bool = True) -> Reserved | None:
        """:meth:`take`'s choice of samples, not read yet (None: none); ``wait`` False: only what
        is buffered now."""
        return self._reserve(wanted, wait, until=None)

    def reserve_arriving(self, wanted: int, within_s: float) -> Reserved | None:
        """As :meth:`reserve`, waiting up to ``within_s`` for ``wanted`` samples even while the
        sharder's last answer was to wait: a new epoch is open, and this rank's shards are on
        their way."""
        return self._reserve(wanted, True, until=time.monotonic() + within_s)

    def _reserve(self, wanted: int, wait: bool, until: float | None) -> Reserved | None:
        """Wait for ``wanted`` samples (until the sharder has none for now, or ``until``), then
        choose what is buffered."""
        with self._changed:
            self._sit_out(wanted == 0)
            while wait and self._buffered < wanted and not self._source_done and not self._stopped:
                left = 0.05 if until is None else min(0.05, until - time.monotonic())
                if left <= 0 or (until is None and self.dataset.waiting):
                    break
                self._changed.wait(left)
            if self.error is not None:
                raise self.error
            chosen = self._choose(wanted)
            self._wake_filler_if_room()
        return Reserved(chosen) if chosen else None

    def read(self, reserved: Reserved) -> Tagged:
        """The reserved samples read and stacked (once: a second call returns the same batch).
        Read on this thread, outside the lock: the user's ``__getitem__``, as a DataLoader
        would."""
        if reserved.batch is None:
            source, chosen = self.dataset.source, reserved.chosen
            samples = [source[position] for _, positions in chosen for position in positions]
            tags = tuple(tag for grant, positions in chosen for tag in grant.tags(positions))
            reserved.batch = Tagged(self.collate(samples), tags)
        return reserved.batch

    def resize(self, reserved: Reserved, wanted: int) -> None:
        """Cut a reserved batch not read yet to ``wanted`` samples (at least one), without waiting:
        its last samples go back to the head of the buffer, or more are added from what is
        buffered (fewer if not enough is). A new batch size applies to the batch taken ahead
        instead of the one after it."""
        if reserved.batch is not None or wanted < 1:
            raise ValueError("only a reserved batch not read yet is resized, to one sample or more")
        with self._changed:
            size = reserved.size
            if size > wanted:
                self._hand_back_last(reserved, size - wanted)
            elif size < wanted:
                reserved.chosen.extend(self._choose(wanted - size))
            self._notify_all()

    def put_back(self, reserved: Reserved) -> None:
        """Hand a reserved batch not read yet back whole: its samples are handed out next."""
        if reserved.batch is not None:
            raise ValueError("a batch read already cannot be put back")
        with self._changed:
            self._hand_back_last(reserved, reserved.size)
            self._notify_all()

    def _hand_back_begun_grants(self, reserved: Reserved) -> None:
        """Hand back the reserved runs, past the first, that began their grant (with the lock
        held): the last runs chosen, so their grants are unbegun again."""
        while len(reserved.chosen) > 1:
            grant, positions = reserved.chosen[-1]
            if grant.pooled or positions[0] != grant.positions[0]:
                return
            self._hand_back_last(reserved, len(positions))

    def _hand_back_last(self, reserved: Reserved, count: int) -> None:
        """The reserved batch's last ``count`` samples handed back, run by run from its end (with
        the lock held)."""
        while count:
            grant, positions = reserved.chosen[-1]
            cut = min(len(positions), count)
            self._hand_back(grant, cut)
            if cut == len(positions):
                reserved.chosen.pop()
            else:
                reserved.chosen[-1] = (grant, positions[:-cut])
            count -= cut

    def _hand_back(self, grant: ShardGrant, count: int) -> None:
        """The last ``count`` positions handed out from ``grant`` are handed out again next (with
        the lock held): nothing was handed out since, so the grant is the buffer's head, or was
        dropped from it once all of its positions were out."""
        head = self._buffer[0] if self._buffer else None
        if head is not None and head.grant is grant:
            head.next -= count
            return
        reading = _Reading(grant, self._keepalive_s)
        reading.next = len(grant.positions) - count
        self._buffer.appendleft(reading)

    def _notify_all(self) -> None:
        """Wake every waiter, on either side (with the lock held)."""
        self._changed.notify_all()
        self._room.notify_all()

    def _wake_filler_if_room(self) -> None:
        """After a take: wake the filling thread only if the buffer has room now (with the lock
        held). A grant is often many batches long, so most takes leave the buffer full, and a
        wake per step cost the training thread the interpreter's lock every step."""
        if self._has_room:
            self._room.notify_all()

    def _choose(self, wanted: int) -> list[tuple[ShardGrant, list[int]]]:
        """Up to ``wanted`` positions from the head of the buffer, as (grant, positions) runs,
        revoked grants dropped (with the lock held)."""
        chosen: list[tuple[ShardGrant, list[int]]] = []
        count = 0
        while count < wanted and self._buffer:
            reading = self._buffer[0]
            if reading.grant.key in self.dataset.revoked:
                reading.take(reading.left)  # its commits were refused: never trained
            else:
                positions = reading.take(wanted - count)
                chosen.append((reading.grant, positions))
                count += len(positions)
            if not reading.left:
                self._buffer.popleft()
        return chosen

    def close(self) -> None:
        with self._changed:
            self._stopped = True
            self._notify_all()
        self._thread.join(5)
        self.dataset.close()
