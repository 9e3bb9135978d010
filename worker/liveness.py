"""Which ranks are alive: heartbeats in the process group's store, so a slow rank is not a dead one.

A collective that waits past its step-sized bound used to end the group
(exit 77) although the rank it waited for was only slow for a moment: its
data path stalled on the sharder, say, which has a bound of its own. A dead,
stopped (SIGSTOP) or wedged rank (its interpreter stuck holding the GIL)
stops beating; a slow one does not.

Each rank's :class:`PeerLiveness` thread adds 1 to its own counter in the
store every ``interval_s`` and reads every rank's counter back: two round
trips to the store, whatever the world size. The training
thread never touches the store: it reads the thread's last snapshot, so a
store whose host is stopped cannot hang it either (the snapshot just grows
old, which counts as every peer silent). A watchdog's checks run on a thread
of their own for the same reason: the heartbeat thread waits on the store
(up to the process group's timeout), and a stalled store must not silence
the watchdog that would notice it. Counters, not clocks: hosts' clocks may
differ, a counter that moved did move.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: Store key of rank r's counter.
KEY = "antdt/alive/{rank}"


@dataclass(frozen=True)
class Beats:
    """Every rank's heartbeat counter, read at ``read_at`` (this host's monotonic clock)."""

    counts: tuple[int, ...]
    read_at: float


def silent_ranks(before: Beats, after: Beats, own_rank: int) -> list[int]:
    """The ranks whose counter did not move between two snapshots (``own_rank`` left out).

    Every other rank counts as silent when the two snapshots are the same
    read: the store could not be reached in between.
    """
    if after.read_at <= before.read_at:
        return [r for r in range(len(after.counts)) if r != own_rank]
    return [
        rank
        for rank, (old, new) in enumerate(zip(before.counts, after.counts))
        if rank != own_rank and new <= old
    ]


def hang_verdict(
    waited_s: float,
    limit_s: float,
    cap_s: float,
    silent: list[int],
    limit_text: str | None = None,
) -> str | None:
    """Why a wait on the other ranks of ``waited_s`` must end (None: wait on): past the limit
    with ranks that stopped beating (named), or past the cap with every rank alive.

    The one rule of every bounded wait on peers: a slow rank is not a dead
    one, so the limit alone ends nothing while every rank beats.
    """
    limit_text = limit_text or f"{limit_s:.1f} s"
    if waited_s > limit_s and silent:
        return (
            f"waited {waited_s:.1f} s (limit {limit_text}) and rank(s) "
            f"{', '.join(map(str, silent))} stopped beating: dead or stopped"
        )
    if waited_s > cap_s:
        return (
            f"waited {waited_s:.1f} s (limit {limit_text}, every rank alive, at most "
            f"{cap_s:g} s): a rank is dead or stuck"
        )
    return None


class PeerLiveness:
    """This rank's heartbeat and its view of the others' (module docstring)."""

    def __init__(self, store, rank: int, world: int, interval_s: float = 0.5):
        self.store, self.rank, self.world = store, rank, world
        self.interval_s = interval_s
        self._keys = [KEY.format(rank=r) for r in range(world)]
        #: How long to watch the counters before calling a rank silent: several beats.
        self.window_s = max(3.0, 8 * interval_s)
        self._latest = Beats(tuple([0] * world), 0.0)
        self._history: deque[Beats] = deque()  # the snapshots of the last window
        self._listeners: list[Callable[[PeerLiveness], None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="antdt-liveness", daemon=True)
        self._checks = threading.Thread(
            target=self._check_every_interval, name="antdt-liveness-checks", daemon=True
        )

    @classmethod
    def of_default_group(cls, interval_s: float = 0.5) -> PeerLiveness | None:
        """For the default process group, from its store; None without one (one process, no
        store)."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        try:
            store = dist.distributed_c10d._get_default_store()
        except (AttributeError, RuntimeError, ValueError):
            return None
        return cls(store, dist.get_rank(), dist.get_world_size(), interval_s).start()

    def start(self) -> PeerLiveness:
        # every counter exists from here on (adding 0 creates one), so one read fetches them all
        for key in self._keys:
            self.store.add(key, 0)
        self._beat()
        self._thread.start()
        self._checks.start()
        return self

    def latest(self) -> Beats:
        return self._latest

    def every_interval(self, listener: Callable[[PeerLiveness], None]) -> None:
        """Call ``listener(self)`` every ``interval_s`` (a watchdog's check), whether or not the
        store answers: on a thread that never waits on it."""
        self._listeners.append(listener)

    def silent_now(self) -> list[int]:
        """The ranks whose counter has not moved over the last window (every other rank when the
        store has not answered for that long); none while less than a window has been watched."""
        now, latest = time.monotonic(), self._latest
        if now - latest.read_at > self.window_s:
            return [r for r in range(self.world) if r != self.rank]
        old = [beats for beats in self._history if latest.read_at - beats.read_at >= self.window_s]
        return silent_ranks(old[-1], latest, self.rank) if old else []

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat()

    def _check_every_interval(self) -> None:
        while not self._stop.wait(self.interval_s):
            for listener in self._listeners:
                listener(self)

    def _beat(self) -> None:
        try:
            self.store.add(self._keys[self.rank], 1)
            counts = tuple(int(value) for value in self.store.multi_get(self._keys))
        except Exception:  # noqa: BLE001 - the store is gone: the snapshot grows old, peers read silent
            return
        self._latest = Beats(counts, time.monotonic())
        self._history.append(self._latest)
        while self._latest.read_at - self._history[0].read_at > self.window_s + 2 * self.interval_s:
            self._history.popleft()

    def close(self) -> None:
        self._stop.set()
        self._checks.join(2 * self.interval_s + 1)
        self._thread.join(2 * self.interval_s + 1)
