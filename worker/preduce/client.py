"""The worker's side of partial reduce: announce readiness, wait for the group the grouper forms.

Announcements go to ``group.ready`` (keyed by job); the groups come back on
the worker's own partition of ``group.formed`` (keyed ``<job>/<worker>``),
read by manual assignment with no consumer group, positioned past a marker
it wrote before the first announcement so no group can slip past it. A
group is matched to its announcement by ``in_reply_to`` and to this process
group by ``generation``; anything else on the key is skipped (an old
group), or dead-lettered when it is not a group for this worker.

Nothing waits for ever: :meth:`GroupClient.wait` raises :class:`NoGroup`
after its bound. While it waits it sends the same announcement again now
and then (a restarted grouper has forgotten who was waiting; the grouper
takes a repeated seq as the same announcement), at once after a bus reset
(:mod:`antdt.bus.watch`: the bus came back empty, its reader starts over at
offset 0), and appends a marker to its own partition (the embedded broker
can keep a partition's last record invisible until the next write).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable

from antdt.bus.config import FetchPace
from antdt.bus.markers import marker_id, send_marker
from antdt.bus.own_key import OwnKeyClient
from antdt.bus.readers import decode_addressed, poll_batch
from antdt.bus.watch import produce_through_reset, refresh_metadata
from antdt.errors import AntdtError
from antdt.schemas.codec import Codec
from antdt.schemas.models import GroupFormed, GroupReady
from antdt.schemas.types import utc_now
from antdt.settings import Settings
from antdt.topics import topic_spec
from antdt.worker.ddp import CollectiveTimeout

log = logging.getLogger(__name__)

#: A group this late: a marker to our partition, then again every NUDGE_EVERY_S.
NUDGE_AFTER_S = 0.1
NUDGE_EVERY_S = 0.5
#: A group this late: the announcement again (the grouper may have restarted).
ANNOUNCE_AGAIN_S = 2.0


class NoGroup(AntdtError):
    """The grouper formed no group for an announcement in time."""


class GroupClient(OwnKeyClient):
    """Announce and wait, for one worker incarnation in one generation of its process group."""

    def __init__(
        self,
        settings: Settings,
        job_id: str,
        worker_id: str,
        incarnation: str,
        rank: int,
        world: int,
        generation: int,
        codec: Codec | None = None,
    ):
        self._ready_topic = topic_spec("group", "ready").full_name(settings.topic_prefix)
        self._formed_topic = topic_spec("group", "formed").full_name(settings.topic_prefix)
        super().__init__(
            settings,
            job_id,
            worker_id,
            self._formed_topic,
            f"antdt-worker-{worker_id}-groups",
            codec,
            # rounds run in the background (rounds.py): a group some milliseconds later costs no
            # step, and a 5 ms wait polled the broker 200 times a second on the ranks' cores
            pace=FetchPace.STEADY,
        )
        self.incarnation = incarnation
        self.rank, self.world, self.generation = rank, world, generation
        self._seq = itertools.count(1)
        # the latest announcement (seq, record), to send again
        self._last: tuple[int, bytes] = (0, b"")

    @classmethod
    def for_agent(cls, agent, generation: int) -> GroupClient:
        spec = agent.spec
        return cls(
            agent.settings,
            spec.job_id,
            spec.worker_id,
            agent.incarnation,
            spec.rank,
            spec.world_size or 1,
            generation,
        )

    def announce(self, step: int, finished: bool = False) -> int:
        """Ready to average after ``step`` local steps (``finished``: no data left); returns the seq
        to wait for."""
        seq = next(self._seq)
        event = GroupReady(
            job_id=self.job_id,
            worker_id=self.worker_id,
            incarnation=self.incarnation,
            generation=self.generation,
            rank=self.rank,
            world_size=self.world,
            seq=seq,
            step=step,
            finished=finished,
            timestamp=utc_now(),
        )
        value = self.codec.encode(event, self._ready_topic)
        self._last = (seq, value)
        self._await_replies(True)
        self._send(value)
        return seq

    def _send(self, value: bytes) -> None:
        produce_through_reset(
            self._producer, self._watch, self._ready_topic, key=self.job_id.encode(), value=value
        )
        self._producer.poll(0)

    def wait(
        self,
        seq: int,
        timeout_s: float,
        stop: threading.Event | None = None,
        broken: Callable[[float], str | None] | None = None,
    ) -> GroupFormed:
        """The group formed for announcement ``seq``; NoGroup after ``timeout_s`` (or soon after
        ``stop`` is set: the job is closing). ``broken(waited_s)``: why the process group is
        broken (a rank stopped beating), asked as the wait goes on; a reason ends the wait with
        :class:`~antdt.worker.ddp.CollectiveTimeout`, which ends the rank for a restart."""
        try:
            return self._wait(seq, timeout_s, stop, broken)
        finally:
            self._await_replies(False)  # one announcement at a time: nothing awaited now

    def _wait(
        self,
        seq: int,
        timeout_s: float,
        stop: threading.Event | None,
        broken: Callable[[float], str | None] | None,
    ) -> GroupFormed:
        began = time.monotonic()
        nudge_at, again_at = began + NUDGE_AFTER_S, began + ANNOUNCE_AGAIN_S
        while (now := time.monotonic()) - began < timeout_s:
            if stop is not None and stop.is_set():
                raise NoGroup(f"worker {self.worker_id}: stopped waiting for a group: closing")
            if broken is not None and (why := broken(now - began)) is not None:
                raise CollectiveTimeout(
                    f"worker {self.worker_id}: announcement {seq}'s group {why}"
                )
            # the bus came back empty: our announcement is gone
            if self._rewinder.check() and self._last[0] == seq:
                refresh_metadata(self._producer)
                self._send(self._last[1])
            for message in poll_batch(
                self._consumer, 100, min(0.01, max(0.001, timeout_s - (now - began)))
            ):
                group = self._group_in(message)
                if group is not None and group.in_reply_to == seq:
                    return group
            now = time.monotonic()
            if now >= nudge_at:
                send_marker(self._producer, self._formed_topic, self._key)
                self._producer.poll(0)
                nudge_at = now + NUDGE_EVERY_S
            if now >= again_at and self._last[0] == seq:
                log.warning(
                    "worker %s: no group %.1f s after announcement %d: announcing it again",
                    self.worker_id,
                    now - began,
                    seq,
                )
                self._send(self._last[1])
                again_at = now + ANNOUNCE_AGAIN_S
        raise NoGroup(
            f"worker {self.worker_id}: no group from the grouper for announcement {seq} within "
            f"{timeout_s:.0f} s (is `antdt grouper` running?)"
        )

    def _group_in(self, message) -> GroupFormed | None:
        """A group of this generation for this worker, or None (markers, old groups, dead-lettered
        records)."""
        if message.key() != self._key or marker_id(message) is not None:
            return None
        group = decode_addressed(
            message, self.codec, self._deadletter, GroupFormed, self.job_id, self.worker_id, "group"
        )
        return group if group is not None and group.generation == self.generation else None
