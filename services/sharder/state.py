"""The shard state of one job, and the fold that builds it from the log.

State is *only* ever changed by :meth:`JobState.apply` of a
:class:`ShardLogEvent`: the live sharder applies the events it has just
written, a recovering sharder applies the events it reads back, and both run
this same code, so the live state and the fold of the log cannot differ.

Shard state machine (per shard, per epoch)::

               GRANTED(worker, lease, attempt)    APPLIED…, DONE
      TODO ─────────────────────────────────▶ DOING ───────────▶ DONE
       ▲                                      │ │ │
       │ FAILED (attempt+1 < max_attempts)    │ │ │ STARTED / LEASE_RENEWED:
       ├──────────────────────────────────────┘ │ │ stays DOING, lease extended
       │ LEASE_EXPIRED / RELEASED (left, quota 0)│ │
       │ / GIVEN_BACK (none of it read)          │ │
       ├────────────────────────────────────────┘ │ FAILED (attempt+1 >= max_attempts)
       │                                          └──────────────▶ QUARANTINED
       │ REWOUND: DOING, or DONE after the version, with a sample the version lacks ── back to TODO
       │ (a shard whose every sample is in the restored model is DONE)
       │
       └── a late DONE from the last holder of a reclaimed, not yet re-granted
           shard is accepted: TODO ─▶ DONE (nobody else trained it)

* ``attempt`` counts returns to TODO, so (epoch, shard, attempt) names one
  grant; a report about an older attempt is ignored, which makes duplicate
  and late deliveries harmless. An epoch run again after a rewind starts its
  attempts above every earlier grant (``attempt_base``), so the name stays unique.
* Progress is kept per sample: APPLIED records samples whose training update
  is in the model (with the seq that recorded them); a shard is DONE once
  every sample is. A shard that returns to TODO keeps its applied samples,
  so whoever is granted it next reads only the rest; a rewind to a version
  drops exactly the samples recorded after it.
* Epoch end: when no shard is TODO or DOING, EPOCH_CLOSED is written and,
  unless it was the last epoch, EPOCH_OPENED for the next one: every shard
  back to TODO (quarantine included: a new epoch gives a shard a new chance).

Log discipline (fencing): each event carries the writer's epoch and a per-job
sequence number. An event is applied when its writer epoch equals the
current one and its seq is the next; WRITER_ELECTED with a higher epoch is
always applied and makes its writer current (a second election for the same
epoch, a rival that lost the race, is not). Events from a lower writer epoch
(a fenced zombie) and repeated seqs are ignored and counted.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from datetime import UTC, datetime

from antdt.schemas.models import (
    AppliedSamples,
    DatasetSpec,
    ShardLogEvent,
    ShardSnapshot,
    ShardState,
    ShardStateEntry,
    trusted,
)
from antdt.schemas.models import (
    ShardTransition as T,
)
from antdt.services.sharder.applied import Applied
from antdt.services.sharder.shards import grant_ranks, split

_UTC = UTC


def to_ms(value: datetime | None) -> int | None:
    return None if value is None else int(value.timestamp() * 1000)


_LAST_FROM_MS: list = [None, None]


def from_ms(value: int | None) -> datetime | None:
    """Milliseconds to an aware datetime; a batch converts the same 'now' many times, so the last
    one is kept."""
    if value is None:
        return None
    if _LAST_FROM_MS[0] != value:
        _LAST_FROM_MS[0], _LAST_FROM_MS[1] = value, datetime.fromtimestamp(value / 1000, _UTC)
    return _LAST_FROM_MS[1]


@dataclass(slots=True)
class Slot:
    """Mutable state of one shard in the current epoch."""

    shard_id: int
    start: int
    length: int
    state: ShardState = ShardState.TODO
    worker: str | None = None
    lease_ms: int | None = None
    started: bool = False
    attempt: int = 0
    done_seq: int | None = None
    reason: str | None = None
    # sample index -> seq of the APPLIED that recorded it
    applied: Applied = field(init=False)
    #: grants of a lower attempt were taken back by a rewind: the model lost their updates, so their
    #: late commits are void.
    rewound_below: int = 0

    def __post_init__(self) -> None:
        self.applied = Applied(self.start, self.length)

    def remaining(self) -> list[int]:
        """Sample indices of the shard not applied yet."""
        return self.applied.missing()


def slot_tuple(slot: Slot) -> tuple:
    """What a snapshot keeps of a slot, as :class:`Captured` holds it."""
    return (
        slot.shard_id,
        slot.state,
        slot.worker,
        slot.lease_ms,
        slot.started,
        slot.attempt,
        slot.done_seq,
        slot.reason,
        slot.rewound_below,
        slot.applied.copy() if slot.applied else None,
    )


def _update_ids(updates: dict[str, int]) -> dict[int, str]:
    return {seq: update for update, seq in updates.items()}


@dataclass
class FoldStats:
    """What the fold skipped, for audits and metrics."""

    stale_writer: int = 0
    duplicate_seq: int = 0
    seq_gaps: int = 0


@dataclass(frozen=True)
class Captured:
    """A job's state as :meth:`JobState.capture` copied it; turning it into a snapshot is the costly
    part."""

    job_id: str
    seq: int
    writer_epoch: int
    writer: str | None
    dataset: DatasetSpec | None
    epoch: int
    finished: bool
    quotas: dict[str, int]
    epoch_opened_seq: int
    rewinds: dict[str, int]
    attempt_base: int
    attempt_high: int
    updates: dict[str, int]
    slots: list[tuple]

    def to_snapshot(self, now: datetime, log_offset: int | None = None) -> ShardSnapshot:
        by_seq = _update_ids(self.updates)
        entries = [
            trusted(
                ShardStateEntry,
                shard_id=shard_id,
                state=state,
                worker_id=worker,
                # no cache: any thread
                lease_expires=None
                if lease_ms is None
                else datetime.fromtimestamp(lease_ms / 1000, _UTC),
                started=started,
                attempt=attempt,
                done_seq=done_seq,
                reason=reason,
                rewound_below=rewound_below,
                applied=[
                    trusted(AppliedSamples, seq=seq, samples=samples, update_id=by_seq.get(seq))
                    for seq, samples in _groups(applied)
                ],
            )
            for (
                shard_id,
                state,
                worker,
                lease_ms,
                started,
                attempt,
                done_seq,
                reason,
                rewound_below,
                applied,
            ) in self.slots
        ]
        return ShardSnapshot(
            job_id=self.job_id,
            seq=self.seq,
            writer_epoch=self.writer_epoch,
            writer=self.writer,
            dataset=self.dataset,
            epoch=self.epoch,
            finished=self.finished,
            shards=entries,
            quotas=self.quotas,
            epoch_opened_seq=self.epoch_opened_seq,
            rewinds=self.rewinds,
            attempt_base=self.attempt_base,
            attempt_high=self.attempt_high,
            log_offset=log_offset,
            timestamp=now,
        )


def _groups(applied: Applied | None) -> list[tuple[int, list[int]]]:
    """(seq, sorted samples) per APPLIED event, in seq order."""
    return applied.groups() if applied else []


@dataclass
class JobState:
    """Everything the sharder knows about one job; change it only through apply()."""

    job_id: str
    dataset: DatasetSpec | None = None
    epoch: int = 0
    finished: bool = False
    #: The current epoch's EPOCH_CLOSED is in the log (a writer that died before the next
    #: EPOCH_OPENED leaves it so: the next one opens the epoch without closing it again).
    closed: bool = False
    writer_epoch: int = 0
    writer: str | None = None
    last_seq: int = 0
    epoch_opened_seq: int = 0
    slots: list[Slot] = field(default_factory=list)
    held: dict[str, set[int]] = field(default_factory=dict)
    quotas: dict[str, int] = field(default_factory=dict)
    #: The attempt every shard starts an epoch at. A rewind into an earlier epoch raises it past
    #: every attempt granted so far, so (epoch, shard, attempt) names one grant even when an epoch
    #: runs again.
    attempt_base: int = 0
    #: The highest attempt granted so far in the job: what such a rewind must go past.
    attempt_high: int = 0
    todo_count: int = 0
    #: update_id -> seq of its APPLIED, this epoch: a redelivered commit of an update is recognised.
    updates: dict[str, int] = field(default_factory=dict)
    #: rewind request (worker/incarnation/seq) -> seq of its REWOUND: a redelivered request is not
    #: applied again.
    rewinds: dict[str, int] = field(default_factory=dict)
    stats: FoldStats = field(default_factory=FoldStats)
    _ranks: list[int] = field(default_factory=list, repr=False)
    _todo_heap: list[tuple[int, int]] = field(default_factory=list, repr=False)
    #: The slots as the last capture saw them (None: none kept), and the slots changed since.
    _tuples: list[tuple] | None = field(default=None, repr=False, compare=False)
    _dirty: set[int] = field(default_factory=set, repr=False, compare=False)

    # ------------------------------------------------------------ the fold

    def apply(self, event: ShardLogEvent) -> bool:
        """Fold one event in; False if fencing or sequencing rejected it."""
        if not self._accept(event):
            return False
        handler = _HANDLERS[event.transition]
        touched = self._touched(event)
        handler(self, event)
        self._mark_changed(touched)
        self.last_seq = event.seq
        return True

    def _accept(self, event: ShardLogEvent) -> bool:
        if event.writer_epoch > self.writer_epoch and event.transition is T.WRITER_ELECTED:
            self.writer_epoch = event.writer_epoch
            return True
        if event.writer_epoch != self.writer_epoch or event.transition is T.WRITER_ELECTED:
            self.stats.stale_writer += 1  # older writer, or a rival that lost an election race
            return False
        if event.seq <= self.last_seq:
            self.stats.duplicate_seq += 1
            return False
        if event.seq != self.last_seq + 1:
            self.stats.seq_gaps += 1  # lost events: applied anyway, reported by the audit
        return True

    # ------------------------------------------------------------ queries

    @property
    def doing_count(self) -> int:
        return sum(len(shards) for shards in self.held.values())

    def next_todo(
        self, worker: str | None = None, skip: frozenset[int] = frozenset()
    ) -> int | None:
        """The TODO shard to grant ``worker`` next (lowest rank; under static assignment, of its
        own), or None; never one in ``skip``."""
        if self.dataset is not None and self.dataset.owners and worker is not None:
            mine = [
                s.shard_id
                for s in self.slots
                if s.state is ShardState.TODO
                and self.dataset.owner_of(s.shard_id) == worker
                and s.shard_id not in skip
            ]
            return min(mine, key=self._ranks.__getitem__, default=None)
        heap = self._todo_heap
        while heap:
            _, shard_id = heap[0]
            if self.slots[shard_id].state is ShardState.TODO:
                break
            heapq.heappop(heap)
        else:
            return None
        if shard_id not in skip:
            return shard_id
        # rare (an epoch's last shards, given back): the heap is scanned
        rest = [
            entry
            for entry in heap
            if entry[1] not in skip and self.slots[entry[1]].state is ShardState.TODO
        ]
        return min(rest)[1] if rest else None

    def held_by(self, worker: str) -> list[Slot]:
        return [self.slots[i] for i in sorted(self.held.get(worker, ()))]

    def logical_view(self) -> tuple:
        """Everything that defines the state, for equality checks (no caches, no counters); a
        slot as a snapshot keeps it (its samples' range is the dataset's). ``astuple`` here,
        deep-copying every slot's applied samples, took 50 of the 66 s of the sharding property
        test."""
        return (
            self.job_id,
            self.dataset,
            self.epoch,
            self.finished,
            self.writer_epoch,
            self.writer,
            self.last_seq,
            self.epoch_opened_seq,
            tuple(map(slot_tuple, self.slots)),
            {w: frozenset(s) for w, s in self.held.items() if s},
            dict(self.quotas),
            dict(self.updates),
            dict(self.rewinds),
            self.attempt_base,
            self.attempt_high,
        )

    # ------------------------------------------------------------ mutations used by handlers

    def _set_todo(self, slot: Slot, attempt: int) -> None:
        if slot.state is ShardState.DOING:
            self.held[slot.worker].discard(slot.shard_id)
        if slot.state is not ShardState.TODO:
            self.todo_count += 1
            heapq.heappush(self._todo_heap, (self._ranks[slot.shard_id], slot.shard_id))
        slot.state, slot.attempt, slot.lease_ms, slot.started = (
            ShardState.TODO,
            attempt,
            None,
            False,
        )
        slot.done_seq = None

    def _leave_todo(self, slot: Slot) -> None:
        if slot.state is ShardState.TODO:
            self.todo_count -= 1
        elif slot.state is ShardState.DOING:
            self.held[slot.worker].discard(slot.shard_id)

    def _open_epoch(
        self, epoch: int, seq: int, done: set[int] = frozenset(), attempt: int = 0, partial=()
    ) -> None:
        """A fresh pass over the dataset; ``done`` shards and ``partial`` samples (ShardCommits)
        restored as applied at ``seq``."""
        self.epoch, self.epoch_opened_seq, self.finished, self.closed = epoch, seq, False, False
        self._ranks = grant_ranks(self.dataset, epoch)
        self.held, self.updates = {}, {}
        self.slots = [
            Slot(r.shard_id, r.start, r.length, attempt=attempt, rewound_below=attempt)
            for r in split(self.dataset)
        ]
        self._tuples = None
        for shard_id in done:
            slot = self.slots[shard_id]
            slot.state, slot.done_seq = ShardState.DONE, seq
            slot.applied.record_all(seq)
        for commit in partial:
            self.slots[commit.shard_id].applied.record(commit.samples, seq)
        self._todo_heap = [
            (self._ranks[s.shard_id], s.shard_id) for s in self.slots if s.state is ShardState.TODO
        ]
        heapq.heapify(self._todo_heap)
        self.todo_count = len(self._todo_heap)

    # ------------------------------------------------------------ snapshots

    def to_snapshot(self, now: datetime, log_offset: int | None = None) -> ShardSnapshot:
        return self.capture().to_snapshot(now, log_offset)

    def capture(self) -> Captured:
        """A copy of what a snapshot holds, cheap to take, so it can be built elsewhere.

        The slots are kept as tuples between captures and only those the
        events since the last one touched are made again: a capture costs a
        list copy plus the slots that changed, not a pass over every slot.
        """
        if self._tuples is None:
            self._tuples = [slot_tuple(slot) for slot in self.slots]
        else:
            for shard_id in self._dirty:
                self._tuples[shard_id] = slot_tuple(self.slots[shard_id])
        self._dirty = set()
        return Captured(
            self.job_id,
            self.last_seq,
            self.writer_epoch,
            self.writer,
            self.dataset,
            self.epoch,
            self.finished,
            dict(self.quotas),
            self.epoch_opened_seq,
            dict(self.rewinds),
            self.attempt_base,
            self.attempt_high,
            dict(self.updates),
            list(self._tuples),
        )

    def _touched(self, event: ShardLogEvent) -> set[int] | None:
        """The slots ``event`` will change (asked before it is folded in); None: any of them."""
        if event.transition in _ONE_SLOT:
            return {event.shard_id}
        if event.transition in _HELD_SLOTS:
            return set(self.held.get(event.worker_id, ()))
        if event.transition is T.APPLIED:
            return {commit.shard_id for commit in event.commits}
        return set() if event.transition in _NO_SLOT else None

    def _mark_changed(self, touched: set[int] | None) -> None:
        if touched is None:
            self._tuples = None  # the next capture makes every tuple again
        elif self._tuples is not None:
            self._dirty |= touched

    @classmethod
    def from_snapshot(cls, snapshot: ShardSnapshot) -> JobState:
        state = cls(
            snapshot.job_id,
            dataset=snapshot.dataset,
            writer_epoch=snapshot.writer_epoch,
            writer=snapshot.writer,
        )
        state._open_epoch(snapshot.epoch, snapshot.epoch_opened_seq)
        state.finished, state.last_seq, state.quotas = (
            snapshot.finished,
            snapshot.seq,
            dict(snapshot.quotas),
        )
        state.rewinds = dict(snapshot.rewinds)
        state.attempt_base, state.attempt_high = snapshot.attempt_base, snapshot.attempt_high
        for entry in snapshot.shards:
            slot = state.slots[entry.shard_id]
            if entry.state is not ShardState.TODO:
                state._leave_todo(slot)
            slot.state, slot.worker, slot.lease_ms = (
                entry.state,
                entry.worker_id,
                to_ms(entry.lease_expires),
            )
            slot.started, slot.attempt, slot.done_seq, slot.reason = (
                entry.started,
                entry.attempt,
                entry.done_seq,
                entry.reason,
            )
            slot.rewound_below = entry.rewound_below
            for group in entry.applied:
                slot.applied.record(group.samples, group.seq)
            state.updates.update(
                {group.update_id: group.seq for group in entry.applied if group.update_id}
            )
            if entry.state is ShardState.DOING:
                state.held.setdefault(entry.worker_id, set()).add(entry.shard_id)
        return state


# ---------------------------------------------------------------- event handlers


def _writer_elected(state: JobState, event: ShardLogEvent) -> None:
    """The epoch was taken in _accept; remember who holds it (the first election of an epoch
    wins)."""
    state.writer = event.reason


def _dataset_defined(state: JobState, event: ShardLogEvent) -> None:
    state.dataset = event.dataset


def _epoch_opened(state: JobState, event: ShardLogEvent) -> None:
    state._open_epoch(event.epoch, event.seq, attempt=state.attempt_base)


def _granted(state: JobState, event: ShardLogEvent) -> None:
    slot = state.slots[event.shard_id]
    state._leave_todo(slot)
    slot.state, slot.worker, slot.lease_ms = (
        ShardState.DOING,
        event.worker_id,
        to_ms(event.lease_expires),
    )
    slot.started, slot.attempt, slot.reason = False, event.attempt, None
    state.attempt_high = max(state.attempt_high, event.attempt or 0)
    state.held.setdefault(event.worker_id, set()).add(event.shard_id)


def _started(state: JobState, event: ShardLogEvent) -> None:
    slot = state.slots[event.shard_id]
    slot.started = True
    if event.lease_expires is not None:
        slot.lease_ms = to_ms(event.lease_expires)


def _applied(state: JobState, event: ShardLogEvent) -> None:
    """Samples are in the model; the first record of a sample stands (a repeat is the audit's to
    report)."""
    for commit in event.commits:
        state.slots[commit.shard_id].applied.record(commit.samples, event.seq)
    if event.update_id is not None:
        state.updates[event.update_id] = event.seq


def _done(state: JobState, event: ShardLogEvent) -> None:
    slot = state.slots[event.shard_id]
    state._leave_todo(slot)
    slot.state, slot.worker, slot.done_seq = ShardState.DONE, event.worker_id, event.seq
    slot.lease_ms, slot.started = None, False


def _failed(state: JobState, event: ShardLogEvent) -> None:
    slot = state.slots[event.shard_id]
    state._set_todo(slot, event.attempt)
    slot.reason = event.reason


def _quarantined(state: JobState, event: ShardLogEvent) -> None:
    slot = state.slots[event.shard_id]
    state._leave_todo(slot)
    slot.state, slot.attempt, slot.reason, slot.lease_ms, slot.started = (
        ShardState.QUARANTINED,
        event.attempt,
        event.reason,
        None,
        False,
    )


def _back_to_todo(state: JobState, event: ShardLogEvent) -> None:
    """A held shard back to TODO under the event's attempt, its progress kept (its lease ran out,
    or its holder gave it back unread for workers out of data)."""
    state._set_todo(state.slots[event.shard_id], event.attempt)


def _released(state: JobState, event: ShardLogEvent) -> None:
    for shard_id in sorted(state.held.get(event.worker_id, ())):
        slot = state.slots[shard_id]
        state._set_todo(slot, slot.attempt + 1)


def _lease_renewed(state: JobState, event: ShardLogEvent) -> None:
    lease_ms = to_ms(event.lease_expires)
    for shard_id in state.held.get(event.worker_id, ()):
        state.slots[shard_id].lease_ms = lease_ms


def _quota_set(state: JobState, event: ShardLogEvent) -> None:
    state.quotas[event.worker_id] = event.quota


def _epoch_closed(state: JobState, event: ShardLogEvent) -> None:
    state.closed = True
    if event.epoch >= state.dataset.epochs - 1:
        state.finished = True


def _checkpoint(state: JobState, event: ShardLogEvent) -> None:
    """A version was handed out; the state itself does not change."""


def _rewound(state: JobState, event: ShardLogEvent) -> None:
    if event.cause is not None:
        state.rewinds[event.cause] = event.seq
    if event.version >= state.epoch_opened_seq and event.epoch == state.epoch:
        state.updates = {
            update: seq for update, seq in state.updates.items() if seq <= event.version
        }
        for slot in state.slots:
            slot.applied.keep_up_to(event.version)
            redo = slot.state is ShardState.DOING or (
                slot.state is ShardState.DONE and slot.done_seq > event.version
            )
            # a DONE shard whose every sample is in the restored model stays DONE: granted again,
            # nothing would be left to read, so nothing would ever complete it (no DOING shard has
            # every sample applied: its DONE is written with the APPLIED that completes it)
            if redo and not slot.applied.complete:
                state._set_todo(slot, slot.attempt + 1)
            if slot.state is ShardState.TODO:
                # work from before the rewind is not in the model: no late DONE or commit for it
                slot.worker = None
                slot.rewound_below = slot.attempt
        state.finished = state.closed = False
        return
    state.attempt_base = event.attempt or 0
    state._open_epoch(
        event.epoch,
        event.seq,
        done=set(event.shard_ids),
        attempt=state.attempt_base,
        partial=event.commits,
    )


_HANDLERS = {
    T.WRITER_ELECTED: _writer_elected,
    T.DATASET_DEFINED: _dataset_defined,
    T.EPOCH_OPENED: _epoch_opened,
    T.GRANTED: _granted,
    T.STARTED: _started,
    T.DONE: _done,
    T.FAILED: _failed,
    T.QUARANTINED: _quarantined,
    T.LEASE_EXPIRED: _back_to_todo,
    T.RELEASED: _released,
    T.LEASE_RENEWED: _lease_renewed,
    T.QUOTA_SET: _quota_set,
    T.EPOCH_CLOSED: _epoch_closed,
    T.CHECKPOINT: _checkpoint,
    T.REWOUND: _rewound,
    T.APPLIED: _applied,
    T.GIVEN_BACK: _back_to_todo,
}

#: Transitions that change only the slot the event names.
_ONE_SLOT = frozenset(
    {T.GRANTED, T.STARTED, T.DONE, T.FAILED, T.QUARANTINED, T.LEASE_EXPIRED, T.GIVEN_BACK}
)
#: Transitions that change the slots the event's worker holds.
_HELD_SLOTS = frozenset({T.RELEASED, T.LEASE_RENEWED})
#: Transitions that change no slot; any other (a new epoch, a rewind) may change them all.
_NO_SLOT = frozenset({T.WRITER_ELECTED, T.QUOTA_SET, T.EPOCH_CLOSED, T.CHECKPOINT})


def state_at(job_id: str, version: int, events, snapshot=None) -> JobState:
    """The job's state at log seq ``version``: ``snapshot`` (taken at or before it; None: the log
    from its beginning) and the log's events after it, up to the version.

    An event past the version ends the fold unless an older writer wrote it
    (fenced anyway). After a bus reset the log starts after the snapshot the
    sharder re-published, mid-history: without that snapshot the fold would
    begin in the middle of a writer's epoch and take nothing.
    """
    target = JobState.from_snapshot(snapshot) if snapshot is not None else JobState(job_id)
    for event in events:
        if event.job_id != job_id:
            continue
        if event.seq > version and event.writer_epoch >= target.writer_epoch:
            break
        target.apply(event)
    return target


def fold(job_id: str, events, state: JobState | None = None) -> JobState:
    """Apply ``events`` in order to ``state`` (or to an empty state)."""
    state = state or JobState(job_id)
    for event in events:
        if event.job_id == job_id:
            state.apply(event)
    return state
