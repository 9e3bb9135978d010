"""A bound on the waits inside DDP's backward pass, which antdt does not call and cannot time out.

DDP waits for its bucket all-reduces inside ``loss.backward()``, bounded
only by the process group's timeout (30 minutes by default): a peer that is
SIGSTOPped or wedged there would hold every other rank that long. A
:class:`StepWatch` is told when this rank starts waiting on its peers in a
step (or in a set-up, a checkpoint) and when that is over; every heartbeat
interval, on a thread of :class:`~antdt.worker.liveness.PeerLiveness` that
never waits on the store, it checks the rule of every bounded wait on peers
(:func:`~antdt.worker.liveness.hang_verdict`, which
:func:`~antdt.worker.ddp.wait_within` applies to the waits antdt makes
itself): past the step-sized limit a wait goes on while every rank beats (a
slow rank is not a dead one), up to ``cap_s``, and ends the rank at once
when some rank stopped beating. Ending is the caller's ``on_hung`` (exit 77:
the launcher restarts the group from its checkpoint).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from antdt.worker.ddp import HUNG_AFTER_S
from antdt.worker.liveness import PeerLiveness, hang_verdict

log = logging.getLogger(__name__)


class StepWatch:
    """Ends this rank when its wait in a step outlives the rule of :func:`hang_verdict`."""

    def __init__(
        self,
        peers: PeerLiveness,
        limit_s: Callable[[], float],
        on_hung: Callable[[str], None],
        cap_s: float = HUNG_AFTER_S,
    ):
        self.peers, self.limit_s, self.on_hung, self.cap_s = peers, limit_s, on_hung, cap_s
        self._since: float | None = None
        self._what = ""
        self._cap_s = cap_s  # the cap of the wait under way
        self._warned_at = 0.0
        peers.every_interval(self._check)

    def waiting(self, what: str, cap_s: float | None = None) -> bool:
        """This rank waits on its peers from now; False (and nothing changed) if it already does,
        in this step or the section around. ``cap_s``: this wait's cap on live ranks, if not the
        watch's (``math.inf``: only a rank that stopped beating ends it, a live one is waited for
        as the process group allows)."""
        if self._since is not None:
            return False
        self._what, self._cap_s = what, self.cap_s if cap_s is None else cap_s
        self._since = time.monotonic()
        return True

    def done(self) -> None:
        self._since = None

    def _check(self, peers: PeerLiveness) -> None:
        since = self._since
        if since is None:
            return
        now, limit = time.monotonic(), self.limit_s()
        verdict = hang_verdict(now - since, limit, self._cap_s, peers.silent_now())
        if verdict is not None:
            self.on_hung(f"{self._what} {verdict}")
        elif now - since > limit and now - self._warned_at > peers.window_s:
            self._warned_at = now
            log.warning(
                "%s has waited %.1f s; every rank is alive, waiting on (at most %g s)",
                self._what,
                now - since,
                self._cap_s,
            )
