"""Property: whatever the interleaving, every epoch ends with every sample DONE exactly once.

Hypothesis drives a job through random interleavings of requests, starts,
completions, failures, lease expiry, worker death, quota changes and
duplicate or stale deliveries of earlier reports, then lets the surviving
workers finish. The log must then prove exactly-once per epoch, and the fold
of the log must equal the live state at every sequence number.
"""

from __future__ import annotations

from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from antdt.schemas.models import AssignmentStatus, ProgressKind as K, ShardState, ShardTransition as T
from antdt.services.sharder.dataset import split
from antdt.services.sharder.state import fold
from tests.services.sharder.helpers import JOB, dataset, new_core, report

WORKERS = ["w0", "w1", "w2", "w3"]


class ShardingMachine(RuleBasedStateMachine):
    @initialize(size=st.integers(1, 60), shard_size=st.integers(1, 12), epochs=st.integers(1, 3), quota=st.integers(1, 3))
    def start(self, size, shard_size, epochs, quota):
        self.spec = dataset(size=size, shard_size=shard_size, epochs=epochs, max_attempts=1_000_000, lease_s=5.0)
        self.core, self.log = new_core(self.spec, quota=quota)
        self.now = 0
        self.sent = []  # every report delivered, for duplicate delivery
        self.views = {self.core.state.last_seq: self.core.state.logical_view()}

    def deliver(self, message):
        self.sent.append(message)
        outcome = self.core.on_progress(message, self.now)
        self.record(outcome.events)
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
            self.deliver(report(K.STARTED, worker, self.core.state.epoch, self.now, shard_id=slot.shard_id, attempt=slot.attempt))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def finish_one(self, worker, data):
        held = self.held(worker)
        if held:
            slot = data.draw(st.sampled_from(held))
            self.deliver(report(K.DONE, worker, self.core.state.epoch, self.now, shard_id=slot.shard_id, attempt=slot.attempt))

    @rule(worker=st.sampled_from(WORKERS), data=st.data())
    def fail_one(self, worker, data):
        held = self.held(worker)
        if held:
            slot = data.draw(st.sampled_from(held))
            self.deliver(report(K.FAILED, worker, self.core.state.epoch, self.now, shard_id=slot.shard_id, attempt=slot.attempt, error="boom"))

    @rule(seconds=st.integers(1, 8))
    def time_passes(self, seconds):
        self.now += seconds * 1000
        self.record(self.core.expire_leases(self.now))

    @rule(worker=st.sampled_from(WORKERS))
    def worker_dies(self, worker):
        self.record(self.core.worker_left(worker, self.now, "killed"))

    @precondition(lambda self: any(e.transition is T.GRANTED for e in self.log))
    @rule(data=st.data(), kind=st.sampled_from([K.DONE, K.FAILED, K.STARTED]), with_attempt=st.booleans())
    def report_on_an_old_grant(self, data, kind, with_attempt):
        """A slow worker reports on a grant it may since have lost (expired, released, re-granted)."""
        grant = data.draw(st.sampled_from([e for e in self.log if e.transition is T.GRANTED]))
        self.deliver(report(
            kind, grant.worker_id, grant.epoch, self.now, shard_id=grant.shard_id,
            attempt=grant.attempt if with_attempt else None, error="late" if kind is K.FAILED else None,
        ))

    @precondition(lambda self: self.sent)
    @rule(data=st.data())
    def duplicate_delivery(self, data):
        """At-least-once input: an earlier report arrives again, possibly very late."""
        self.deliver(data.draw(st.sampled_from(self.sent)))

    @invariant()
    def counters_match_the_table(self):
        state = self.core.state
        assert state.todo_count == sum(s.state is ShardState.TODO for s in state.slots)
        assert state.doing_count == sum(s.state is ShardState.DOING for s in state.slots)

    def teardown(self):
        if not hasattr(self, "core"):
            return
        self.drain()
        self.check_exactly_once()
        self.check_replay_equivalence()

    def drain(self):
        """The surviving workers finish the job."""
        for _ in range(10_000):
            if self.core.state.finished:
                return
            for worker in WORKERS:
                answer = self.deliver(report(K.REQUESTED, worker, self.core.state.epoch, self.now, quota=2))
                if answer.status is AssignmentStatus.GRANTED:
                    for shard in answer.shards:
                        self.deliver(report(K.DONE, worker, answer.epoch, self.now, shard_id=shard.shard_id, attempt=shard.attempt))
        raise AssertionError("the job never finished")

    def check_exactly_once(self):
        done = Counter((e.epoch, e.shard_id) for e in self.log if e.transition is T.DONE)
        shards = split(self.spec)
        for epoch in range(self.spec.epochs):
            counts = [done[(epoch, s.shard_id)] for s in shards]
            assert counts == [1] * len(shards), f"epoch {epoch}: DONE counts {counts}"
            assert sum(s.length for s in shards) == self.spec.size
        closed = [e.epoch for e in self.log if e.transition is T.EPOCH_CLOSED]
        assert closed == list(range(self.spec.epochs))

    def check_replay_equivalence(self):
        """The fold of the log up to seq N equals the live state as it was at N."""
        state = None
        for event in self.log:
            if event.transition is T.DONE:
                slot = state.slots[event.shard_id]
                assert slot.worker == event.worker_id and slot.state in (ShardState.DOING, ShardState.TODO), (
                    f"shard {event.shard_id} credited to {event.worker_id}, who does not hold it"
                )
            state = fold(JOB, [event], state)
            if event.seq in self.views and event.seq == state.last_seq:
                assert state.logical_view() == self.views[event.seq], f"fold differs at seq {event.seq}"
        assert state.logical_view() == self.core.state.logical_view()
        assert state.stats.duplicate_seq == state.stats.stale_writer == state.stats.seq_gaps == 0


ShardingMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestShardingProperties = ShardingMachine.TestCase
