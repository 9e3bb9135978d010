"""An independent audit of a job's shard log: was every sample trained exactly once per epoch?

The sharder's guarantee is that the log proves exactly-once. This module
checks that claim without trusting the code that makes it: it does not use
:mod:`state` or :mod:`core`, it folds the events with its own, smaller model
of the protocol (documented in :mod:`state`) and reports everything that
model disagrees with. A bug in the live fold therefore cannot hide itself
from the audit.

What it applies, like the live fold: fencing (a WRITER_ELECTED with a higher
writer epoch makes its writer current; anything else from another epoch, and
a rival election for the current one, is ignored), sequencing (repeated seqs
ignored, missing seqs reported), and the shard state machine, including
rewinds (within an epoch: shards DONE after the version, and every shard in
flight, go back to TODO; across epochs: the target epoch starts a new pass
with the listed shards DONE). Only the DONEs that survive rewinds are
credited, so work redone because a rewind undid it is not a duplicate.

Samples: every APPLIED event records samples whose update is in the model.
The audit counts, per sample and pass, the records that survive rewinds
(:meth:`Auditor.applied_counts`): exactly once is a count of 1 for every
sample, and the model's own ledger (:mod:`antdt.worker.ledger`) must show
the same counts (:func:`compare_with_ledger`).

What it reports per data epoch (the last completed pass of the epoch, or the
pass in progress): samples done exactly once, duplicate DONEs, gaps,
reclaimed leases, retries, quarantined shards, DONEs credited to a worker
that did not hold the shard; per log: fenced events, duplicate and missing
seqs, rewinds, and whether the job finished.

Violations (each one line): a duplicate DONE, a DONE from a non-holder, a
DONE of a shard with samples never applied, a sample applied twice in one
pass, samples applied under a grant their holder did not have, a grant of a
shard that is not TODO, a failure, expiry or quarantine of a shard
nobody holds, an epoch closed with samples neither DONE nor QUARANTINED,
events for an epoch that is not open, epochs opened out of order, unknown
shards, missing seqs, a duplicate seq with different content, an event from a
writer epoch that was never elected, events of another job, and, unless
``allow_quarantine``, quarantined shards in the reported passes. Fenced
events and identical redeliveries are expected after a fail-over or a retry
and are only counted.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import Any

from antdt.schemas.models import (
    DatasetSpec,
    ShardLogEvent,
    ShardSnapshot,
    ShardState,
    held_by_worker,
)
from antdt.schemas.models import ShardTransition as T

_SETTLED = (ShardState.DONE, ShardState.QUARANTINED)


class EpochStatus(str, Enum):
    """How far the reported pass of an epoch got."""

    COMPLETE = "complete"
    IN_PROGRESS = "in progress"
    REWOUND = "rewound"  # abandoned by a rewind to an earlier epoch before it completed


@dataclass
class EpochAudit:
    """The audit of one data epoch: its last completed pass, or the pass in progress.

    Counters describe the reported pass; ``violations`` lists everything
    found in any pass of the epoch (a bug in an abandoned pass still happened).
    """

    epoch: int
    status: EpochStatus
    passes: int
    rewinds: int
    shards: int
    samples: int
    shards_done: int
    samples_done_once: int
    samples_pending: int
    samples_applied_twice: int
    duplicate_done: list[int]
    not_holder_done: list[int]
    gaps: list[tuple[int, int]]
    quarantined: dict[int, str]
    leases_expired: int
    released: int
    retries: int
    #: Shards their holder gave back unread for workers out of data (not reclaimed: handed on).
    given_back: int = 0
    #: Samples another worker applied under their holder's grant: a synchronous job's epoch tail
    #: pooled among its ranks (docs/torchrun.md).
    pooled: int = 0
    violations: list[str] = field(default_factory=list)
    #: Per dataset sample, how many APPLIED records of the reported pass name it (after rewinds).
    counts: list[int] = field(default_factory=list, repr=False)

    @property
    def gap_samples(self) -> int:
        return sum(end - start for start, end in self.gaps)

    @property
    def reclaimed(self) -> int:
        """Shards taken back from their holder: expired leases plus shards of departed workers."""
        return self.leases_expired + self.released

    def to_dict(self) -> dict[str, Any]:
        return {
            "epoch": self.epoch,
            "status": self.status.value,
            "passes": self.passes,
            "rewinds": self.rewinds,
            "shards": self.shards,
            "samples": self.samples,
            "shards_done": self.shards_done,
            "samples_done_once": self.samples_done_once,
            "samples_pending": self.samples_pending,
            "samples_applied_twice": self.samples_applied_twice,
            "duplicate_done": self.duplicate_done,
            "not_holder_done": self.not_holder_done,
            "gaps": [list(gap) for gap in self.gaps],
            "gap_samples": self.gap_samples,
            "quarantined": {str(k): v for k, v in self.quarantined.items()},
            "leases_expired": self.leases_expired,
            "released": self.released,
            "given_back": self.given_back,
            "pooled": self.pooled,
            "retries": self.retries,
            "violations": self.violations,
        }


@dataclass
class AuditReport:
    """The audit of one job's log."""

    job_id: str | None
    dataset: DatasetSpec | None
    finished: bool
    events: int
    applied: int
    fenced: int
    duplicate_seqs: int
    seq_gaps: list[tuple[int, int]]
    rewinds: int
    writer_epoch: int
    last_seq: int
    epochs: list[EpochAudit]
    log_violations: list[str]
    allow_quarantine: bool = False
    # the log before this seq is gone; audited from a snapshot taken there
    from_snapshot_seq: int | None = None

    @property
    def violations(self) -> list[str]:
        """Every violation, log-wide ones first, each one line."""
        return [*self.log_violations, *(v for epoch in self.epochs for v in epoch.violations)]

    @property
    def ok(self) -> bool:
        return not self.violations

    def epoch(self, number: int) -> EpochAudit | None:
        return next((e for e in self.epochs if e.epoch == number), None)

    def for_epoch(self, number: int) -> AuditReport:
        """The same report restricted to one epoch (log-wide findings kept); KeyError if never
        opened."""
        entry = self.epoch(number)
        if entry is None:
            raise KeyError(number)
        return replace(self, epochs=[entry])

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return {
            "job_id": self.job_id,
            "ok": self.ok,
            "finished": self.finished,
            "dataset": None if self.dataset is None else self.dataset.model_dump(mode="json"),
            "events": self.events,
            "applied": self.applied,
            "fenced": self.fenced,
            "duplicate_seqs": self.duplicate_seqs,
            "seq_gaps": [list(gap) for gap in self.seq_gaps],
            "rewinds": self.rewinds,
            "writer_epoch": self.writer_epoch,
            "last_seq": self.last_seq,
            "allow_quarantine": self.allow_quarantine,
            "from_snapshot_seq": self.from_snapshot_seq,
            "epochs": [e.to_dict() for e in self.epochs],
            "violations": self.violations,
        }


# ---------------------------------------------------------------- the audit's own model


@dataclass(slots=True)
class _Shard:
    start: int
    length: int
    state: ShardState = ShardState.TODO
    holder: str | None = None  # while DOING
    # whose late DONE is still good work (nobody was granted it since)
    last_holder: str | None = None
    done_seq: int | None = None
    done_by: str | None = None
    reason: str | None = None
    # sample -> seqs of the APPLIED events naming it
    applied: dict[int, list[int]] = field(default_factory=dict)

    def unapplied(self) -> int:
        return sum(1 for i in range(self.start, self.start + self.length) if i not in self.applied)

    def apply_all(self, seq: int) -> None:
        self.applied = {i: [seq] for i in range(self.start, self.start + self.length)}


@dataclass
class _Pass:
    """One run through an epoch, from its opening to its close (or abandonment)."""

    epoch: int
    opened_seq: int
    shards: list[_Shard]
    closed: bool = False
    duplicate_done: set[int] = field(default_factory=set)
    not_holder_done: set[int] = field(default_factory=set)
    applied_twice: set[int] = field(default_factory=set)
    leases_expired: int = 0
    released: int = 0
    given_back: int = 0
    pooled: int = 0
    retries: int = 0

    def gaps(self) -> list[tuple[int, int]]:
        """Sample ranges of shards neither DONE nor QUARANTINED, merged where contiguous."""
        merged: list[tuple[int, int]] = []
        for shard in self.shards:
            if shard.state in _SETTLED:
                continue
            end = shard.start + shard.length
            if merged and merged[-1][1] == shard.start:
                merged[-1] = (merged[-1][0], end)
            else:
                merged.append((shard.start, end))
        return merged


def shard_ranges(spec: DatasetSpec) -> list[tuple[int, int]]:
    """``(start, length)`` of each shard, computed here rather than taken from the sharder.

    Shard ``i`` covers samples ``[i * shard_size, min(size, (i + 1) * shard_size))``.
    """
    count = -(-spec.size // spec.shard_size)
    return [
        (i * spec.shard_size, min(spec.shard_size, spec.size - i * spec.shard_size))
        for i in range(count)
    ]


def _ranges_text(ranges: list[tuple[int, int]], limit: int = 5) -> str:
    shown = ", ".join(f"[{start}, {end})" for start, end in ranges[:limit])
    return shown + (f" and {len(ranges) - limit} more" if len(ranges) > limit else "")


class Auditor:
    """Folds a job's events, one at a time, into an :class:`AuditReport`."""

    def __init__(self, job_id: str | None = None):
        self.job_id = job_id
        self.dataset: DatasetSpec | None = None
        self.writer_epoch = 0
        self.last_seq = 0
        self.finished = False
        self.events = self.applied = self.fenced = self.duplicate_seqs = self.rewinds = 0
        self.seq_gaps: list[tuple[int, int]] = []
        self._pass: _Pass | None = None
        self._completed: dict[int, _Pass] = {}
        self._abandoned: dict[int, _Pass] = {}
        self._passes: Counter[int] = Counter()
        self._epoch_rewinds: Counter[int] = Counter()
        self._seen: dict[tuple[int, int], ShardLogEvent] = {}
        self._log_violations: list[str] = []
        self._epoch_violations: dict[int, list[str]] = {}
        self.from_snapshot_seq: int | None = None

    @classmethod
    def from_snapshot(cls, snapshot: ShardSnapshot) -> Auditor:
        """An auditor that starts where ``snapshot`` stands, for a log whose beginning is gone.

        That happens after the bus was reset (the sharder re-publishes its
        state as a snapshot into the empty bus) or when retention deleted old
        log segments. What the snapshot says is taken as given: its DONE
        shards count as done once in the pass in progress; only the events
        after it are checked, so the report covers the work done after it.
        """
        auditor = cls(snapshot.job_id)
        auditor.dataset, auditor.writer_epoch = snapshot.dataset, snapshot.writer_epoch
        auditor.from_snapshot_seq = auditor.last_seq = snapshot.seq
        auditor._open(snapshot.epoch, snapshot.epoch_opened_seq)
        shards = auditor._pass.shards
        for entry in snapshot.shards:
            if not 0 <= entry.shard_id < len(shards):
                auditor._log_violation(
                    f"snapshot at seq {snapshot.seq}: unknown shard {entry.shard_id}"
                )
                continue
            shard = shards[entry.shard_id]
            shard.state, shard.reason = entry.state, entry.reason
            shard.holder = shard.last_holder = (
                entry.worker_id if entry.state is ShardState.DOING else None
            )
            shard.done_seq = entry.done_seq if entry.state is ShardState.DONE else None
            shard.applied = {
                sample: [group.seq] for group in entry.applied for sample in group.samples
            }
        if snapshot.finished:
            auditor._pass.closed, auditor.finished = True, True
            auditor._completed[snapshot.epoch] = auditor._pass
        return auditor

    # ------------------------------------------------------------ feeding

    def feed(self, event: ShardLogEvent) -> None:
        """Audit one event (in log order)."""
        self.events += 1
        if not self._same_job(event) or not self._accept(event):
            return
        self.applied += 1
        self._seen[(event.writer_epoch, event.seq)] = event
        _HANDLERS[event.transition](self, event)

    def _same_job(self, event: ShardLogEvent) -> bool:
        if self.job_id is None:
            self.job_id = event.job_id
        if event.job_id != self.job_id:
            self._log_violation(
                f"seq {event.seq}: event of job {event.job_id} in the log of job {self.job_id}"
            )
            return False
        return True

    def _accept(self, event: ShardLogEvent) -> bool:
        """Fencing and sequencing, as the protocol defines them."""
        if event.transition is T.WRITER_ELECTED and event.writer_epoch > self.writer_epoch:
            self.writer_epoch = event.writer_epoch
            self._check_gap(event)
            self.last_seq = event.seq
            return True
        if event.writer_epoch != self.writer_epoch or event.transition is T.WRITER_ELECTED:
            self.fenced += 1
            if event.writer_epoch > self.writer_epoch:
                self._log_violation(
                    f"seq {event.seq}: {event.transition.value} "
                    f"from writer epoch {event.writer_epoch}, "
                    f"which was never elected (current {self.writer_epoch})"
                )
            return False
        if event.seq <= self.last_seq:
            self._duplicate_seq(event)
            return False
        self._check_gap(event)
        self.last_seq = event.seq
        return True

    def _check_gap(self, event: ShardLogEvent) -> None:
        if event.seq > self.last_seq + 1:
            missing = (self.last_seq + 1, event.seq - 1)
            self.seq_gaps.append(missing)
            self._log_violation(f"seqs {missing[0]}..{missing[1]} are missing: events were lost")

    def _duplicate_seq(self, event: ShardLogEvent) -> None:
        """A redelivered event is harmless; a different event under the same seq is a conflicting
        write."""
        self.duplicate_seqs += 1
        first = self._seen.get((event.writer_epoch, event.seq))
        if first is not None and first.model_dump() != event.model_dump():
            self._log_violation(
                f"seq {event.seq}: two different events "
                f"({first.transition.value}, {event.transition.value}) "
                f"from writer epoch {event.writer_epoch}"
            )

    # ------------------------------------------------------------ violations

    def _log_violation(self, text: str) -> None:
        self._log_violations.append(text)

    def _violation(self, epoch: int, text: str) -> None:
        self._epoch_violations.setdefault(epoch, []).append(f"epoch {epoch}: {text}")

    # ------------------------------------------------------------ passes

    def _open(self, epoch: int, seq: int, done: Iterable[int] = (), partial: Iterable = ()) -> None:
        self.finished = False
        self._passes[epoch] += 1
        shards = [_Shard(start, length) for start, length in shard_ranges(self.dataset)]
        for shard_id in done:
            if 0 <= shard_id < len(shards):
                shards[shard_id].state, shards[shard_id].done_seq = ShardState.DONE, seq
                shards[shard_id].apply_all(seq)
            else:
                self._violation(
                    epoch, f"seq {seq}: rewind restores unknown shard {shard_id} as DONE"
                )
        for commit in partial:
            if 0 <= commit.shard_id < len(shards):
                shards[commit.shard_id].applied.update({sample: [seq] for sample in commit.samples})
            else:
                self._violation(
                    epoch, f"seq {seq}: rewind restores samples of unknown shard {commit.shard_id}"
                )
        self._pass = _Pass(epoch, seq, shards)

    def _abandon_open_pass(self) -> None:
        if self._pass is not None and not self._pass.closed:
            self._abandoned[self._pass.epoch] = self._pass

    def _shard_of(
        self, event: ShardLogEvent, shard_id: int | None = None
    ) -> tuple[_Pass, _Shard] | None:
        """The shard a shard transition (or one commit of an APPLIED) is about, if that makes sense
        right now."""
        current = self._pass
        shard_id = event.shard_id if shard_id is None else shard_id
        what = f"seq {event.seq}: {event.transition.value}"
        if current is None or current.closed:
            self._violation(event.epoch, f"{what} while no epoch is open")
            return None
        if event.epoch != current.epoch:
            self._violation(
                event.epoch, f"{what} for epoch {event.epoch} while epoch {current.epoch} is open"
            )
            return None
        if shard_id is None or shard_id >= len(current.shards):
            self._violation(current.epoch, f"{what} of unknown shard {shard_id}")
            return None
        return current, current.shards[shard_id]

    def _must_be_doing(self, event: ShardLogEvent, shard: _Shard) -> None:
        if shard.state is not ShardState.DOING:
            self._violation(
                event.epoch,
                f"seq {event.seq}: {event.transition.value} of shard {event.shard_id}, "
                f"which is {shard.state.value}",
            )

    @staticmethod
    def _to_todo(shard: _Shard) -> None:
        shard.state, shard.holder, shard.done_seq, shard.done_by = ShardState.TODO, None, None, None

    # ------------------------------------------------------------ handlers

    def _ignore(self, event: ShardLogEvent) -> None:
        """Transitions that do not move shards (elections, leases, quotas, checkpoints)."""

    def _dataset_defined(self, event: ShardLogEvent) -> None:
        if self.dataset is not None and self.dataset != event.dataset:
            self._log_violation(
                f"seq {event.seq}: dataset redefined from {self.dataset!r} to {event.dataset!r}"
            )
            return
        self.dataset = event.dataset

    def _epoch_opened(self, event: ShardLogEvent) -> None:
        if self.dataset is None:
            self._log_violation(
                f"seq {event.seq}: epoch {event.epoch} opened before the dataset was defined"
            )
            return
        current = self._pass
        expected = 0 if current is None else current.epoch + 1
        if current is not None and not current.closed:
            self._violation(
                current.epoch,
                f"seq {event.seq}: epoch {event.epoch} opened "
                f"while epoch {current.epoch} is still open",
            )
            self._abandon_open_pass()
        if event.epoch != expected or event.epoch >= self.dataset.epochs:
            self._violation(
                event.epoch,
                f"seq {event.seq}: opened out of order "
                f"(expected epoch {expected} of {self.dataset.epochs})",
            )
        self._open(event.epoch, event.seq)

    def _granted(self, event: ShardLogEvent) -> None:
        found = self._shard_of(event)
        if found is None:
            return
        _, shard = found
        if shard.state is not ShardState.TODO:
            self._violation(
                event.epoch,
                f"seq {event.seq}: shard {event.shard_id} granted to {event.worker_id} "
                f"while {shard.state.value}" + (f" by {shard.holder}" if shard.holder else ""),
            )
        shard.state, shard.holder, shard.last_holder = (
            ShardState.DOING,
            event.worker_id,
            event.worker_id,
        )
        shard.done_seq = shard.done_by = None

    def _applied(self, event: ShardLogEvent) -> None:
        for commit in event.commits:
            found = self._shard_of(event, commit.shard_id)
            if found is None:
                continue
            current, shard = found
            holder = commit.holder or event.worker_id
            if not held_by_worker(holder, event.worker_id):
                current.pooled += len(commit.samples)
            holds = shard.state is ShardState.DOING and shard.holder == holder
            late = shard.state is ShardState.TODO and shard.last_holder == holder
            if not (holds or late):
                held = f"held by {shard.holder}" if shard.holder else shard.state.value.lower()
                self._violation(
                    event.epoch,
                    f"seq {event.seq}: samples of shard {commit.shard_id} applied under "
                    f"{holder}'s grant, which it did not have ({held})",
                )
            outside = [
                s for s in commit.samples if not shard.start <= s < shard.start + shard.length
            ]
            if outside:
                self._violation(
                    event.epoch,
                    f"seq {event.seq}: samples {outside[:5]} are not in shard {commit.shard_id}",
                )
            for sample in commit.samples:
                seqs = shard.applied.setdefault(sample, [])
                seqs.append(event.seq)
                if len(seqs) == 2:
                    current.applied_twice.add(sample)
                    self._violation(
                        event.epoch,
                        f"sample {sample} applied twice in one pass "
                        f"(seq {seqs[0]} and seq {event.seq})",
                    )

    def _done(self, event: ShardLogEvent) -> None:
        found = self._shard_of(event)
        if found is None:
            return
        current, shard = found
        worker, shard_id = event.worker_id, event.shard_id
        if shard.state is not ShardState.DONE and shard.unapplied():
            self._violation(
                event.epoch,
                f"seq {event.seq}: shard {shard_id} DONE with {shard.unapplied()} of its "
                f"{shard.length} samples never applied",
            )
        if shard.state is ShardState.DONE:
            current.duplicate_done.add(shard_id)
            first = (
                f"seq {shard.done_seq} by {shard.done_by}"
                if shard.done_by
                else f"restored at seq {shard.done_seq}"
            )
            self._violation(
                event.epoch,
                f"shard {shard_id} DONE twice in one pass ({first}, seq {event.seq} by {worker})",
            )
            return
        holds = shard.state is ShardState.DOING and shard.holder == worker
        late = (
            shard.state is ShardState.TODO
            and shard.last_holder is not None
            and shard.last_holder == worker
        )
        if not (holds or late):
            current.not_holder_done.add(shard_id)
            holder = f"held by {shard.holder}" if shard.holder else shard.state.value.lower()
            self._violation(
                event.epoch,
                f"seq {event.seq}: shard {shard_id} DONE credited to {worker}, "
                f"who did not hold it ({holder})",
            )
        shard.state, shard.holder, shard.done_seq, shard.done_by = (
            ShardState.DONE,
            None,
            event.seq,
            worker,
        )

    def _failed(self, event: ShardLogEvent) -> None:
        found = self._shard_of(event)
        if found is None:
            return
        current, shard = found
        self._must_be_doing(event, shard)
        current.retries += 1
        self._to_todo(shard)

    def _quarantined(self, event: ShardLogEvent) -> None:
        found = self._shard_of(event)
        if found is None:
            return
        _, shard = found
        self._must_be_doing(event, shard)
        shard.state, shard.holder, shard.reason = (
            ShardState.QUARANTINED,
            None,
            event.reason or "quarantined",
        )

    def _lease_expired(self, event: ShardLogEvent) -> None:
        current = self._back_to_todo(event)
        if current is not None:
            current.leases_expired += 1

    def _given_back(self, event: ShardLogEvent) -> None:
        current = self._back_to_todo(event)
        if current is not None:
            current.given_back += 1

    def _back_to_todo(self, event: ShardLogEvent) -> _Pass | None:
        """The event's held shard back to TODO; the pass it is in (None: no such shard now)."""
        found = self._shard_of(event)
        if found is None:
            return None
        current, shard = found
        self._must_be_doing(event, shard)
        self._to_todo(shard)
        return current

    def _released(self, event: ShardLogEvent) -> None:
        current = self._pass
        if current is None or current.closed:
            return
        for shard in current.shards:
            if shard.state is ShardState.DOING and shard.holder == event.worker_id:
                current.released += 1
                self._to_todo(shard)

    def _epoch_closed(self, event: ShardLogEvent) -> None:
        current = self._pass
        if current is None or current.closed or current.epoch != event.epoch:
            state = (
                "no epoch"
                if current is None
                else f"epoch {current.epoch} ({'closed' if current.closed else 'open'})"
            )
            self._violation(event.epoch, f"seq {event.seq}: closed while {state} was current")
            return
        gaps = current.gaps()
        if gaps:
            samples = sum(end - start for start, end in gaps)
            self._violation(
                event.epoch,
                f"seq {event.seq}: closed with {samples} samples neither DONE nor QUARANTINED: "
                f"{_ranges_text(gaps)}",
            )
        current.closed = True
        self._completed[current.epoch] = current
        self.finished = event.epoch >= self.dataset.epochs - 1

    def _rewound(self, event: ShardLogEvent) -> None:
        self.rewinds += 1
        self._epoch_rewinds[event.epoch] += 1
        current = self._pass
        if (
            current is not None
            and event.epoch == current.epoch
            and event.version >= current.opened_seq
        ):
            self._rewind_within(current, event.version)
        elif self.dataset is None:
            self._log_violation(f"seq {event.seq}: rewind before the dataset was defined")
        else:
            self._abandon_open_pass()
            self._open(event.epoch, event.seq, done=event.shard_ids, partial=event.commits)

    def _rewind_within(self, current: _Pass, version: int) -> None:
        """Work after the version is undone; in-flight and reclaimed work is void (the model lost
        it)."""
        if current.closed:  # the last epoch, reopened: its completed pass stays on record
            current = copy.deepcopy(current)
            current.closed = False
            self._pass = current
        self.finished = False
        for shard in current.shards:
            shard.applied = {
                sample: kept
                for sample, seqs in shard.applied.items()
                if (kept := [s for s in seqs if s <= version])
            }
            redo = shard.state is ShardState.DOING or (
                shard.state is ShardState.DONE and shard.done_seq > version
            )
            if redo and shard.unapplied():  # a DONE shard the restored model holds stays DONE
                self._to_todo(shard)
            if shard.state is not ShardState.DONE:
                shard.last_holder = None

    # ------------------------------------------------------------ the report

    def report(self, allow_quarantine: bool = False) -> AuditReport:
        """The report as of the events fed so far."""
        log_violations = list(self._log_violations)
        if self.events and self.dataset is None:
            log_violations.append("no DATASET_DEFINED event: nothing can be proved")
        for epoch, found in sorted(self._epoch_violations.items()):
            if epoch not in self._passes:  # about an epoch that was never opened
                log_violations.extend(found)
        epochs = [self._epoch_audit(epoch, allow_quarantine) for epoch in sorted(self._passes)]
        return AuditReport(
            job_id=self.job_id,
            dataset=self.dataset,
            finished=self.finished,
            events=self.events,
            applied=self.applied,
            fenced=self.fenced,
            duplicate_seqs=self.duplicate_seqs,
            seq_gaps=list(self.seq_gaps),
            rewinds=self.rewinds,
            writer_epoch=self.writer_epoch,
            last_seq=self.last_seq,
            epochs=epochs,
            log_violations=log_violations,
            allow_quarantine=allow_quarantine,
            from_snapshot_seq=self.from_snapshot_seq,
        )

    def _reported_pass(self, epoch: int) -> tuple[_Pass, EpochStatus]:
        current = self._pass
        if current is not None and current.epoch == epoch and not current.closed:
            return current, EpochStatus.IN_PROGRESS
        if epoch in self._completed:
            return self._completed[epoch], EpochStatus.COMPLETE
        return self._abandoned[epoch], EpochStatus.REWOUND

    def _epoch_audit(self, epoch: int, allow_quarantine: bool) -> EpochAudit:
        chosen, status = self._reported_pass(epoch)
        done = [s for s in chosen.shards if s.state is ShardState.DONE]
        once = [
            s
            for i, s in enumerate(chosen.shards)
            if s.state is ShardState.DONE and i not in chosen.duplicate_done
        ]
        quarantined = {
            i: s.reason for i, s in enumerate(chosen.shards) if s.state is ShardState.QUARANTINED
        }
        violations = list(self._epoch_violations.get(epoch, []))
        if quarantined and not allow_quarantine:
            violations.append(
                f"epoch {epoch}: {len(quarantined)} shard(s) quarantined, their samples untrained: "
                + "; ".join(f"shard {i}: {reason}" for i, reason in sorted(quarantined.items())[:5])
            )
        return EpochAudit(
            epoch=epoch,
            status=status,
            passes=self._passes[epoch],
            rewinds=self._epoch_rewinds[epoch],
            shards=len(chosen.shards),
            samples=sum(s.length for s in chosen.shards),
            shards_done=len(done),
            samples_done_once=sum(s.length for s in once),
            samples_pending=0
            if status is EpochStatus.COMPLETE
            else sum(s.length for s in chosen.shards if s.state not in _SETTLED),
            samples_applied_twice=sum(
                1 for s in chosen.shards for seqs in s.applied.values() if len(seqs) > 1
            ),
            duplicate_done=sorted(chosen.duplicate_done),
            not_holder_done=sorted(chosen.not_holder_done),
            gaps=chosen.gaps() if status is EpochStatus.COMPLETE else [],
            quarantined=quarantined,
            leases_expired=chosen.leases_expired,
            released=chosen.released,
            given_back=chosen.given_back,
            pooled=chosen.pooled,
            retries=chosen.retries,
            violations=violations,
            counts=self._counts(chosen),
        )

    def _counts(self, chosen: _Pass) -> list[int]:
        counts = [0] * (self.dataset.size if self.dataset else 0)
        for shard in chosen.shards:
            for sample, seqs in shard.applied.items():
                if 0 <= sample < len(counts):
                    counts[sample] = len(seqs)
        return counts


_HANDLERS = {
    T.WRITER_ELECTED: Auditor._ignore,
    T.DATASET_DEFINED: Auditor._dataset_defined,
    T.EPOCH_OPENED: Auditor._epoch_opened,
    T.GRANTED: Auditor._granted,
    T.STARTED: Auditor._ignore,
    T.DONE: Auditor._done,
    T.FAILED: Auditor._failed,
    T.QUARANTINED: Auditor._quarantined,
    T.LEASE_EXPIRED: Auditor._lease_expired,
    T.RELEASED: Auditor._released,
    T.LEASE_RENEWED: Auditor._ignore,
    T.QUOTA_SET: Auditor._ignore,
    T.EPOCH_CLOSED: Auditor._epoch_closed,
    T.CHECKPOINT: Auditor._ignore,
    T.REWOUND: Auditor._rewound,
    T.APPLIED: Auditor._applied,
    T.GIVEN_BACK: Auditor._given_back,
}


def audit_log(
    events: Iterable[ShardLogEvent],
    job_id: str | None = None,
    allow_quarantine: bool = False,
    snapshot: ShardSnapshot | None = None,
) -> AuditReport:
    """Audit a job's events, given in log order (``job_id`` defaults to the first event's).

    With ``snapshot``, the audit starts from it (:meth:`Auditor.from_snapshot`).
    """
    auditor = Auditor.from_snapshot(snapshot) if snapshot is not None else Auditor(job_id)
    for event in events:
        auditor.feed(event)
    return auditor.report(allow_quarantine)


def compare_with_ledger(report: AuditReport, ledgers: dict[int, Sequence[int]]) -> list[str]:
    """Where the model's ledger (epoch -> count per sample) and the log's fold disagree, or are not
    all ones.

    Each finding is one line. The ledger counts the updates the model applied
    per sample; the log's counts come from its APPLIED records: for an
    exactly-once epoch both are 1 everywhere.
    """
    findings = []
    for epoch in report.epochs:
        ledger = ledgers.get(epoch.epoch)
        if ledger is None:
            findings.append(f"epoch {epoch.epoch}: no ledger to compare with the log")
            continue
        ledger = [int(c) for c in ledger]
        if len(ledger) != len(epoch.counts):
            findings.append(
                f"epoch {epoch.epoch}: the ledger has {len(ledger)} samples, "
                f"the dataset {len(epoch.counts)}"
            )
            continue
        findings += _not_all_ones(f"epoch {epoch.epoch}: the ledger", ledger)
        differ = [i for i, (log, model) in enumerate(zip(epoch.counts, ledger)) if log != model]
        if differ:
            first = ", ".join(
                f"sample {i}: log {epoch.counts[i]}, ledger {ledger[i]}" for i in differ[:3]
            )
            findings.append(
                f"epoch {epoch.epoch}: the log and the ledger disagree on "
                f"{len(differ)} samples ({first})"
            )
    return findings


def _not_all_ones(what: str, counts: list[int]) -> list[str]:
    zero = [i for i, c in enumerate(counts) if c == 0]
    many = [i for i, c in enumerate(counts) if c > 1]
    found = []
    if zero:
        found.append(f"{what} shows {len(zero)} samples never trained (first: {zero[:5]})")
    if many:
        found.append(f"{what} shows {len(many)} samples trained more than once (first: {many[:5]})")
    return found


@dataclass
class LedgerCheck:
    """The ledger files of a run, and what comparing them with the log found (empty: all ones,
    agreeing)."""

    files: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    compared_epochs: list[int] = field(default_factory=list)
    #: samples the ledgers count zero times (lost) and more than once (duplicated), all epochs
    never_trained: int = 0
    trained_twice: int = 0

    @property
    def ok(self) -> bool:
        return bool(self.files) and not self.findings

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "files": self.files,
            "findings": self.findings,
            "compared_with_log": self.compared_epochs,
            "never_trained": self.never_trained,
            "trained_twice": self.trained_twice,
        }


def check_ledgers(run_dir: Path, report: AuditReport | None) -> LedgerCheck:
    """Every ledger the run wrote (one per parameter-server shard, or rank 0's) all ones and, with a
    log, agreeing with it."""
    from antdt.worker.ledger import (  # torch: only when there are ledgers to read
        FILE_PATTERN,
        read_ledgers,
    )

    check = LedgerCheck()
    owners = sorted(p for p in run_dir.glob("ps-*") if p.is_dir()) or [run_dir]
    for owner in owners:
        ledgers = read_ledgers(owner)
        check.files += [str(owner / FILE_PATTERN.format(epoch=e)) for e in sorted(ledgers)]
        check.never_trained += sum(int((counts == 0).sum()) for counts in ledgers.values())
        check.trained_twice += sum(int((counts > 1).sum()) for counts in ledgers.values())
        where = owner.name if owner != run_dir else "the ledger"
        if report is not None:
            covered = {e.epoch for e in report.epochs}
            check.compared_epochs = sorted(covered & set(ledgers))
            check.findings += [
                f"{where}: {f}"
                for f in compare_with_ledger(
                    report, {e: ledgers[e] for e in covered if e in ledgers}
                )
            ]
            ledgers = {e: v for e, v in ledgers.items() if e not in covered}
        for epoch, counts in sorted(ledgers.items()):
            if not (counts == 1).all():
                check.findings.append(
                    f"{where}: epoch {epoch}: {int((counts == 0).sum())} samples never trained, "
                    f"{int((counts > 1).sum())} trained more than once"
                )
    if not check.files:
        check.findings.append(f"no ledger file under {run_dir}")
    return check


__all__ = [
    "AuditReport",
    "Auditor",
    "EpochAudit",
    "EpochStatus",
    "LedgerCheck",
    "audit_log",
    "check_ledgers",
    "compare_with_ledger",
    "shard_ranges",
]
