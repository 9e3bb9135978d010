"""Group rounds in the background: a rank announces, and trains on while its group forms.

Waiting for the group after every step puts the grouper's round trip
through the bus (announce, the grouper's answer: about 14 ms on the
embedded broker, which wakes no waiting fetch, at 5 ms fetch waits; more at
the 25 ms the readers wait now) and the exchange itself on
the critical path of every step: a 2 ms step took 16 ms, and a straggler's
partner waited out the grouper's deadline each step.

Instead, at a step's end the training thread snapshots its replica and
hands the announcement to one background thread, which announces, waits
for the group and exchanges the *snapshot* with the members (point to
point: only members take part, and their own background threads answer).
The training thread steps on and, at a later step's end, adds the
group's mean less its snapshot to its replica:
``replica <- mean + (replica - snapshot)``, the steps taken since kept.
Summed over a group's members the replicas' sum does not move, exactly as
with a plain average, so every sample's update still enters the mean model
with the same weight (docs/partial-reduce.md). One announcement is in
flight per rank at a time.

A group of every rank (a checkpoint, the end) comes back unexchanged: the
training thread averages its current replica in it with one all-reduce and
sums the ledgers, as before; its background thread is idle then (the group
is the answer to its one announcement), so the two threads never use the
process group at once.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import torch

from antdt.schemas.models import WHOLE_GROUP_REASONS, GroupFormed
from antdt.worker.liveness import PeerLiveness, hang_verdict
from antdt.worker.preduce.averaging import GroupAverager
from antdt.worker.preduce.client import GroupClient, NoGroup

#: Past the round's own bounds (the group's wait, the exchange's), how long the training thread
#: waits for the background thread before it gives up on it.
MARGIN_S = 5.0
#: How long closing waits for the background thread to stop.
CLOSE_WAIT_S = 2.0
#: How long a wait for a group goes on once some rank has stopped beating: the group may need that
#: rank (a checkpoint's or the end's group of every rank), so the process group is broken and ends
#: for torchrun to start it again, without the rank (an evicted node) or with it back (a killed
#: one). A slow rank still beats, and is waited for up to the group's own bound.
SILENT_PEER_LIMIT_S = 5.0


@dataclass(frozen=True)
class Round:
    """A group formed for this rank's announcement, and what it makes of the replica."""

    group: GroupFormed
    #: the group's mean less the snapshot it averaged; None: nothing to add (a group of one, or a
    #: group of every rank, which the training thread averages itself)
    delta: torch.Tensor | None


class BackgroundRounds:
    """Announce, wait for the group and exchange a snapshot on a thread of its own (module
    docstring)."""

    def __init__(
        self,
        groups: GroupClient,
        averager: GroupAverager,
        group_wait_s: float,
        peers: PeerLiveness | None = None,
    ):
        self.groups, self.averager, self.group_wait_s = groups, averager, group_wait_s
        self.peers = peers
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="antdt-groups")
        self._round: Future | None = None
        self._stop = threading.Event()

    @property
    def in_flight(self) -> bool:
        return self._round is not None

    @property
    def done(self) -> bool:
        """Whether the round in flight has its outcome (taking it will not wait)."""
        return self._round is not None and self._round.done()

    def start(self, step: int, finished: bool = False) -> None:
        """Announce this rank ready after ``step`` steps (``finished``: no data left), with a
        snapshot of its replica as it is now."""
        if self._round is not None:
            raise RuntimeError("one group round at a time: take the last one's outcome first")
        snapshot = self.averager.flat()
        self._round = self._thread.submit(self._run, step, finished, snapshot)

    def take(self) -> Round:
        """The outcome of the round in flight, waiting for it if need be (bounded); its errors
        (no group, a member gone) raised here."""
        if self._round is None:
            raise RuntimeError("no group round in flight")
        limit_s = self.group_wait_s + self.averager.timeout_s + MARGIN_S
        try:
            return self._round.result(timeout=limit_s)
        except FutureTimeout:
            raise NoGroup(f"a group round did not end within {limit_s:.0f} s") from None
        finally:
            if self._round.done():
                self._round = None

    def close(self) -> bool:
        """Stop the round in flight (its wait for a group ends within a poll); True once the thread
        is idle, so the group client may be closed (an exchange still under way keeps it)."""
        self._stop.set()
        self._thread.shutdown(wait=False, cancel_futures=True)
        if self._round is None or self._round.cancelled():
            return True
        try:
            self._round.exception(timeout=CLOSE_WAIT_S)
        except FutureTimeout:
            return False
        return True

    def _run(self, step: int, finished: bool, snapshot: torch.Tensor) -> Round:
        seq = self.groups.announce(step, finished)
        group = self.groups.wait(seq, self.group_wait_s, self._stop, self._peers_gone)
        if group.reason in WHOLE_GROUP_REASONS:
            return Round(group, None)
        mean = self.averager.mean_of(group, snapshot.clone())
        return Round(group, None if mean is None else mean.sub_(snapshot))

    def _peers_gone(self, waited_s: float) -> str | None:
        """Why a wait for a group of ``waited_s`` must end now: some rank stopped beating (None:
        wait on; no liveness, one rank: the group's own bound alone)."""
        if self.peers is None:
            return None
        return hang_verdict(waited_s, SILENT_PEER_LIMIT_S, math.inf, self.peers.silent_now())
