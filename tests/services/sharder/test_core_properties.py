"""Property: whatever the interleaving, every epoch ends with every sample applied exactly once.

Hypothesis drives a job through random interleavings of requests, starts,
sample commits (parameter-server updates that may be refused, and
synchronous ones already applied), whole-shard completions, failures, grants
given back, lease expiry, worker death, quota changes, checkpoints and rewinds, and duplicate
or stale deliveries of earlier reports, then lets the surviving workers
finish. The independent audit must then find every sample applied exactly
once per epoch, a refused update must have recorded nothing, the fold of
the log must equal the live state at every sequence number, and a snapshot's
capture must hold every slot as it is. The sharder may die with its last
events unwritten, and a new writer takes over from the log.
"""

from __future__ import annotations

import itertools
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from antdt.schemas.models import AssignmentStatus, GrantRef, ShardCommit, ShardState
from antdt.schemas.models import ProgressKind as K
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.audit import audit_log
from antdt.services.sharder.core import ShardCore
from antdt.services.sharder.shards import split
from antdt.services.sharder.state import fold, slot_tuple
from tests.services.sharder.helpers import JOB, dataset, new_core, report

WORKERS = ["w0", "w1", "w2", "w3"]
#: Rounds of requests the survivors get to finish the job: far more than any drawn job needs, and
#: a job that never finishes fails in seconds, not minutes.
DRAIN_ROUNDS = 300


class ShardingMachine(RuleBasedStateMachine):
    @initialize(
        size=st.integers(1, 60),
        shard_size=st.integers(1, 12),
        epochs=st.integers(1, 3),
        quota=st.integers(1, 3),
    )
    def start(self, size, shard_size, epochs, quota):
        self.spec = dataset(
            size=size, shard_size=shard_size, epochs=epochs, max_attempts=1_000_000, lease_s=5.0
        )
        self.core, self.log = new_core(self.spec, quota=quota)
        self.now = 0
        self.sent = []  # every report delivered, for duplicate delivery
        self.views = {self.core.state.last_seq: self.core.state.logical_view()}
        self.updates = itertools.count()
        self.checkpoints = []  # versions handed out
        self.first_events = len(self.log)  # the election and the dataset's definition
        self.durable = self.first_events  # events up to the last answer sent: never lost

    def deliver(self, message):
        self.sent.append(message)
        outcome = self.core.on_progress(message, self.now)
        self.record(outcome.events)
        if outcome.assignment is not None:
            # the service makes the log durable before it answers: a dying writer never loses
            # what a worker was told (a grant it then trains under, a checkpoint version)
            self.durable = len(self.log)
        return outcome.assignment

    def record(self, events):
        self.log += events
        self.views[self.core.state.last_seq] = self.core.state.logical_view()

    def held(self, worker):
        return self.core.state.held_by(worker)

    @rule(worker=st.sampled_from(WORKERS), quota=st.none() | st.integers(0, 4))
    def request(self, worker, quota):
        self.deliver(report(K.REQUESTED, worker, self.core.state.epoch, self.now, quota=quota))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def start_one(self, worker, data):
        held = self.held(worker)
        if held:
            slot = data.draw(st.sampled_from(held))
            self.deliver(
                report(
                    K.STARTED,
                    worker,
                    self.core.state.epoch,
                    self.now,
                    shard_id=slot.shard_id,
                    attempt=slot.attempt,
                )
            )

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def finish_one(self, worker, data):
        held = self.held(worker)
        if held:
            slot = data.draw(st.sampled_from(held))
            self.deliver(
                report(
                    K.DONE,
                    worker,
                    self.core.state.epoch,
                    self.now,
                    shard_id=slot.shard_id,
                    attempt=slot.attempt,
                )
            )

    @rule(worker=st.sampled_from(WORKERS), data=st.data(), via_update=st.booleans())
    def commit_some(self, worker, data, via_update):
        """A step trains some of a held shard's unapplied samples (in any order) and commits
        them."""
        held = [s for s in self.held(worker) if s.remaining()]
        if not held:
            return
        slot = data.draw(st.sampled_from(held))
        samples = data.draw(st.lists(st.sampled_from(slot.remaining()), min_size=1, unique=True))
        commit = ShardCommit(shard_id=slot.shard_id, attempt=slot.attempt, samples=samples)
        self.commit(worker, [commit], via_update)

    def commit(self, worker, commits, via_update):
        update = f"u{next(self.updates)}" if via_update else None
        before = len(self.log)
        answer = self.deliver(
            report(
                K.COMMIT, worker, self.core.state.epoch, self.now, commits=commits, update_id=update
            )
        )
        if via_update and answer.status is AssignmentStatus.REFUSED:
            recorded = [e for e in self.log[before:] if e.transition in (T.APPLIED, T.DONE)]
            assert not recorded, f"a refused update recorded {recorded}"

    @precondition(lambda self: any(e.transition is T.APPLIED for e in self.log))
    @rule(data=st.data())
    def update_again(self, data):
        """An update naming samples already in the model (a previous incarnation's, say) must be
        refused."""
        applied = data.draw(st.sampled_from([e for e in self.log if e.transition is T.APPLIED]))
        worker = applied.commits[0].holder
        before = len(self.log)
        answer = self.deliver(
            report(
                K.COMMIT,
                worker,
                applied.epoch,
                self.now,
                commits=applied.commits,
                update_id=f"u{next(self.updates)}",
            )
        )
        assert answer.status is AssignmentStatus.REFUSED
        assert not any(e.transition is T.APPLIED for e in self.log[before:])

    @precondition(lambda self: any(e.transition is T.GRANTED for e in self.log))
    @rule(data=st.data())
    def update_on_an_old_grant(self, data):
        """A slow worker's update for a grant it may since have lost: recorded only if the grant
        still stands."""
        grant = data.draw(st.sampled_from([e for e in self.log if e.transition is T.GRANTED]))
        slot = (
            self.core.state.slots[grant.shard_id] if grant.epoch == self.core.state.epoch else None
        )
        if slot is None or not slot.remaining():
            return
        samples = data.draw(st.lists(st.sampled_from(slot.remaining()), min_size=1, unique=True))
        self.commit(
            grant.worker_id,
            [ShardCommit(shard_id=grant.shard_id, attempt=grant.attempt, samples=samples)],
            via_update=True,
        )

    @rule(worker=st.sampled_from(WORKERS))
    def checkpoint(self, worker):
        answer = self.deliver(report(K.CHECKPOINT, worker, self.core.state.epoch, self.now))
        if answer is not None:
            self.checkpoints.append(answer.version)

    @precondition(lambda self: self.checkpoints)
    @rule(data=st.data())
    def rewind(self, data):
        """A model restored from a checkpoint: the shard state goes back to its version."""
        version = data.draw(st.sampled_from(self.checkpoints))
        self.rewind_to(version)

    @precondition(lambda self: any(e.transition is T.APPLIED for e in self.log))
    @rule(data=st.data())
    def rewind_to_a_parameter_servers_version(self, data):
        """A parameter server rolls back to the last update it applied: the version is an APPLIED
        event's seq, which the DONEs it completed follow."""
        applied = [e.seq for e in self.log if e.transition is T.APPLIED]
        self.rewind_to(data.draw(st.sampled_from(applied)))

    def rewind_to(self, version):
        target = fold(JOB, [e for e in self.log if e.seq <= version])
        outcome = self.core.rewind(
            report(K.REWIND, "w0", self.core.state.epoch, self.now, version=version),
            self.now,
            target,
        )
        self.record(outcome.events)

    @rule(lost=st.integers(0, 3))
    def writer_dies(self, lost):
        """The sharder is killed with its last ``lost`` events unwritten (an APPLIED may be in the
        log without the DONE it implied), never those of an answer it sent; a new writer folds the
        log and takes over."""
        del self.log[max(len(self.log) - lost, self.durable) :]
        last_seq = self.log[-1].seq
        self.views = {seq: view for seq, view in self.views.items() if seq <= last_seq}
        self.checkpoints = [version for version in self.checkpoints if version <= last_seq]
        state = fold(JOB, self.log)
        self.core = ShardCore(state, self.core.config)
        self.record([self.core.elect(state.writer_epoch + 1, self.now, "next")])
        self.record(self.core.complete_applied(self.now))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def fail_one(self, worker, data):
        held = self.held(worker)
        if held:
            slot = data.draw(st.sampled_from(held))
            self.deliver(
                report(
                    K.FAILED,
                    worker,
                    self.core.state.epoch,
                    self.now,
                    shard_id=slot.shard_id,
                    attempt=slot.attempt,
                    error="boom",
                )
            )

    @rule(worker=st.sampled_from(WORKERS), data=st.data(), stale=st.booleans())
    def give_back_some(self, worker, data, stale):
        """A worker gives back held grants it read nothing of (possibly naming an attempt it no
        longer holds)."""
        held = self.held(worker)
        if not held:
            return
        slots = data.draw(st.lists(st.sampled_from(held), min_size=1, unique_by=id))
        refs = [
            GrantRef(shard_id=slot.shard_id, attempt=max(0, slot.attempt - stale)) for slot in slots
        ]
        self.deliver(report(K.REQUESTED, worker, self.core.state.epoch, self.now, given_back=refs))

    @rule(seconds=st.integers(1, 8))
    def time_passes(self, seconds):
        self.now += seconds * 1000
        self.record(self.core.expire_leases(self.now))

    @rule(worker=st.sampled_from(WORKERS))
    def worker_dies(self, worker):
        self.record(self.core.worker_left(worker, self.now, "killed"))

    @precondition(lambda self: any(e.transition is T.GRANTED for e in self.log))
    @rule(
        data=st.data(),
        kind=st.sampled_from([K.DONE, K.FAILED, K.STARTED]),
        with_attempt=st.booleans(),
    )
    def report_on_an_old_grant(self, data, kind, with_attempt):
        """A slow worker reports on a grant it may since have lost (expired, released,
        re-granted)."""
        grant = data.draw(st.sampled_from([e for e in self.log if e.transition is T.GRANTED]))
        self.deliver(
            report(
                kind,
                grant.worker_id,
                grant.epoch,
                self.now,
                shard_id=grant.shard_id,
                attempt=grant.attempt if with_attempt else None,
                error="late" if kind is K.FAILED else None,
            )
        )

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def duplicate_delivery(self, data):
        """At-least-once input: an earlier report arrives again, possibly very late."""
        self.deliver(data.draw(st.sampled_from(self.sent)))

    @invariant()
    def a_shard_with_every_sample_applied_is_done(self):
        """Nothing is left to grant of such a shard: granted, it would be held forever (a worker
        reads none of it, so nothing completes it)."""
        for slot in self.core.state.slots:
            if slot.state in (ShardState.TODO, ShardState.DOING):
                assert slot.remaining(), f"shard {slot.shard_id} {slot.state.value}, all applied"

    @invariant()
    def counters_match_the_table(self):
        state = self.core.state
        assert state.todo_count == sum(s.state is ShardState.TODO for s in state.slots)
        assert state.doing_count == sum(s.state is ShardState.DOING for s in state.slots)

    @invariant()
    def a_capture_holds_every_slot_as_it_is_now(self):
        """Captures reuse the tuples of slots no event touched since the last one; none may be
        stale."""
        state = self.core.state
        assert state.capture().slots == [slot_tuple(slot) for slot in state.slots]

    def teardown(self):
        if not hasattr(self, "core"):
            return
        self.drain()
        self.check_exactly_once()
        self.check_replay_equivalence()

    def drain(self):
        """The surviving workers finish the job: each granted shard's remaining samples in one
        update."""
        for _ in range(DRAIN_ROUNDS):
            if self.core.state.finished:
                return
            for worker in WORKERS:
                answer = self.deliver(
                    report(K.REQUESTED, worker, self.core.state.epoch, self.now, quota=2)
                )
                if answer.status is AssignmentStatus.GRANTED:
                    for shard in answer.shards:
                        rest = sorted(
                            set(range(shard.start, shard.start + shard.length)) - set(shard.done)
                        )
                        self.commit(
                            worker,
                            [
                                ShardCommit(
                                    shard_id=shard.shard_id, attempt=shard.attempt, samples=rest
                                )
                            ],
                            via_update=True,
                        )
        raise AssertionError("the job never finished")

    def check_exactly_once(self):
        result = audit_log(self.log)
        assert result.ok and result.finished, result.violations
        assert [e.epoch for e in result.epochs] == list(range(self.spec.epochs))
        for epoch in result.epochs:
            assert epoch.counts == [1] * self.spec.size, (
                f"epoch {epoch.epoch}: applied counts {epoch.counts}"
            )
        if not any(e.transition is T.REWOUND for e in self.log):
            done = Counter((e.epoch, e.shard_id) for e in self.log if e.transition is T.DONE)
            shards = split(self.spec)
            for epoch in range(self.spec.epochs):
                assert [done[(epoch, s.shard_id)] for s in shards] == [1] * len(shards)

    def check_replay_equivalence(self):
        """The fold of the log up to seq N equals the live state as it was at N."""
        state = None
        for event in self.log:
            if event.transition is T.DONE:
                slot = state.slots[event.shard_id]
                assert slot.state in (ShardState.DOING, ShardState.TODO) and not slot.remaining(), (
                    f"shard {event.shard_id} DONE with samples not applied"
                )
            state = fold(JOB, [event], state)
            if event.seq in self.views and event.seq == state.last_seq:
                assert state.logical_view() == self.views[event.seq], (
                    f"fold differs at seq {event.seq}"
                )
        assert state.logical_view() == self.core.state.logical_view()
        assert state.stats.duplicate_seq == state.stats.stale_writer == state.stats.seq_gaps == 0


ShardingMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestShardingProperties = ShardingMachine.TestCase
