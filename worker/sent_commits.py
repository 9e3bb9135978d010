"""Commit reports the sharder's answers do not show yet: a lost one is sent again.

Reports reach the sharder at least once, in the order a client sends them,
so the answer to a request reflects every report the client sent before it.
If that answer still shows a grant we hold with samples we committed
missing from its ``done``, the commit never arrived (the bus lost it): it
is sent again. Without this a lost commit leaves its shard held, read to
the end and never finished, and the worker waits for it for ever (its
requests keep renewing the lease). Commits are idempotent at the sharder
(samples recorded once; an update id recorded once), so a commit that was
merely slow costs nothing when repeated.

Only grants this client holds are checked: a DataLoader process's grant is
committed by the main process, but only the loader's own requests see it.
This module is pure bookkeeping; :class:`~antdt.worker.shard_client.ShardClient` sends.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from antdt.schemas.models import AssignmentStatus, ShardAssignment, ShardCommit

#: Commits kept at most (a client that stops asking for shards stops checking; the oldest are
#: forgotten).
KEEP_AT_MOST = 4096

Grant = tuple[int, int, int]  # (epoch, shard, attempt)


@dataclass
class SentCommit:
    """One commit report: its bytes, the last seq it was sent before, and the samples per grant."""

    value: bytes
    after: int
    grants: dict[Grant, frozenset[int]]


class SentCommits:
    """The commit reports no answer has confirmed yet, and which of them an answer shows lost."""

    def __init__(self, worker_id: str, keep_at_most: int = KEEP_AT_MOST):
        self.worker_id = worker_id
        self._sent: deque[SentCommit] = deque(maxlen=keep_at_most)

    def __len__(self) -> int:
        return len(self._sent)

    def add(self, seq: int, value: bytes, epoch: int, commits: list[ShardCommit]) -> None:
        """A commit report sent with ``seq``; only the commits of grants this client holds are
        tracked."""
        grants = {
            (epoch, c.shard_id, c.attempt): frozenset(c.samples)
            for c in commits
            if c.holder in (None, self.worker_id)
        }
        if grants:
            self._sent.append(SentCommit(value, seq, grants))

    def lost(self, answer: ShardAssignment, last_seq: int) -> list[bytes]:
        """The reports ``answer`` shows lost, to send again now (``last_seq``: the seq sent last).

        Reports sent after the request it answers are kept for a later
        answer; the others are confirmed (their grants done, or no longer
        ours) and forgotten, or lost: returned and kept, to be checked again
        against an answer to a request sent after the repeat.
        """
        if answer.in_reply_to is None or answer.status is AssignmentStatus.REFUSED:
            return []  # a refusal lists nothing, whatever we hold
        held = {(answer.epoch, s.shard_id, s.attempt): set(s.done) for s in answer.shards}
        again, kept = [], deque(maxlen=self._sent.maxlen)
        for sent in self._sent:
            if sent.after >= answer.in_reply_to:
                kept.append(sent)
            elif any(
                grant in held and not samples <= held[grant]
                for grant, samples in sent.grants.items()
            ):
                sent.after = last_seq
                again.append(sent.value)
                kept.append(sent)
        self._sent = kept
        return again
