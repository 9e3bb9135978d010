"""The sharder core, transition by transition (no Kafka)."""

from __future__ import annotations

import pytest

from antdt.schemas.models import AssignmentStatus, GrantRef, ShardCommit, ShardState
from antdt.schemas.models import ProgressKind as K
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.audit import audit_log
from antdt.services.sharder.core import ProgressRejected, ShardCore
from antdt.services.sharder.shards import grant_ranks, split
from antdt.services.sharder.state import JobState, fold
from tests.services.sharder.helpers import JOB, dataset, new_core, report


def transitions(events):
    return [e.transition for e in events]


def test_split_covers_every_sample_once():
    spec = dataset(size=1050, shard_size=100)
    shards = split(spec)
    assert len(shards) == 11 and shards[-1].length == 50
    assert sum(s.length for s in shards) == 1050
    assert [s.start for s in shards] == [i * 100 for i in range(11)]


def test_a_dataset_can_be_given_by_shard_count():
    from antdt.schemas.models import DatasetSpec

    spec = DatasetSpec.with_shard_count(
        "c", size=1000, shards=7, epochs=1, shuffle_seed=0, max_attempts=3, lease_s=5
    )
    assert spec.shard_count == 7 and sum(s.length for s in split(spec)) == 1000
    with pytest.raises(ValueError, match="between 1 and the dataset size"):
        DatasetSpec.with_shard_count(
            "c", size=10, shards=11, epochs=1, shuffle_seed=0, max_attempts=3, lease_s=5
        )


def test_grant_order_is_a_deterministic_shuffle_per_epoch():
    spec = dataset()
    assert grant_ranks(spec, 0) == grant_ranks(spec, 0)
    assert sorted(grant_ranks(spec, 0)) == list(range(10))
    assert grant_ranks(spec, 0) != grant_ranks(spec, 1)


def test_decisions_need_an_elected_writer():
    core = ShardCore(JobState(JOB))
    with pytest.raises(RuntimeError, match="elect"):
        core.on_progress(report(K.REQUESTED, "w", 0, dataset=dataset()), 0)


def test_request_without_dataset_waits():
    core, _ = new_core()
    answer = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment
    assert answer.status is AssignmentStatus.WAIT and not answer.shards


def test_first_request_defines_dataset_and_grants_up_to_quota():
    core, log = new_core()
    outcome = core.on_progress(report(K.REQUESTED, "w1", 0, dataset=dataset(), quota=3), 0)
    assert transitions(outcome.events) == [
        T.DATASET_DEFINED,
        T.EPOCH_OPENED,
        T.QUOTA_SET,
        T.GRANTED,
        T.GRANTED,
        T.GRANTED,
    ]
    answer = outcome.assignment
    assert (
        answer.status is AssignmentStatus.GRANTED and len(answer.shards) == 3 and answer.quota == 3
    )
    ranks = grant_ranks(dataset(), 0)
    assert sorted(ranks[s.shard_id] for s in answer.shards) == [0, 1, 2]


def test_repeated_request_is_idempotent():
    core, _ = new_core(dataset())
    first = core.on_progress(report(K.REQUESTED, "w1", 0), 0)
    again = core.on_progress(report(K.REQUESTED, "w1", 0), 0)
    assert again.events == [] and again.assignment.shards == first.assignment.shards


def test_a_different_dataset_is_rejected():
    core, _ = new_core(dataset())
    with pytest.raises(ProgressRejected, match="is sharded as"):
        core.on_progress(report(K.REQUESTED, "w1", 0, dataset=dataset(size=999)), 0)


def test_done_is_idempotent_and_only_from_the_holder():
    core, _ = new_core(dataset())
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    assert core.on_progress(report(K.DONE, "w2", 0, shard_id=shard.shard_id), 0).events == []
    done = core.on_progress(
        report(K.DONE, "w1", 0, shard_id=shard.shard_id, attempt=shard.attempt), 0
    )
    assert transitions(done.events) == [T.APPLIED, T.DONE]
    assert (
        core.on_progress(
            report(K.DONE, "w1", 0, shard_id=shard.shard_id, attempt=shard.attempt), 0
        ).events
        == []
    )


def test_failure_retries_then_quarantines():
    core, _ = new_core(dataset(max_attempts=2), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    failed = core.on_progress(
        report(K.FAILED, "w1", 0, shard_id=shard.shard_id, attempt=0, error="bad"), 0
    )
    assert transitions(failed.events) == [T.FAILED]
    regrant = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    assert regrant.shard_id == shard.shard_id and regrant.attempt == 1  # retried shards go first
    stale = core.on_progress(
        report(K.FAILED, "w1", 0, shard_id=shard.shard_id, attempt=0, error="dup"), 0
    )
    assert stale.events == []  # a duplicate of the first failure changes nothing
    final = core.on_progress(
        report(K.FAILED, "w1", 0, shard_id=shard.shard_id, attempt=1, error="bad again"), 0
    )
    assert transitions(final.events) == [T.QUARANTINED]
    slot = core.state.slots[shard.shard_id]
    assert slot.state is ShardState.QUARANTINED and "failed 2 times; last: bad again" in slot.reason


def test_lease_expiry_reclaims_and_a_late_done_is_still_accepted():
    core, _ = new_core(dataset(lease_s=1.0), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    assert core.expire_leases(999) == []
    expired = core.expire_leases(1000)
    assert transitions(expired) == [T.LEASE_EXPIRED]
    assert core.state.slots[shard.shard_id].state is ShardState.TODO
    late = core.on_progress(report(K.DONE, "w1", 0, shard_id=shard.shard_id, attempt=0), 1500)
    assert transitions(late.events) == [T.APPLIED, T.DONE]


def test_a_grant_given_back_goes_to_another_worker_first_and_its_giver_later():
    """At an epoch's end a rank gives back what it has not begun for ranks out of data: it goes
    back to TODO with its applied samples kept, under a new attempt, to whoever asks next except
    its giver, which gets it again only after give_back_hold_s."""
    core, log = new_core(dataset(size=300, shard_size=100, epochs=1), quota=3)

    def deliver(kind, worker, now_ms, **fields):
        outcome = core.on_progress(report(kind, worker, 0, **fields), now_ms)
        log.extend(outcome.events)
        return outcome

    held = deliver(K.REQUESTED, "w1", 0).assignment.shards
    assert len(held) == 3
    first = held[0]
    commit = ShardCommit(shard_id=first.shard_id, attempt=0, samples=[first.start])
    deliver(K.COMMIT, "w1", 0, commits=[commit])
    refs = [GrantRef(shard_id=s.shard_id, attempt=s.attempt) for s in held[1:]]
    stale = GrantRef(shard_id=first.shard_id, attempt=5)  # not the attempt held: ignored
    back = deliver(K.REQUESTED, "w1", 10, given_back=[stale, *refs])
    assert transitions(back.events) == [T.GIVEN_BACK, T.GIVEN_BACK]
    assert {s.shard_id for s in back.assignment.shards} == {first.shard_id}  # none granted back
    again = deliver(K.REQUESTED, "w1", 500)
    assert {s.shard_id for s in again.assignment.shards} == {first.shard_id}  # withheld
    other = deliver(K.REQUESTED, "w2", 600, quota=1).assignment.shards
    assert len(other) == 1 and other[0].attempt == 1
    assert other[0].shard_id in {r.shard_id for r in refs}
    later = deliver(K.REQUESTED, "w1", 1011).assignment.shards
    assert len(later) == 2  # the hold is over: the rest is anyone's, its giver's too
    assert deliver(K.REQUESTED, "w3", 1100, given_back=refs).events == []  # not its grants
    assert audit_log(log).epochs[0].given_back == 2
    assert audit_log(log).epochs[0].reclaimed == 0


def test_late_done_is_ignored_once_someone_else_holds_the_shard():
    core, _ = new_core(dataset(lease_s=1.0), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    core.expire_leases(1000)
    taken = core.on_progress(report(K.REQUESTED, "w2", 0), 1000).assignment.shards[0]
    assert taken.shard_id == shard.shard_id
    assert (
        core.on_progress(report(K.DONE, "w1", 0, shard_id=shard.shard_id, attempt=0), 1100).events
        == []
    )
    assert core.state.slots[shard.shard_id].worker == "w2"


def test_progress_renews_leases_at_half_time():
    core, _ = new_core(dataset(lease_s=10.0), quota=1)
    core.on_progress(report(K.REQUESTED, "w1", 0), 0)
    assert core.on_progress(report(K.REQUESTED, "w1", 0), 4000).events == []
    renewed = core.on_progress(report(K.REQUESTED, "w1", 0), 6000)
    assert transitions(renewed.events) == [T.LEASE_RENEWED]
    assert core.expire_leases(15000) == []


def test_worker_left_releases_all_its_shards():
    core, _ = new_core(dataset(), quota=3)
    held = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    events = core.worker_left("w1", 10)
    assert transitions(events) == [T.RELEASED]
    assert all(core.state.slots[s.shard_id].state is ShardState.TODO for s in held)
    assert core.worker_left("w1", 20) == []


def test_a_request_with_quota_0_gives_back_what_the_worker_holds_with_its_progress():
    """A synchronous rank that sits steps out drops its buffer: the rest of its shards goes to
    others."""
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=1), quota=2)
    held = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    core.on_progress(report(K.COMMIT, "w1", 0, commits=[commit(held[0], [held[0].start + 1])]), 0)
    out = core.on_progress(report(K.REQUESTED, "w1", 0, quota=0), 10)
    assert transitions(out.events) == [T.QUOTA_SET, T.RELEASED]
    assert out.assignment.status is AssignmentStatus.WAIT and not out.assignment.shards
    # nothing more to give back
    assert core.on_progress(report(K.REQUESTED, "w1", 0, quota=0), 20).events == []
    regranted = {
        s.shard_id: s
        for s in core.on_progress(report(K.REQUESTED, "w2", 0, quota=3), 30).assignment.shards
    }
    assert {s.shard_id for s in held} <= set(regranted)
    assert regranted[held[0].shard_id].done == [held[0].start + 1]
    assert (
        core.on_progress(report(K.REQUESTED, "w1", 0, quota=1), 40).assignment.status
        is AssignmentStatus.WAIT
    )


def test_epochs_close_and_open_until_finished():
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=2), quota=3)
    for epoch in range(2):
        shards = core.on_progress(report(K.REQUESTED, "w1", epoch), 0).assignment.shards
        events = []
        for shard in shards:
            events += core.on_progress(
                report(K.DONE, "w1", epoch, shard_id=shard.shard_id, attempt=shard.attempt), 0
            ).events
        expected = (
            [T.APPLIED, T.DONE] * 3 + [T.EPOCH_CLOSED] + ([T.EPOCH_OPENED] if epoch == 0 else [])
        )
        assert transitions(events) == expected
    assert core.state.finished
    assert (
        core.on_progress(report(K.REQUESTED, "w1", 1), 0).assignment.status
        is AssignmentStatus.FINISHED
    )


def test_request_from_a_finished_epoch_gets_epoch_end_and_a_busy_epoch_gets_wait():
    core, _ = new_core(dataset(size=200, shard_size=100, epochs=3), quota=1)
    a = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    b = core.on_progress(report(K.REQUESTED, "w2", 0), 0).assignment.shards[0]
    core.on_progress(report(K.DONE, "w1", 0, shard_id=a.shard_id), 0)
    assert (
        core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.status is AssignmentStatus.WAIT
    )
    core.on_progress(report(K.DONE, "w2", 0, shard_id=b.shard_id), 0)
    answer = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment
    assert answer.status is AssignmentStatus.EPOCH_END and answer.epoch == 0


def test_checkpoint_issues_the_seq_as_version():
    core, log = new_core(dataset())
    outcome = core.on_progress(report(K.CHECKPOINT, "w1", 0, step=40), 0)
    assert transitions(outcome.events) == [T.CHECKPOINT]
    assert outcome.assignment.version == outcome.events[0].seq == core.state.last_seq


def test_rewind_within_the_epoch_returns_later_work_to_todo():
    core, log = new_core(dataset(), quota=2)
    first = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    core.on_progress(report(K.DONE, "w1", 0, shard_id=first[0].shard_id), 0)
    version = core.on_progress(report(K.CHECKPOINT, "w1", 0), 0).assignment.version
    core.on_progress(report(K.DONE, "w1", 0, shard_id=first[1].shard_id), 0)
    outcome = core.rewind(report(K.REWIND, "w1", 0, version=version), 0)
    assert transitions(outcome.events) == [T.REWOUND]
    assert core.state.slots[first[0].shard_id].state is ShardState.DONE
    assert core.state.slots[first[1].shard_id].state is ShardState.TODO
    assert core.state.slots[first[1].shard_id].attempt == first[1].attempt + 1


@pytest.mark.parametrize("epochs", [1, 2], ids=["within the epoch", "across epochs"])
def test_a_rewind_to_a_parameter_servers_version_keeps_a_shard_it_holds_whole_done(epochs):
    """A parameter server's version is the seq of the APPLIED event it applied last; the DONE of
    the shard that event completed comes after it. The shard is in the restored model: back to
    TODO it would be granted with nothing to read and held forever (a CI chaos run hung so)."""
    core, log = new_core(dataset(size=200, shard_size=100, epochs=epochs), quota=2)
    shards = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    log += core.on_progress(report(K.DONE, "w1", 0, shard_id=shards[0].shard_id), 0).events
    log += core.on_progress(report(K.DONE, "w1", 0, shard_id=shards[1].shard_id), 0).events
    version = next(e.seq for e in log if e.transition is T.APPLIED and e.commits[0].shard_id == 1)
    target = fold(JOB, [e for e in log if e.seq <= version])
    outcome = core.rewind(report(K.REWIND, "w1", core.state.epoch, version=version), 0, target)
    closed = [e.epoch for e in outcome.events if e.transition is T.EPOCH_CLOSED]
    assert closed == [0], "epoch 0 is complete at the version"
    assert all(s.remaining() for s in core.state.slots if s.state is not ShardState.DONE)
    assert fold(JOB, log + outcome.events).logical_view() == core.state.logical_view()


def into_epoch_1_past_a_checkpoint(spec):
    """Both shards of epoch 0 DONE, with a checkpoint between the two: (core, log, epoch-0 grants,
    its version)."""
    core, log = new_core(spec, quota=2)
    shards = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    log += core.on_progress(report(K.DONE, "w1", 0, shard_id=shards[0].shard_id), 0).events
    checkpoint = core.on_progress(report(K.CHECKPOINT, "w1", 0), 0)
    log += checkpoint.events
    log += core.on_progress(report(K.DONE, "w1", 0, shard_id=shards[1].shard_id), 0).events
    return core, log, shards, checkpoint.assignment.version


def test_rewind_across_epochs_uses_the_folded_target():
    core, log, shards, version = into_epoch_1_past_a_checkpoint(
        dataset(size=200, shard_size=100, epochs=2)
    )
    assert core.state.epoch == 1
    target = fold(JOB, [e for e in log if e.seq <= version])
    outcome = core.rewind(report(K.REWIND, "w1", 1, version=version), 0, target)
    assert core.state.epoch == 0
    assert [s.state for s in core.state.slots] == [
        ShardState.DONE if s.shard_id == shards[0].shard_id else ShardState.TODO
        for s in core.state.slots
    ]
    assert fold(JOB, log + outcome.events).logical_view() == core.state.logical_view()


def test_an_epoch_run_again_after_a_rewind_names_its_grants_afresh():
    """A worker that trained an epoch-1 grant before the rewind must not take the re-run's grant for
    the same one."""
    core, log, _, version = into_epoch_1_past_a_checkpoint(
        dataset(size=200, shard_size=100, epochs=3)
    )
    first_run = core.on_progress(report(K.REQUESTED, "w1", 1), 0)
    log += first_run.events
    before = {(s.shard_id, s.attempt) for s in first_run.assignment.shards}
    rewound = core.rewind(
        report(K.REWIND, "w1", 1, version=version),
        0,
        fold(JOB, [e for e in log if e.seq <= version]),
    )
    log += rewound.events
    remaining = core.on_progress(report(K.REQUESTED, "w1", 0), 0)
    log += remaining.events
    log += core.on_progress(
        report(K.DONE, "w1", 0, shard_id=remaining.assignment.shards[0].shard_id), 0
    ).events
    second_run = core.on_progress(report(K.REQUESTED, "w1", 1), 0)
    log += second_run.events
    again = {(s.shard_id, s.attempt) for s in second_run.assignment.shards}
    assert core.state.epoch == 1 and {shard for shard, _ in again} == {shard for shard, _ in before}
    assert again.isdisjoint(before)
    assert fold(JOB, log).logical_view() == core.state.logical_view()


def test_a_rewound_epoch_still_gives_a_shard_max_attempts_tries():
    core, log, _, version = into_epoch_1_past_a_checkpoint(
        dataset(size=200, shard_size=100, epochs=2, max_attempts=2)
    )
    core.rewind(
        report(K.REWIND, "w1", 1, version=version),
        0,
        fold(JOB, [e for e in log if e.seq <= version]),
    )
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    failed = core.on_progress(report(K.FAILED, "w1", 0, shard_id=shard.shard_id, error="x"), 0)
    # the first failure of this run, not the shard's last try
    assert transitions(failed.events) == [T.FAILED]


def test_static_assignment_grants_each_worker_its_own_shards_only():
    spec = dataset(size=1000, shard_size=100, epochs=1).model_copy(update={"owners": ["w1", "w2"]})
    core, _ = new_core(spec, quota=10)
    mine = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    assert sorted(s.shard_id for s in mine) == [0, 2, 4, 6, 8]
    for shard in mine:
        core.on_progress(report(K.DONE, "w1", 0, shard_id=shard.shard_id), 0)
    again = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment
    # w2's shards wait for w2, not for the idle w1
    assert again.status is AssignmentStatus.WAIT and not again.shards
    # a stranger owns nothing
    assert not core.on_progress(report(K.REQUESTED, "w3", 0), 0).assignment.shards


def test_rewind_to_an_unknown_version_is_rejected():
    core, _ = new_core(dataset())
    with pytest.raises(ProgressRejected, match="does not exist"):
        core.rewind(report(K.REWIND, "w1", 0, version=10_000), 0)


def test_fencing_ignores_a_stale_writer():
    core, log = new_core(dataset(), quota=1)
    zombie = ShardCore(fold(JOB, log))  # a copy of the state, then a new writer takes over
    log.append(core.elect(2, 0, "new"))
    zombie_events = zombie.on_progress(report(K.REQUESTED, "w9", 0), 0).events
    live_events = core.on_progress(report(K.REQUESTED, "w1", 0), 0).events
    state = fold(JOB, log + zombie_events + live_events)
    assert state.stats.stale_writer == len(zombie_events) > 0
    assert "w9" not in state.held and state.logical_view() == core.state.logical_view()


def test_snapshot_round_trip_preserves_the_state():
    core, log = new_core(dataset(), quota=3)
    shards = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    core.on_progress(report(K.DONE, "w1", 0, shard_id=shards[0].shard_id), 0)
    core.on_progress(report(K.FAILED, "w1", 0, shard_id=shards[1].shard_id, error="x"), 0)
    # as a rewind into an earlier epoch leaves them
    core.state.attempt_base, core.state.attempt_high = 2, 3
    from antdt.schemas.codec import SingleObjectCodec
    from antdt.schemas.types import utc_now

    codec = SingleObjectCodec()
    snapshot = codec.decode(codec.encode(core.state.to_snapshot(utc_now(), log_offset=41)))
    restored = JobState.from_snapshot(snapshot)
    assert restored.logical_view() == core.state.logical_view()
    assert (
        restored.next_todo() == core.state.next_todo()
        and restored.todo_count == core.state.todo_count
    )


# ---------------------------------------------------------------- sample commits


def commit(shard, samples, holder=None, attempt=None):
    from antdt.schemas.models import ShardCommit

    return ShardCommit(
        holder=holder,
        shard_id=shard.shard_id,
        attempt=shard.attempt if attempt is None else attempt,
        samples=list(samples),
    )


def test_an_applied_step_is_recorded_and_completes_its_shard():
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=1), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    first = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(shard, range(shard.start, shard.start + 60))]), 0
    )
    # a recorded step needs no answer
    assert transitions(first.events) == [T.APPLIED] and first.assignment is None
    assert first.events[0].commits[0].holder == "w1"
    assert core.state.slots[shard.shard_id].state is ShardState.DOING
    rest = core.on_progress(
        report(
            K.COMMIT, "w1", 0, commits=[commit(shard, range(shard.start + 60, shard.start + 100))]
        ),
        0,
    )
    assert transitions(rest.events) == [T.APPLIED, T.DONE]
    again = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(shard, range(shard.start, shard.start + 10))]), 0
    )
    assert again.events == []  # a redelivered report records nothing twice


def test_a_regrant_carries_the_samples_already_applied():
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=1, lease_s=1.0), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(shard, [shard.start + 3, shard.start + 7])]), 0
    )
    core.expire_leases(2000)  # w1 died mid-shard
    regranted = core.on_progress(report(K.REQUESTED, "w2", 0), 2000).assignment.shards
    again = next(s for s in regranted if s.shard_id == shard.shard_id)
    assert again.attempt == shard.attempt + 1 and again.done == [shard.start + 3, shard.start + 7]


def test_an_update_is_recorded_only_for_a_grant_still_held_and_samples_not_yet_applied():
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=1, lease_s=1.0), quota=2)
    a, b = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    ok = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(a, [a.start])], update_id="u1"), 0
    )
    assert transitions(ok.events) == [T.APPLIED] and ok.events[0].update_id == "u1"
    assert ok.assignment.status is AssignmentStatus.GRANTED
    redelivered = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(a, [a.start])], update_id="u1"), 0
    )
    assert redelivered.events == [] and redelivered.assignment.status is AssignmentStatus.GRANTED

    twice = core.on_progress(
        report(
            K.COMMIT,
            "w1",
            0,
            commits=[commit(b, [b.start]), commit(a, [a.start, a.start + 1])],
            update_id="u2",
        ),
        0,
    )
    assert (
        twice.assignment.status is AssignmentStatus.REFUSED
        and "already in the model" in twice.assignment.reason
    )
    # Nothing applied; the grants it named go back to TODO with their progress, so the dropped
    # samples come back.
    assert transitions(twice.events) == [T.FAILED, T.FAILED]
    assert core.state.slots[a.shard_id].state is ShardState.TODO
    assert core.state.slots[a.shard_id].applied == {a.start: ok.events[0].seq}
    assert core.state.slots[b.shard_id].applied == {}

    late = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(a, [a.start + 5])], update_id="u3"), 0
    )
    # sent before the refusal arrived, and nobody took a since: good work
    assert transitions(late.events) == [T.APPLIED]
    core.on_progress(report(K.REQUESTED, "w2", 0), 0)  # now w2 holds a and b
    stale = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(a, [a.start + 6])], update_id="u4"), 0
    )
    assert (
        stale.assignment.status is AssignmentStatus.REFUSED
        and "no longer held" in stale.assignment.reason
    )
    assert transitions(stale.events) == []


def test_a_late_update_from_the_last_holder_is_recorded_while_nobody_took_the_shard():
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=1, lease_s=1.0), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    core.expire_leases(2000)
    late = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(shard, [shard.start])], update_id="u1"), 2000
    )
    assert transitions(late.events) == [T.APPLIED]
    # someone else takes it: w1's grant is gone for good
    core.on_progress(report(K.REQUESTED, "w2", 0), 2000)
    gone = core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(shard, [shard.start + 1])], update_id="u2"), 2000
    )
    assert gone.assignment.status is AssignmentStatus.REFUSED


def test_committed_samples_must_lie_in_their_shard():
    core, _ = new_core(dataset(size=300, shard_size=100, epochs=1), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    with pytest.raises(ProgressRejected, match="are not in shard"):
        core.on_progress(
            report(
                K.COMMIT,
                "w1",
                0,
                commits=[commit(shard, [shard.start + 100 if shard.start < 200 else 0])],
            ),
            0,
        )


def test_shards_read_to_the_end_do_not_count_against_the_quota():
    core, _ = new_core(dataset(size=500, shard_size=100, epochs=1), quota=1)
    [a] = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    still = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards
    assert [s.shard_id for s in still] == [a.shard_id]
    more = core.on_progress(
        report(K.REQUESTED, "w1", 0, read_shards=[a.shard_id]), 0
    ).assignment.shards
    # a is held until its commits come
    assert len(more) == 2 and a.shard_id in {s.shard_id for s in more}


def test_a_rewind_drops_exactly_the_samples_applied_after_the_version():
    core, log = new_core(dataset(size=200, shard_size=100, epochs=1), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    core.on_progress(
        report(
            K.COMMIT,
            "w1",
            0,
            commits=[commit(shard, [shard.start, shard.start + 1])],
            update_id="u1",
        ),
        0,
    )
    version = core.on_progress(report(K.CHECKPOINT, "w1", 0), 0).assignment.version
    core.on_progress(
        report(K.COMMIT, "w1", 0, commits=[commit(shard, [shard.start + 2])], update_id="u2"), 0
    )
    core.rewind(report(K.REWIND, "w1", 0, version=version), 0)
    slot = core.state.slots[shard.shard_id]
    assert sorted(slot.applied) == [shard.start, shard.start + 1] and slot.state is ShardState.TODO
    assert set(core.state.updates) == {"u1"}


def test_a_snapshot_keeps_applied_samples_and_updates():
    core, _ = new_core(dataset(size=200, shard_size=100, epochs=1), quota=1)
    shard = core.on_progress(report(K.REQUESTED, "w1", 0), 0).assignment.shards[0]
    core.on_progress(
        report(
            K.COMMIT,
            "w1",
            0,
            commits=[commit(shard, [shard.start + 5, shard.start])],
            update_id="u1",
        ),
        0,
    )
    core.on_progress(report(K.COMMIT, "w1", 0, commits=[commit(shard, [shard.start + 9])]), 0)
    from antdt.schemas.codec import SingleObjectCodec
    from antdt.schemas.types import utc_now

    codec = SingleObjectCodec()
    restored = JobState.from_snapshot(codec.decode(codec.encode(core.state.to_snapshot(utc_now()))))
    assert restored.logical_view() == core.state.logical_view()
    assert restored.updates == {"u1": core.state.updates["u1"]}


def test_a_sync_commit_of_a_grant_a_rewind_took_back_is_not_recorded():
    """The restored model lost that update: recording it would leave its samples untrained."""
    from antdt.schemas.codec import SingleObjectCodec
    from antdt.schemas.types import utc_now
    from antdt.services.sharder.audit import audit_log

    core, log = new_core(dataset(size=200, shard_size=100, epochs=1), quota=1)
    answer = core.on_progress(report(K.REQUESTED, "w1", 0), 0)
    log += answer.events
    shard = answer.assignment.shards[0]
    checkpoint = core.on_progress(report(K.CHECKPOINT, "w1", 0), 0)
    log += checkpoint.events
    late = report(K.COMMIT, "w1", 0, commits=[commit(shard, [shard.start + 4])])
    log += core.on_progress(late, 0).events
    log += core.rewind(report(K.REWIND, "w0", 0, version=checkpoint.assignment.version), 0).events
    assert core.on_progress(late, 0).events == []  # delivered again after the rewind
    assert core.state.slots[shard.shard_id].applied == {}
    codec = SingleObjectCodec()
    restored = JobState.from_snapshot(codec.decode(codec.encode(core.state.to_snapshot(utc_now()))))
    assert restored.logical_view() == core.state.logical_view() == fold(JOB, log).logical_view()
    regrant = core.on_progress(report(K.REQUESTED, "w2", 0), 0)
    log += regrant.events
    again = regrant.assignment.shards[0]
    log += core.on_progress(
        report(K.COMMIT, "w2", 0, commits=[commit(again, range(again.start, again.start + 100))]), 0
    ).events
    audit = audit_log(log)
    assert audit.ok, audit.violations
    assert core.state.slots[shard.shard_id].state is ShardState.DONE
