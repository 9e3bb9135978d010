"""The sharder's decisions: from a worker's report (or the clock) to log events.

Pure: no I/O, time is a parameter. Every decision is expressed as
:class:`ShardLogEvent` s that are applied to the :class:`JobState` at once
(through the same fold a recovering sharder runs) and returned for the
caller to append to the log. Nothing here trusts its input to arrive once or
in time: reports name the grant they are about (epoch, shard, attempt), so a
duplicate, late or stale report changes nothing.

What each report does (the state machine is in :mod:`state`):

* REQUESTED: optionally defines the dataset (first request) and the worker's quota, then grants TODO
  shards, lowest grant rank first, until the worker is reading its quota (held shards it has read to
  the end, ``read_shards``, do not count). Grants listed in ``given_back`` (none of their samples
  read: the worker gives them up for workers out of data at an epoch's end) go back to TODO first
  (GIVEN_BACK), and are not granted to that worker again for ``give_back_hold_s``. A quota of 0
  gives back everything the worker holds (RELEASED, progress kept: a synchronous rank that sits
  steps out drops what it had buffered, and the rest of those shards is granted to others).
  Answers GRANTED (everything it holds, each shard with the samples already applied), WAIT
  (nothing free now, but shards are in flight elsewhere), EPOCH_END (the worker's epoch is over)
  or FINISHED.
* COMMIT: samples whose training update is in the model. Without an ``update_id`` the update is
  already applied (synchronous training): the samples are recorded, whatever the grants say, so the
  log tells the truth (a repeat is the audit's to report), except a grant a REWOUND took back: the
  restored model lost its updates. With one, the update waits at the parameter servers, which apply
  it when they read the APPLIED event: the commit is recorded only if every sample belongs to a
  grant its holder still has (or had, with nobody granted the shard since) and none is applied yet.
  Otherwise nothing is recorded, the answer is REFUSED, and the grants the commit named that are
  still held go back to TODO (their holder drops the update's samples, so the rest of those shards
  is granted again). A shard whose every sample is applied is DONE.
* STARTED / DONE / FAILED: accepted only from the holder of that attempt (DONE also from the last
  holder of a reclaimed shard nobody took since). DONE (a whole-shard commit, for workers that do
  not commit samples) records the shard's remaining samples as applied and is idempotent. FAILED
  returns the shard to TODO, or quarantines it once it has had ``max_attempts`` tries.
* Any report renews the worker's leases when less than half remains.
* CHECKPOINT: issues a version (the seq of a CHECKPOINT event) to store with a model checkpoint.
  REWIND: see :meth:`ShardCore.rewind`.
* The clock: leases that ran out go back to TODO. A worker that left: all its shards go back to
  TODO.
* After each change, if nothing is TODO or DOING, the epoch closes and the next opens (or the job is
  finished).
* A report that no history could make valid (a shard id beyond the dataset, a committed sample
  outside its shard, a rewind before any dataset, a dataset too large to hold, a dataset that
  contradicts the job's) raises :class:`ProgressRejected` before anything changes; the service
  dead-letters it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.errors import AntdtError
from antdt.schemas.models import (
    AssignmentStatus,
    DatasetSpec,
    ProgressKind,
    Shard,
    ShardAssignment,
    ShardCommit,
    ShardLogEvent,
    ShardProgress,
    ShardState,
    trusted,
)
from antdt.schemas.models import (
    ShardTransition as T,
)
from antdt.services.sharder.state import JobState, Slot, from_ms, to_ms


def request_id(report: ShardProgress) -> str:
    """Names one report for good: its worker, the worker's incarnation and the report's seq."""
    return f"{report.worker_id}/{report.incarnation}/{report.seq}"


class ProgressRejected(AntdtError):
    """A report that can never be valid for this job (it goes to the dead-letter topic)."""


@dataclass(frozen=True)
class CoreConfig:
    """Sharder policy knobs that are not part of the dataset definition."""

    default_quota: int = 2
    max_quota: int = 64
    #: A dataset the sharder could not hold, or a lease so long its expiry
    #: cannot be represented, is refused rather than defined.
    max_shards: int = 1_000_000
    max_lease_s: float = 7 * 24 * 3600.0
    #: A shard given back is not granted to the worker that gave it back for this long, so that
    #: the workers out of data, which ask every 20-160 ms, get it first; after it, anyone may.
    give_back_hold_s: float = 1.0


@dataclass
class Outcome:
    """The events a report caused (already applied) and the answer to send, if any."""

    events: list[ShardLogEvent] = field(default_factory=list)
    assignment: ShardAssignment | None = None


class ShardCore:
    """Decides transitions for one job and applies them to its state."""

    def __init__(self, state: JobState, config: CoreConfig | None = None):
        self.state = state
        self.config = config or CoreConfig()
        # shard -> (the worker that gave it back, until when it is not granted to it): a hint for
        # whom to grant, not state (a sharder taking over starts without it)
        self._given_back: dict[int, tuple[str, int]] = {}

    # ------------------------------------------------------------ event creation

    def _emit(
        self, events: list[ShardLogEvent], transition: T, now_ms: int, **fields
    ) -> ShardLogEvent:
        state = self.state
        if state.writer_epoch < 1:
            raise RuntimeError("elect a writer (ShardCore.elect) before making decisions")
        event = trusted(
            ShardLogEvent,
            job_id=state.job_id,
            seq=state.last_seq + 1,
            writer_epoch=state.writer_epoch,
            transition=transition,
            epoch=fields.pop("epoch", state.epoch),
            shard_id=fields.pop("shard_id", None),
            worker_id=fields.pop("worker_id", None),
            attempt=fields.pop("attempt", None),
            lease_expires=from_ms(fields.pop("lease_ms", None)),
            quota=fields.pop("quota", None),
            reason=fields.pop("reason", None),
            dataset=fields.pop("dataset", None),
            version=fields.pop("version", None),
            shard_ids=fields.pop("shard_ids", []),
            commits=fields.pop("commits", []),
            update_id=fields.pop("update_id", None),
            cause=fields.pop("cause", None),
            timestamp=from_ms(now_ms),
        )
        assert not fields, f"unknown event fields {sorted(fields)}"
        applied = state.apply(event)
        assert applied, "the core's own event was rejected by the fold"
        events.append(event)
        return event

    def elect(self, writer_epoch: int, now_ms: int, writer: str) -> ShardLogEvent:
        """Take over the job with a higher writer epoch, applying the election at once.

        For a state that is not backed by a shared log (tests, benchmarks). The
        service instead appends :meth:`election_event` and applies it when it
        reads it back, so that anything a zombie wrote before it is folded in
        the same order as every other reader folds it.
        """
        event = self.election_event(writer_epoch, now_ms, writer)
        self.state.apply(event)
        return event

    def election_event(self, writer_epoch: int, now_ms: int, writer: str) -> ShardLogEvent:
        """The WRITER_ELECTED event that fences every writer with a lower epoch (not applied)."""
        if writer_epoch <= self.state.writer_epoch:
            raise ValueError(
                f"writer epoch {writer_epoch} does not exceed {self.state.writer_epoch}"
            )
        return trusted(
            ShardLogEvent,
            job_id=self.state.job_id,
            seq=self.state.last_seq + 1,
            writer_epoch=writer_epoch,
            transition=T.WRITER_ELECTED,
            epoch=self.state.epoch,
            shard_id=None,
            worker_id=None,
            attempt=None,
            lease_expires=None,
            quota=None,
            reason=f"writer {writer}",
            dataset=None,
            version=None,
            shard_ids=[],
            commits=[],
            update_id=None,
            timestamp=from_ms(now_ms),
        )

    # ------------------------------------------------------------ reports

    def on_progress(self, report: ShardProgress, now_ms: int) -> Outcome:
        """Apply one worker report; return the events and the answer."""
        self._refuse_impossible(report)
        out = Outcome()
        state = self.state
        if report.dataset is not None:
            self._define_dataset(report, now_ms, out)
        if state.dataset is None:
            if report.kind is ProgressKind.REQUESTED:
                out.assignment = self._answer(report, AssignmentStatus.WAIT, now_ms)
            return out
        self._renew_leases(report.worker_id, now_ms, out)
        handler = {
            ProgressKind.REQUESTED: self._requested,
            ProgressKind.STARTED: self._started,
            ProgressKind.DONE: self._done,
            ProgressKind.FAILED: self._failed,
            ProgressKind.CHECKPOINT: self._checkpoint,
            ProgressKind.COMMIT: self._commit,
        }.get(report.kind)
        if handler is None:
            raise ProgressRejected(
                "REWIND needs the log; the service handles it through ShardCore.rewind"
            )
        handler(report, now_ms, out)
        return out

    def _refuse_impossible(self, report: ShardProgress) -> None:
        """ProgressRejected for a report no sequence of events could make valid; nothing is changed.

        Only what can never be right is refused: a shard id beyond the
        dataset, a rewind of a job that has no dataset, a dataset too large
        to hold. A report about a shard the worker no longer holds, from an
        old epoch or attempt, is a normal race and is merely ignored by the
        handlers.
        """
        dataset = self.state.dataset
        if dataset is None and report.kind is ProgressKind.REWIND:
            raise ProgressRejected(
                f"job {self.state.job_id} has no dataset yet: there is nothing to rewind"
            )
        if report.dataset is not None and dataset is None:
            self._refuse_unmanageable(report.dataset)
            dataset = report.dataset  # the report defines it: its shard ids are checked against it
        elif dataset is None:
            return
        for shard_id in [
            report.shard_id,
            *(c.shard_id for c in report.commits),
            *report.read_shards,
            *(ref.shard_id for ref in report.given_back),
        ]:
            if shard_id is not None and shard_id >= dataset.shard_count:
                raise ProgressRejected(
                    f"shard {shard_id} does not exist: "
                    f"job {self.state.job_id} has {dataset.shard_count} shards"
                )
        for commit in report.commits:
            start = commit.shard_id * dataset.shard_size
            end = min(start + dataset.shard_size, dataset.size)
            outside = [s for s in commit.samples if not start <= s < end]
            if outside:
                raise ProgressRejected(
                    f"samples {outside[:5]} are not in shard {commit.shard_id} [{start}, {end})"
                )

    def _refuse_unmanageable(self, dataset: DatasetSpec) -> None:
        if dataset.shard_count > self.config.max_shards:
            raise ProgressRejected(
                f"{dataset.shard_count} shards is more than "
                f"this sharder holds ({self.config.max_shards})"
            )
        if dataset.lease_s > self.config.max_lease_s:
            raise ProgressRejected(
                f"lease_s {dataset.lease_s:g} is longer than {self.config.max_lease_s:g} s"
            )

    def _define_dataset(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        if self.state.dataset is None:
            self._emit(
                out.events,
                T.DATASET_DEFINED,
                now_ms,
                dataset=report.dataset,
                worker_id=report.worker_id,
                epoch=0,
            )
            self._emit(out.events, T.EPOCH_OPENED, now_ms, epoch=0)
        elif report.dataset != self.state.dataset:
            raise ProgressRejected(
                f"job {self.state.job_id} is sharded as {self.state.dataset!r}; "
                f"{report.worker_id} sent {report.dataset!r}"
            )

    def _requested(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        state = self.state
        worker = report.worker_id
        if report.quota is not None and report.quota != state.quotas.get(worker):
            quota = min(report.quota, self.config.max_quota)
            self._emit(out.events, T.QUOTA_SET, now_ms, worker_id=worker, quota=quota)
        if state.quotas.get(worker) == 0:
            out.events += self.worker_left(worker, now_ms, "quota 0: gives back what it holds")
        if state.finished:
            out.assignment = self._answer(report, AssignmentStatus.FINISHED, now_ms)
            return
        if report.epoch < state.epoch:
            out.assignment = self._answer(
                report, AssignmentStatus.EPOCH_END, now_ms, epoch=report.epoch
            )
            return
        if report.epoch == state.epoch:
            self._take_back(report, now_ms, out)
            self._grant_up_to_quota(worker, now_ms, out, read=set(report.read_shards))
        out.assignment = self.assignment_for(worker, now_ms, in_reply_to=report.seq)

    def _grant_up_to_quota(
        self, worker: str, now_ms: int, out: Outcome, read: set[int] = frozenset()
    ) -> None:
        state = self.state
        quota = state.quotas.get(worker, self.config.default_quota)
        lease_ms = now_ms + int(state.dataset.lease_s * 1000)
        while len(state.held.get(worker, set()) - read) < quota:
            shard_id = state.next_todo(worker, skip=self._withheld_from(worker, now_ms))
            if shard_id is None:
                return
            attempt = state.slots[shard_id].attempt
            self._emit(
                out.events,
                T.GRANTED,
                now_ms,
                shard_id=shard_id,
                worker_id=worker,
                attempt=attempt,
                lease_ms=lease_ms,
            )

    def _take_back(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        """GIVEN_BACK for each grant in ``given_back`` the worker holds at that attempt (others
        are a normal race: ignored). Its holder read none of it, so nothing of it can be
        committed under that grant; whoever is granted it next reads what is not applied."""
        state = self.state
        until_ms = now_ms + int(self.config.give_back_hold_s * 1000)
        for ref in report.given_back:
            slot = state.slots[ref.shard_id]
            held = slot.state is ShardState.DOING and slot.worker == report.worker_id
            if not held or slot.attempt != ref.attempt:
                continue
            reason = "given back unread: other workers are out of data"
            self._back_to_todo(out.events, T.GIVEN_BACK, slot, now_ms, reason)
            self._given_back[slot.shard_id] = (report.worker_id, until_ms)

    def _withheld_from(self, worker: str, now_ms: int) -> frozenset[int]:
        """Shards ``worker`` gave back less than ``give_back_hold_s`` ago (expired ones
        forgotten)."""
        if not self._given_back:
            return frozenset()
        self._given_back = {s: h for s, h in self._given_back.items() if h[1] > now_ms}
        return frozenset(s for s, (giver, _) in self._given_back.items() if giver == worker)

    def _holds(self, report: ShardProgress) -> bool:
        """Is the report about the grant the worker holds now?"""
        state = self.state
        if report.epoch != state.epoch or report.shard_id >= len(state.slots):
            return False
        slot = state.slots[report.shard_id]
        same_attempt = report.attempt is None or report.attempt == slot.attempt
        return slot.state is ShardState.DOING and slot.worker == report.worker_id and same_attempt

    def _started(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        if self._holds(report) and not self.state.slots[report.shard_id].started:
            lease_ms = now_ms + int(self.state.dataset.lease_s * 1000)
            self._emit(
                out.events,
                T.STARTED,
                now_ms,
                shard_id=report.shard_id,
                worker_id=report.worker_id,
                attempt=self.state.slots[report.shard_id].attempt,
                lease_ms=lease_ms,
            )

    def _done(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        if self._holds(report) or self._late_done_from_last_holder(report):
            slot = self.state.slots[report.shard_id]
            rest = slot.remaining()
            if rest:
                commit = trusted(
                    ShardCommit,
                    holder=report.worker_id,
                    shard_id=slot.shard_id,
                    attempt=slot.attempt,
                    samples=rest,
                )
                self._emit(
                    out.events, T.APPLIED, now_ms, worker_id=report.worker_id, commits=[commit]
                )
            self._emit_done(slot, report.worker_id, now_ms, out)
            self._close_epoch_if_complete(now_ms, out)

    def _emit_done(self, slot: Slot, worker: str | None, now_ms: int, out: Outcome) -> None:
        self._emit(
            out.events,
            T.DONE,
            now_ms,
            shard_id=slot.shard_id,
            worker_id=worker,
            attempt=slot.attempt,
        )

    def _done_if_complete(
        self, slots: list[Slot], worker: str | None, now_ms: int, out: Outcome
    ) -> None:
        """DONE for each of ``slots`` still TODO or DOING with every sample applied, credited to
        its holder (else ``worker``)."""
        for slot in slots:
            if slot.state in (ShardState.DOING, ShardState.TODO) and slot.applied.complete:
                self._emit_done(slot, slot.worker or worker, now_ms, out)

    # ------------------------------------------------------------ commits

    def _commit(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        state = self.state
        if report.update_id is None:
            self._record_applied(
                report, self._not_applied_yet(self._still_in_model(report.commits)), now_ms, out
            )
            return
        # a redelivery: recorded already
        if report.update_id in state.updates and report.epoch == state.epoch:
            out.assignment = self.assignment_for(report.worker_id, now_ms, in_reply_to=report.seq)
            return
        refusal = self._refusal(report)
        if refusal is not None:
            self._return_current_grants(report, refusal, now_ms, out)
            out.assignment = self._answer(report, AssignmentStatus.REFUSED, now_ms, reason=refusal)
            return
        self._record_applied(report, report.commits, now_ms, out)
        if state.finished:
            out.assignment = self._answer(report, AssignmentStatus.FINISHED, now_ms)
        else:
            out.assignment = self.assignment_for(report.worker_id, now_ms, in_reply_to=report.seq)

    def _grant_of(self, report: ShardProgress, commit: ShardCommit) -> str | None:
        """How the commit's grant stands: "held", "late" (reclaimed, nobody granted it since), or
        None (gone)."""
        state = self.state
        if report.epoch != state.epoch:
            return None
        slot = state.slots[commit.shard_id]
        holder = commit.holder or report.worker_id
        if (
            slot.state is ShardState.DOING
            and slot.worker == holder
            and slot.attempt == commit.attempt
        ):
            return "held"
        if (
            slot.state is ShardState.TODO
            and slot.worker == holder
            and slot.attempt == commit.attempt + 1
        ):
            return "late"
        return None

    def _refusal(self, report: ShardProgress) -> str | None:
        """Why an update cannot be committed (its samples must then stay out of the model), or
        None."""
        for commit in report.commits:
            grant = self._grant_of(report, commit)
            if grant is None:
                return (
                    f"shard {commit.shard_id} attempt {commit.attempt} "
                    f"of epoch {report.epoch} is no longer "
                    f"held by {commit.holder or report.worker_id}"
                )
            applied = self.state.slots[commit.shard_id].applied
            again = [s for s in commit.samples if s in applied]
            if again or len(set(commit.samples)) != len(commit.samples):
                return (
                    f"samples {sorted(set(again))[:5] or commit.samples[:5]} "
                    f"of shard {commit.shard_id} are already in the model"
                )
        return None

    def _return_current_grants(
        self, report: ShardProgress, refusal: str, now_ms: int, out: Outcome
    ) -> None:
        """The holder drops a refused update's samples: the grants it still has go back to TODO,
        progress kept."""
        for commit in report.commits:
            if self._grant_of(report, commit) == "held":
                slot = self.state.slots[commit.shard_id]
                self._emit(
                    out.events,
                    T.FAILED,
                    now_ms,
                    shard_id=slot.shard_id,
                    worker_id=slot.worker,
                    attempt=slot.attempt + 1,
                    reason=f"commit refused: {refusal}"[:1000],
                )

    def _still_in_model(self, commits: list[ShardCommit]) -> list[ShardCommit]:
        """The commits less those of grants a rewind took back: the restored model does not hold
        their updates."""
        return [c for c in commits if c.attempt >= self.state.slots[c.shard_id].rewound_below]

    def _not_applied_yet(self, commits: list[ShardCommit]) -> list[ShardCommit]:
        """The commits less their samples already recorded (input is at-least-once: a report may
        come twice).

        A sample trained twice for real is thereby recorded once too: the
        model's ledger, which counts every update it applies, shows it.
        """
        fresh = []
        for commit in commits:
            applied = self.state.slots[commit.shard_id].applied
            samples = [s for s in dict.fromkeys(commit.samples) if s not in applied]
            if samples:
                fresh.append(commit.model_copy(update={"samples": samples}))
        return fresh

    def _record_applied(
        self, report: ShardProgress, commits: list[ShardCommit], now_ms: int, out: Outcome
    ) -> None:
        """APPLIED for the commits, then DONE for every shard they complete."""
        if not commits or report.epoch != self.state.epoch or self.state.finished:
            # nothing new, or an epoch that is over (all its samples are applied; the ledger shows
            # any repeat)
            return
        named = [
            c if c.holder else c.model_copy(update={"holder": report.worker_id}) for c in commits
        ]
        self._emit(
            out.events,
            T.APPLIED,
            now_ms,
            worker_id=report.worker_id,
            commits=named,
            update_id=report.update_id,
        )
        touched = [self.state.slots[i] for i in sorted({c.shard_id for c in commits})]
        self._done_if_complete(touched, report.worker_id, now_ms, out)
        self._close_epoch_if_complete(now_ms, out)

    def complete_applied(self, now_ms: int) -> list[ShardLogEvent]:
        """DONE for every TODO or DOING shard whose every sample is applied.

        The DONE is written right after the APPLIED that completes a shard; a
        writer that died between the two leaves such a shard behind, and nothing
        else would complete it: no sample of it is left to train, so no commit
        comes, and its holder (or whoever is granted it next, with nothing to
        read) holds it forever. A new writer calls this once it has taken over.
        """
        state = self.state
        out = Outcome()
        if state.dataset is None or state.finished:
            return out.events
        self._done_if_complete(state.slots, None, now_ms, out)
        self._close_epoch_if_complete(now_ms, out)
        return out.events

    def _late_done_from_last_holder(self, report: ShardProgress) -> bool:
        """A reclaimed shard nobody took since: its last holder's DONE is still good work."""
        state = self.state
        if report.epoch != state.epoch or report.shard_id >= len(state.slots):
            return False
        slot = state.slots[report.shard_id]
        previous_attempt = report.attempt is None or report.attempt == slot.attempt - 1
        return (
            slot.state is ShardState.TODO and slot.worker == report.worker_id and previous_attempt
        )

    def _failed(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        if not self._holds(report):
            return
        slot = self.state.slots[report.shard_id]
        attempt = slot.attempt + 1
        reason = (report.error or "failed")[:1000]
        if attempt - self.state.attempt_base >= self.state.dataset.max_attempts:
            self._emit(
                out.events,
                T.QUARANTINED,
                now_ms,
                shard_id=slot.shard_id,
                worker_id=report.worker_id,
                attempt=attempt,
                reason=f"failed {attempt} times; last: {reason}",
            )
            self._close_epoch_if_complete(now_ms, out)
        else:
            self._emit(
                out.events,
                T.FAILED,
                now_ms,
                shard_id=slot.shard_id,
                worker_id=report.worker_id,
                attempt=attempt,
                reason=reason,
            )

    def _checkpoint(self, report: ShardProgress, now_ms: int, out: Outcome) -> None:
        event = self._emit(
            out.events,
            T.CHECKPOINT,
            now_ms,
            worker_id=report.worker_id,
            reason=f"checkpoint at step {report.step}" if report.step is not None else "checkpoint",
        )
        out.assignment = self.assignment_for(
            report.worker_id, now_ms, in_reply_to=report.seq, version=event.seq
        )

    def _renew_leases(self, worker: str, now_ms: int, out: Outcome) -> None:
        held = self.state.held.get(worker)
        if not held:
            return
        lease_ms = int(self.state.dataset.lease_s * 1000)
        soonest = min(self.state.slots[i].lease_ms or 0 for i in held)
        if soonest - now_ms < lease_ms // 2:
            self._emit(
                out.events, T.LEASE_RENEWED, now_ms, worker_id=worker, lease_ms=now_ms + lease_ms
            )

    # ------------------------------------------------------------ the clock and departures

    def expire_leases(self, now_ms: int) -> list[ShardLogEvent]:
        """Reclaim every shard whose lease ran out."""
        out = Outcome()
        state = self.state
        expired = [
            state.slots[i]
            for shards in state.held.values()
            for i in shards
            if state.slots[i].lease_ms is not None and state.slots[i].lease_ms <= now_ms
        ]
        for slot in sorted(expired, key=lambda s: s.shard_id):
            self._back_to_todo(out.events, T.LEASE_EXPIRED, slot, now_ms, "lease expired")
        return out.events

    def _back_to_todo(
        self, events: list[ShardLogEvent], transition: T, slot: Slot, now_ms: int, reason: str
    ) -> None:
        """A held shard back to TODO (``transition``: why), under its next attempt."""
        self._emit(
            events,
            transition,
            now_ms,
            shard_id=slot.shard_id,
            worker_id=slot.worker,
            attempt=slot.attempt + 1,
            reason=reason,
        )

    def worker_left(
        self, worker: str, now_ms: int, reason: str = "worker left"
    ) -> list[ShardLogEvent]:
        """Return every shard the worker holds to TODO."""
        out = Outcome()
        if self.state.held.get(worker):
            self._emit(out.events, T.RELEASED, now_ms, worker_id=worker, reason=reason)
        return out.events

    def rewind(self, report: ShardProgress, now_ms: int, target: JobState | None = None) -> Outcome:
        """Restore the shard state to version ``report.version`` (a model checkpoint's).

        Within the current epoch (version at or after the epoch opened) the
        core needs nothing more: every shard DONE after the version and every
        DOING shard goes back to TODO. Across an epoch boundary the caller
        passes ``target``, the fold of the log up to the version; the event
        then carries the target epoch and the shards DONE in it.
        """
        self._refuse_impossible(report)
        state = self.state
        version = report.version
        if version > state.last_seq or version < 1:
            raise ProgressRejected(f"version {version} does not exist (log is at {state.last_seq})")
        out = Outcome()
        cause = request_id(report)
        # a redelivered request: rewinding again would undo the work done since
        if cause in state.rewinds:
            out.assignment = self.assignment_for(
                report.worker_id, now_ms, in_reply_to=report.seq, version=state.rewinds[cause]
            )
            return out
        if version >= state.epoch_opened_seq:
            self._emit(
                out.events,
                T.REWOUND,
                now_ms,
                version=version,
                worker_id=report.worker_id,
                cause=cause,
            )
        else:
            if target is None:
                raise ValueError(
                    "a rewind across an epoch boundary needs the state folded up to the version"
                )
            if target.last_seq != version or target.dataset is None:
                raise ProgressRejected(
                    f"version {version} is not a state of job {state.job_id} with a dataset "
                    f"(it predates the dataset, or a fenced writer issued it)"
                )
            # a shard whose every sample the version holds is done, DONE yet or not (a parameter
            # server's version is an APPLIED event's seq, the DONEs it completed come after it)
            done = [s.shard_id for s in target.slots if s.applied.complete]
            partial = [
                trusted(
                    ShardCommit,
                    holder=None,
                    shard_id=s.shard_id,
                    attempt=s.attempt,
                    samples=sorted(s.applied),
                )
                for s in target.slots
                if s.applied and not s.applied.complete
            ]
            attempt = 1 + max([state.attempt_high, *(s.attempt for s in state.slots)])
            self._emit(
                out.events,
                T.REWOUND,
                now_ms,
                version=version,
                worker_id=report.worker_id,
                epoch=target.epoch,
                shard_ids=done,
                attempt=attempt,
                commits=partial,
                cause=cause,
            )
        self._close_epoch_if_complete(now_ms, out)
        out.assignment = self.assignment_for(
            report.worker_id, now_ms, in_reply_to=report.seq, version=out.events[0].seq
        )
        return out

    def _close_epoch_if_complete(self, now_ms: int, out: Outcome) -> None:
        state = self.state
        while not state.finished and state.todo_count == 0 and state.doing_count == 0:
            closing = state.epoch
            if not state.closed:  # closed already by a writer that died before opening the next
                self._emit(out.events, T.EPOCH_CLOSED, now_ms, epoch=closing)
            if closing + 1 < state.dataset.epochs:
                self._emit(out.events, T.EPOCH_OPENED, now_ms, epoch=closing + 1)

    # ------------------------------------------------------------ answers

    def assignment_for(
        self, worker: str, now_ms: int, in_reply_to: int | None = None, version: int | None = None
    ) -> ShardAssignment:
        """What the worker holds now, as an assignment."""
        state = self.state
        slots = state.held_by(worker)
        if slots:
            status = AssignmentStatus.GRANTED
        elif state.finished:
            status = AssignmentStatus.FINISHED
        else:
            status = AssignmentStatus.WAIT
        lease = min((s.lease_ms for s in slots if s.lease_ms is not None), default=None)
        return trusted(
            ShardAssignment,
            job_id=state.job_id,
            worker_id=worker,
            seq=state.last_seq,
            writer_epoch=state.writer_epoch,
            epoch=state.epoch,
            status=status,
            shards=[
                trusted(
                    Shard,
                    shard_id=s.shard_id,
                    start=s.start,
                    length=s.length,
                    attempt=s.attempt,
                    done=sorted(s.applied),
                )
                for s in slots
            ],
            lease_expires=from_ms(lease),
            quota=state.quotas.get(worker, self.config.default_quota),
            in_reply_to=in_reply_to,
            version=version,
            reason=None,
            timestamp=from_ms(now_ms),
        )

    def refusal(self, report: ShardProgress, now_ms: int, reason: str) -> ShardAssignment:
        """The answer to a rejected report that someone waits for (a REWIND): REFUSED, why."""
        return self._answer(report, AssignmentStatus.REFUSED, now_ms, reason=reason)

    def _answer(
        self,
        report: ShardProgress,
        status: AssignmentStatus,
        now_ms: int,
        epoch: int | None = None,
        reason: str | None = None,
    ) -> ShardAssignment:
        state = self.state
        return trusted(
            ShardAssignment,
            job_id=state.job_id,
            worker_id=report.worker_id,
            seq=state.last_seq,
            writer_epoch=state.writer_epoch,
            epoch=state.epoch if epoch is None else epoch,
            status=status,
            shards=[],
            lease_expires=None,
            quota=state.quotas.get(report.worker_id, self.config.default_quota),
            in_reply_to=report.seq,
            version=None,
            reason=reason,
            timestamp=from_ms(now_ms),
        )


__all__ = ["CoreConfig", "Outcome", "ProgressRejected", "ShardCore", "to_ms"]
