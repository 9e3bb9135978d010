"""Committing trained samples to the sharder: the step after which a sample counts.

Two ways, one for each kind of shared model:

* :meth:`Committer.record`: the update is already in the model (a local or
  synchronous optimizer step has run): the commit only records it, no answer.
* :meth:`Committer.request`: the update waits at the parameter servers; the
  commit asks the sharder to record it, and the parameter servers apply it
  when they read the record in the log. The sharder may refuse (the grant is
  gone, a sample is in the model already): then nothing is applied, and the
  worker stops reading those grants (:meth:`Committer.settle`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from antdt.errors import AntdtError
from antdt.schemas.models import AssignmentStatus, ShardAssignment, ShardCommit
from antdt.worker.provenance import SampleTag, commits_by_epoch
from antdt.worker.shard_client import ShardClient

Grant = tuple[int, int, int]  # (epoch, shard_id, attempt)


@dataclass(frozen=True)
class PendingUpdate:
    """A parameter-server update whose commit was asked for: the report's seq and what it named."""

    update_id: str
    seq: int
    epoch: int
    commits: tuple[ShardCommit, ...]

    @property
    def grants(self) -> set[Grant]:
        return {(self.epoch, c.shard_id, c.attempt) for c in self.commits}

    @property
    def samples(self) -> int:
        return sum(len(c.samples) for c in self.commits)


class Committer:
    """Sends commits through a worker's sharder client; ``revoke`` is told the grants of refused
    updates."""

    def __init__(
        self, client: ShardClient, revoke: Callable[[set[Grant]], None] = lambda grants: None
    ):
        self.client = client
        self.revoke = revoke
        self.refused = 0

    def record(self, tags: Iterable[SampleTag], step: int | None = None) -> int:
        """Record samples whose update is applied already; returns how many were sharded (and so
        recorded)."""
        count = 0
        for epoch, commits in commits_by_epoch(tags).items():
            self.client.commit(epoch, commits, step=step)
            count += sum(len(c.samples) for c in commits)
        return count

    def request(
        self, tags: Iterable[SampleTag], update_id: str, step: int | None = None
    ) -> PendingUpdate | None:
        """Ask the sharder to record an update held by the parameter servers; None if no sample is
        sharded."""
        by_epoch = commits_by_epoch(tags)
        if not by_epoch:
            return None
        if len(by_epoch) > 1:
            raise AntdtError(
                f"update {update_id} mixes samples of epochs {sorted(by_epoch)}; "
                "an update trains one epoch"
            )
        [(epoch, commits)] = by_epoch.items()
        seq = self.client.commit(epoch, commits, update_id=update_id, step=step)
        return PendingUpdate(update_id, seq, epoch, tuple(commits))

    def resend(self, pending: PendingUpdate, step: int | None = None) -> PendingUpdate:
        """Ask again for an update whose answer never came (lost on the bus): same update, a new
        request.

        The sharder knows the update by its id, so one recorded already is
        only answered again, never recorded twice.
        """
        seq = self.client.commit(
            pending.epoch, list(pending.commits), update_id=pending.update_id, step=step
        )
        return PendingUpdate(pending.update_id, seq, pending.epoch, pending.commits)

    def settle(self, pending: PendingUpdate, answer: ShardAssignment) -> bool:
        """True if the update was recorded; on a refusal its grants are revoked and False
        returned."""
        if answer.status is not AssignmentStatus.REFUSED:
            return True
        self.refused += 1
        self.revoke(pending.grants)
        return False
