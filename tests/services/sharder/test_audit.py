"""The independent audit of a shard log (no Kafka): logs are made by ShardCore, then tampered
with."""

from __future__ import annotations

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

from antdt.schemas.models import ProgressKind as K
from antdt.schemas.models import ShardCommit, ShardLogEvent, ShardState
from antdt.schemas.models import ShardTransition as T
from antdt.services.sharder.audit import EpochStatus, audit_log, shard_ranges
from antdt.services.sharder.core import ShardCore
from antdt.services.sharder.eventlog import lacks_beginning
from antdt.services.sharder.shards import split
from antdt.services.sharder.state import fold, from_ms
from tests.services.sharder.helpers import JOB, dataset, new_core, report
from tests.services.sharder.test_core_properties import WORKERS, ShardingMachine


def finish(core: ShardCore, log: list, workers=("w1", "w2"), now: int = 0) -> list:
    """The workers request and complete shards until the job is finished."""
    for _ in range(1000):
        if core.state.finished:
            return log
        for worker in workers:
            answer = send(core, log, report(K.REQUESTED, worker, core.state.epoch, now), now)
            for shard in answer.shards:
                send(
                    core,
                    log,
                    report(
                        K.DONE,
                        worker,
                        answer.epoch,
                        now,
                        shard_id=shard.shard_id,
                        attempt=shard.attempt,
                    ),
                    now,
                )
    raise AssertionError("the job never finished")


def send(core: ShardCore, log: list, message, now: int = 0):
    """Deliver a report, keeping the events it caused in ``log``; returns the answer."""
    outcome = core.on_progress(message, now)
    log += outcome.events
    return outcome.assignment


def renumbered(events: list[ShardLogEvent]) -> list[ShardLogEvent]:
    """The events with gap-free seqs again, after one was added or removed."""
    return [event.model_copy(update={"seq": seq}) for seq, event in enumerate(events, 1)]


def first(log: list[ShardLogEvent], transition: T, **fields) -> int:
    """Index of the first event of a kind matching ``fields``."""
    return next(
        i
        for i, e in enumerate(log)
        if e.transition is transition and all(getattr(e, k) == v for k, v in fields.items())
    )


def clean_job(epochs: int = 2) -> list[ShardLogEvent]:
    core, log = new_core(dataset(size=1050, shard_size=100, epochs=epochs), quota=2)
    return finish(core, log)


# ---------------------------------------------------------------- clean logs


def test_a_clean_run_with_churn_passes_and_counts_what_happened():
    core, log = new_core(dataset(size=1050, shard_size=100, epochs=2, lease_s=1.0), quota=2)
    a, _ = send(core, log, report(K.REQUESTED, "w1", 0)).shards
    log += core.expire_leases(1000)  # both of w1's leases run out
    # late, still good
    send(core, log, report(K.DONE, "w1", 0, shard_id=a.shard_id, attempt=a.attempt), 1100)
    c = send(core, log, report(K.REQUESTED, "w2", 0), 1200).shards[0]
    send(
        core,
        log,
        report(K.FAILED, "w2", 0, shard_id=c.shard_id, attempt=c.attempt, error="oom"),
        1200,
    )
    send(core, log, report(K.REQUESTED, "w3", 0), 1300)
    log += core.worker_left("w3", 1300)
    log = finish(core, log, now=1400)

    result = audit_log(log)
    assert result.ok, result.violations
    assert result.finished and result.job_id == JOB and result.fenced == result.duplicate_seqs == 0
    assert [e.status for e in result.epochs] == [EpochStatus.COMPLETE] * 2
    first_epoch = result.epochs[0]
    assert (
        first_epoch.samples_done_once == first_epoch.samples == 1050
        and first_epoch.shards_done == 11
    )
    assert (first_epoch.leases_expired, first_epoch.retries, first_epoch.released) == (2, 1, 2)
    assert first_epoch.reclaimed == 4 and not first_epoch.gaps and not first_epoch.duplicate_done
    assert result.epochs[1].reclaimed == result.epochs[1].retries == 0


def test_shards_are_computed_independently_and_agree_with_the_sharder():
    for size, shard_size in [(1, 1), (1050, 100), (1000, 100), (7, 3)]:
        spec = dataset(size=size, shard_size=shard_size)
        assert shard_ranges(spec) == [(s.start, s.length) for s in split(spec)]


def test_a_running_job_is_in_progress_not_a_gap():
    core, log = new_core(dataset(epochs=2), quota=2)
    shards = send(core, log, report(K.REQUESTED, "w1", 0)).shards
    send(core, log, report(K.DONE, "w1", 0, shard_id=shards[0].shard_id))
    result = audit_log(log)
    assert result.ok and not result.finished
    [epoch] = result.epochs
    assert (
        epoch.status is EpochStatus.IN_PROGRESS
        and epoch.samples_done_once == 100
        and epoch.samples_pending == 900
    )
    assert epoch.gaps == []


def test_the_report_is_json_and_can_be_narrowed_to_one_epoch():
    result = audit_log(clean_job())
    data = orjson.loads(orjson.dumps(result.to_dict()))
    assert (
        data["ok"] is True
        and data["dataset"]["size"] == 1050
        and [e["epoch"] for e in data["epochs"]] == [0, 1]
    )
    assert [e.epoch for e in result.for_epoch(1).epochs] == [1]
    with pytest.raises(KeyError):
        result.for_epoch(5)


# ---------------------------------------------------------------- tampered logs


def test_a_duplicate_done_is_detected():
    log = clean_job()
    done = log[first(log, T.DONE, epoch=0)]
    tampered = renumbered(
        [
            *log[: first(log, T.EPOCH_CLOSED, epoch=0)],
            done.model_copy(update={"worker_id": "w2"}),
            *log[first(log, T.EPOCH_CLOSED, epoch=0) :],
        ]
    )
    result = audit_log(tampered)
    assert not result.ok
    assert result.epochs[0].duplicate_done == [done.shard_id]
    length = shard_ranges(dataset(size=1050, shard_size=100))[done.shard_id][1]
    assert result.epochs[0].samples_done_once == 1050 - length
    assert any(f"shard {done.shard_id} DONE twice" in v for v in result.violations)
    assert result.epochs[1].violations == []


def test_a_done_by_a_worker_that_did_not_hold_the_shard_is_detected():
    log = clean_job()
    index = first(log, T.DONE, epoch=1)
    log[index] = log[index].model_copy(update={"worker_id": "intruder"})
    result = audit_log(log)
    assert (
        result.epochs[1].not_holder_done == [log[index].shard_id]
        and result.epochs[0].not_holder_done == []
    )
    [violation] = result.violations
    assert (
        violation.startswith("epoch 1: ")
        and "credited to intruder, who did not hold it (held by w" in violation
    )


def test_an_epoch_closed_with_a_shard_never_done_is_a_gap():
    log = clean_job()
    dropped = log[first(log, T.DONE, epoch=0, shard_id=3)]
    result = audit_log(renumbered([e for e in log if e is not dropped]))
    assert result.epochs[0].gaps == [(300, 400)] and result.epochs[0].gap_samples == 100
    assert result.epochs[0].samples_done_once == 950
    assert any(
        "closed with 100 samples neither DONE nor QUARANTINED: [300, 400)" in v
        for v in result.violations
    )


def test_lost_and_repeated_seqs():
    log = clean_job()
    lost = renumbered(log)[:20] + renumbered(log)[21:]
    result = audit_log(lost)
    assert result.seq_gaps == [(21, 21)] and any(
        "seqs 21..21 are missing" in v for v in result.violations
    )

    redelivered = log[:30] + [log[25]] + log[30:]
    result = audit_log(redelivered)
    assert result.ok and result.duplicate_seqs == 1  # an identical redelivery is harmless

    conflicting = log[:30] + [log[25].model_copy(update={"reason": "other"})] + log[30:]
    result = audit_log(conflicting)
    assert result.duplicate_seqs == 1 and any(
        "seq 26: two different events" in v for v in result.violations
    )


def test_a_fenced_writer_is_ignored_and_counted():
    core, log = new_core(dataset(size=300, shard_size=100, epochs=1), quota=1)
    zombie = ShardCore(fold(JOB, log))
    log.append(core.elect(2, 0, "new"))
    zombie_events = zombie.on_progress(report(K.REQUESTED, "w9", 0), 0).events
    shard = zombie_events[-1].shard_id
    zombie_events += zombie.on_progress(report(K.DONE, "w9", 0, shard_id=shard), 0).events
    log = finish(core, log + zombie_events)
    result = audit_log(log)
    assert result.ok, result.violations
    assert result.fenced == len(zombie_events) > 1 and result.writer_epoch == 2
    assert result.epochs[0].samples_done_once == 300 and not result.epochs[0].duplicate_done


def test_an_event_from_a_writer_that_was_never_elected_is_a_violation():
    log = clean_job()
    index = first(log, T.DONE)
    log.insert(index, log[index].model_copy(update={"writer_epoch": 7}))
    result = audit_log(log)
    assert result.fenced == 1 and any(
        "writer epoch 7, which was never elected" in v for v in result.violations
    )


def test_quarantine_is_a_violation_unless_allowed():
    core, log = new_core(dataset(size=300, shard_size=100, epochs=1, max_attempts=1), quota=1)
    shard = send(core, log, report(K.REQUESTED, "w1", 0)).shards[0]
    send(
        core, log, report(K.FAILED, "w1", 0, shard_id=shard.shard_id, attempt=0, error="bad record")
    )
    log = finish(core, log)
    strict, lenient = audit_log(log), audit_log(log, allow_quarantine=True)
    assert strict.finished and strict.epochs[0].quarantined == {
        shard.shard_id: "failed 1 times; last: bad record"
    }
    assert not strict.ok and "1 shard(s) quarantined" in strict.violations[0]
    assert (
        lenient.ok and lenient.epochs[0].gaps == [] and lenient.epochs[0].samples_done_once == 200
    )


def test_a_rewind_within_the_epoch_credits_only_the_surviving_dones():
    core, log = new_core(dataset(size=300, shard_size=100, epochs=1), quota=2)
    first_, second = send(core, log, report(K.REQUESTED, "w1", 0)).shards
    send(core, log, report(K.DONE, "w1", 0, shard_id=first_.shard_id))
    checkpoint = send(core, log, report(K.CHECKPOINT, "w1", 0))
    send(core, log, report(K.DONE, "w1", 0, shard_id=second.shard_id))
    log += core.rewind(report(K.REWIND, "w1", 0, version=checkpoint.version), 0).events
    log = finish(core, log)  # the second shard is done again: not a duplicate
    assert sum(e.transition is T.DONE and e.shard_id == second.shard_id for e in log) == 2
    result = audit_log(log)
    assert result.ok, result.violations
    assert result.rewinds == 1 and result.epochs[0].rewinds == 1 and result.epochs[0].passes == 1
    assert result.epochs[0].samples_done_once == 300


def test_a_rewind_across_epochs_restarts_the_epoch_and_reports_its_last_pass():
    core, log = new_core(dataset(size=200, shard_size=100, epochs=2), quota=2)
    shards = send(core, log, report(K.REQUESTED, "w1", 0)).shards
    send(core, log, report(K.DONE, "w1", 0, shard_id=shards[0].shard_id))
    checkpoint = send(core, log, report(K.CHECKPOINT, "w1", 0))
    send(core, log, report(K.DONE, "w1", 0, shard_id=shards[1].shard_id))
    send(core, log, report(K.REQUESTED, "w1", 1))  # epoch 1 under way
    version = checkpoint.version
    log += core.rewind(
        report(K.REWIND, "w1", 1, version=version),
        0,
        fold(JOB, [e for e in log if e.seq <= version]),
    ).events

    midway = audit_log(log)
    assert midway.ok and not midway.finished
    assert [(e.epoch, e.status, e.passes) for e in midway.epochs] == [
        (0, EpochStatus.IN_PROGRESS, 2),
        (1, EpochStatus.REWOUND, 1),
    ]
    assert midway.epochs[0].samples_done_once == 100  # restored as DONE by the rewind

    result = audit_log(finish(core, log))
    assert result.ok, result.violations
    assert [(e.epoch, e.status, e.passes, e.samples_done_once) for e in result.epochs] == [
        (0, EpochStatus.COMPLETE, 2, 200),
        (1, EpochStatus.COMPLETE, 2, 200),
    ]
    assert result.rewinds == 1 and result.finished


def test_a_done_for_work_voided_by_a_rewind_is_not_credited():
    """A DONE after a rewind, for a shard nobody was granted since, is a DONE the model does not
    contain."""
    core, log = new_core(dataset(size=300, shard_size=100, epochs=1), quota=2)
    checkpoint = send(core, log, report(K.CHECKPOINT, "w1", 0))
    shard = send(core, log, report(K.REQUESTED, "w1", 0)).shards[0]
    send(core, log, report(K.DONE, "w1", 0, shard_id=shard.shard_id))
    done = log[-1]
    log += core.rewind(report(K.REWIND, "w1", 0, version=checkpoint.version), 0).events
    log.append(done.model_copy(update={"seq": log[-1].seq + 1}))  # the old DONE, credited again
    result = audit_log(log)
    assert any(
        f"shard {shard.shard_id} DONE credited to w1, who did not hold it (todo)" in v
        for v in result.violations
    )


# ---------------------------------------------------------------- property


class AuditedShardingMachine(ShardingMachine):
    """The core's random interleavings, plus checkpoints and rewinds; the audit must pass every run.

    Stale and duplicate deliveries are drawn from the whole history, rewinds
    included: a report about work a rewind voided must not be credited (see
    ``test_a_done_for_work_voided_by_a_rewind_is_not_credited``).
    """

    checkpoints: tuple[int, ...] = ()  # versions issued so far

    @rule(worker=st.sampled_from(WORKERS))
    def checkpoint(self, worker):
        version = self.deliver(
            report(K.CHECKPOINT, worker, self.core.state.epoch, self.now)
        ).version
        self.checkpoints = (*self.checkpoints, version)

    @rule()
    def finish_the_epoch(self):
        """Everyone works until the epoch ends, so that later rewinds can cross epochs."""
        epoch = self.core.state.epoch
        for _ in range(1000):
            if self.core.state.finished or self.core.state.epoch != epoch:
                return
            for worker in WORKERS:
                # a worker that sat out (quota 0) works again: otherwise nobody might
                sat_out = self.core.state.quotas.get(worker) == 0
                answer = self.deliver(
                    report(K.REQUESTED, worker, epoch, self.now, quota=1 if sat_out else None)
                )
                for shard in answer.shards:
                    self.deliver(
                        report(
                            K.DONE,
                            worker,
                            epoch,
                            self.now,
                            shard_id=shard.shard_id,
                            attempt=shard.attempt,
                        )
                    )
        raise AssertionError(f"epoch {epoch} never ended")

    @precondition(lambda self: self.checkpoints)
    @rule(data=st.data())
    def rewind(self, data):
        version = data.draw(st.sampled_from(self.checkpoints))
        state = self.core.state
        target = (
            fold(JOB, [e for e in self.log if e.seq <= version])
            if version < state.epoch_opened_seq
            else None
        )
        self.record(
            self.core.rewind(
                report(K.REWIND, "w0", state.epoch, self.now, version=version), self.now, target
            ).events
        )

    def teardown(self):
        if not hasattr(self, "core"):
            return
        now = audit_log(self.log)
        assert now.ok, [now.log_violations, *(e.violations for e in now.epochs)]
        self.drain()
        result = audit_log(self.log)
        assert result.ok, result.violations
        assert result.finished and result.fenced == result.duplicate_seqs == 0
        assert result.rewinds == sum(e.transition is T.REWOUND for e in self.log)
        assert [e.epoch for e in result.epochs] == list(range(self.spec.epochs))
        for epoch in result.epochs:
            assert (
                epoch.status is EpochStatus.COMPLETE and epoch.samples_done_once == self.spec.size
            )


AuditedShardingMachine.TestCase.settings = settings(
    max_examples=120,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAuditedSharding = AuditedShardingMachine.TestCase


# ---------------------------------------------------------------- from a snapshot (the log lost its
# beginning)


def split_at_snapshot(epochs: int = 2, after_events: int = 9):
    """A job run to the end, with a snapshot of its state after the first ``after_events`` events.

    The snapshot's events are then dropped from the log, as a bus reset or
    retention would drop them; a few of them stay, as a producer's retries
    deliver them into the new log before the snapshot.
    """
    core, log = new_core(dataset(size=1050, shard_size=100, epochs=epochs), quota=2)
    snapshot = None
    for _ in range(1000):
        if core.state.finished:
            break
        for worker in ("w1", "w2"):
            answer = send(core, log, report(K.REQUESTED, worker, core.state.epoch))
            if snapshot is None and len(log) >= after_events:
                snapshot = core.state.to_snapshot(from_ms(0))
            for shard in answer.shards:
                send(
                    core,
                    log,
                    report(
                        K.DONE, worker, answer.epoch, shard_id=shard.shard_id, attempt=shard.attempt
                    ),
                )
    kept = [event for event in log if event.seq > snapshot.seq]
    return snapshot, log[snapshot.seq - 3 : snapshot.seq] + kept


def test_lacks_beginning_is_a_log_that_does_not_start_at_seq_one():
    snapshot, events = split_at_snapshot()
    assert lacks_beginning(events) and not lacks_beginning(clean_job()) and not lacks_beginning([])
    whole = clean_job()
    # After a bus reset: retried records first, then the old log written again from seq 1, then new
    # events.
    assert lacks_beginning(whole[40:42] + whole)


def test_a_log_written_again_after_a_reset_is_audited_from_the_snapshot():
    from antdt.schemas.types import utc_now

    core, log = new_core(dataset(size=1050, shard_size=100, epochs=1), quota=2)
    log = finish(core, log)
    cut = len(log) // 2
    snapshot = fold(JOB, log[:cut]).to_snapshot(utc_now())
    again = log[cut - 2 : cut] + log[:cut] + log[cut:]  # what the new log holds, in its order
    result = audit_log(again, snapshot=snapshot)
    assert result.ok and result.finished, result.violations
    assert result.from_snapshot_seq == snapshot.seq and result.epochs[0].counts == [1] * 1050


def test_a_log_audited_from_a_snapshot_is_clean_and_says_where_it_starts():
    snapshot, events = split_at_snapshot()
    # without the snapshot: missing seqs, shards of an unknown dataset
    assert not audit_log(events).ok
    report_ = audit_log(events, snapshot=snapshot)
    assert report_.ok, report_.violations
    assert report_.from_snapshot_seq == snapshot.seq and report_.finished
    # the events that reached the new log again before the snapshot
    assert report_.duplicate_seqs == 3
    assert [(e.epoch, e.status, e.samples_done_once, e.gap_samples) for e in report_.epochs] == [
        (0, EpochStatus.COMPLETE, 1050, 0),
        (1, EpochStatus.COMPLETE, 1050, 0),
    ]


def test_a_duplicate_done_after_the_snapshot_is_still_caught():
    snapshot, events = split_at_snapshot()
    done = next(
        e
        for e in events
        if e.transition is T.DONE and e.seq > snapshot.seq and e.epoch == snapshot.epoch
    )
    repeat = done.model_copy(update={"seq": events[-1].seq + 1})
    closing = first(events, T.EPOCH_CLOSED, epoch=snapshot.epoch)
    tampered = renumbered_from(events[:closing] + [repeat] + events[closing:], snapshot.seq)
    report_ = audit_log(tampered, snapshot=snapshot)
    assert not report_.ok
    assert report_.epoch(snapshot.epoch).duplicate_done == [done.shard_id]


def test_a_shard_done_before_the_snapshot_and_again_after_it_is_a_duplicate():
    snapshot, events = split_at_snapshot()
    before = next(entry for entry in snapshot.shards if entry.state is ShardState.DONE)
    done_after = next(
        e
        for e in events
        if e.transition is T.DONE and e.seq > snapshot.seq and e.epoch == snapshot.epoch
    )
    again = done_after.model_copy(update={"shard_id": before.shard_id})
    closing = first(events, T.EPOCH_CLOSED, epoch=snapshot.epoch)
    tampered = renumbered_from(events[:closing] + [again] + events[closing:], snapshot.seq)
    assert audit_log(tampered, snapshot=snapshot).epoch(snapshot.epoch).duplicate_done == [
        before.shard_id
    ]


def renumbered_from(events: list[ShardLogEvent], snapshot_seq: int) -> list[ShardLogEvent]:
    """Gap-free seqs after the snapshot again (the redelivered events before it keep theirs)."""
    head = [e for e in events if e.seq <= snapshot_seq]
    tail = [e for e in events if e not in head]
    return head + [
        e.model_copy(update={"seq": seq}) for seq, e in enumerate(tail, snapshot_seq + 1)
    ]


# ---------------------------------------------------------------- samples and the ledger


def test_a_sample_applied_twice_is_a_violation_and_counted():
    log = clean_job(epochs=1)
    applied = log[first(log, T.APPLIED)]
    tampered = renumbered(
        [*log[: first(log, T.EPOCH_CLOSED)], applied, *log[first(log, T.EPOCH_CLOSED) :]]
    )
    result = audit_log(tampered)
    sample = applied.commits[0].samples[0]
    assert any(f"sample {sample} applied twice" in v for v in result.violations)
    assert result.epochs[0].samples_applied_twice == len(applied.commits[0].samples)
    assert result.epochs[0].counts[sample] == 2


def test_a_done_whose_samples_were_never_applied_is_a_violation():
    log = clean_job(epochs=1)
    dropped = log[first(log, T.APPLIED)]
    result = audit_log(renumbered([e for e in log if e is not dropped]))
    shard = dropped.commits[0].shard_id
    assert any(
        f"shard {shard} DONE with 100 of its 100 samples never applied" in v
        for v in result.violations
    )


def test_the_log_and_the_ledger_are_compared_sample_by_sample():
    from antdt.services.sharder.audit import compare_with_ledger

    result = audit_log(clean_job(epochs=2))
    ones = {0: np.ones(1050, dtype=np.int32), 1: np.ones(1050, dtype=np.int32)}
    assert compare_with_ledger(result, ones) == []
    twice = {0: ones[0].copy(), 1: ones[1]}
    twice[0][7] = 2
    found = compare_with_ledger(result, twice)
    assert any("trained more than once (first: [7])" in f for f in found)
    assert any("disagree on 1 samples (sample 7: log 1, ledger 2)" in f for f in found)
    assert compare_with_ledger(result, {0: ones[0]}) == [
        "epoch 1: no ledger to compare with the log"
    ]


def test_a_rewind_drops_the_samples_applied_after_it_from_the_counts():
    core, log = new_core(dataset(size=200, shard_size=100, epochs=1), quota=2)
    a, b = send(core, log, report(K.REQUESTED, "w1", 0)).shards
    send(
        core,
        log,
        report(
            K.COMMIT,
            "w1",
            0,
            commits=[
                ShardCommit(
                    shard_id=a.shard_id,
                    attempt=a.attempt,
                    samples=list(range(a.start, a.start + 100)),
                )
            ],
        ),
    )
    version = send(core, log, report(K.CHECKPOINT, "w1", 0)).version
    send(
        core,
        log,
        report(
            K.COMMIT,
            "w1",
            0,
            commits=[
                ShardCommit(
                    shard_id=b.shard_id,
                    attempt=b.attempt,
                    samples=list(range(b.start, b.start + 50)),
                )
            ],
        ),
    )
    log += core.rewind(report(K.REWIND, "w1", 0, version=version), 0).events
    log = finish(core, log)
    result = audit_log(log)
    assert result.ok, result.violations
    assert result.epochs[0].counts == [1] * 200


def test_an_epoch_ends_when_every_worker_had_sat_out_first():
    """Found by TestAuditedSharding in CI: the harness defines the dataset with quota 0 for w0, so
    after w1-w3 asked for quota 0 nobody held a quota and finishing the epoch never could (the
    harness's bug, not the core's: a worker that sat out must ask again)."""
    state = AuditedShardingMachine()
    state.start(size=1, shard_size=1, epochs=1, quota=1)
    for worker in ("w1", "w2", "w3"):
        state.request(quota=0, worker=worker)
    state.finish_the_epoch()
    assert state.core.state.finished


# ---------------------------------------------------------------- a rewind's target after a reset


def test_the_state_at_a_version_folds_from_the_snapshot_when_the_log_starts_after_it():
    """After a bus reset the log starts after the snapshot the sharder re-published: a rewind
    across an epoch must fold from it (from the log alone the fold took nothing, and the sharder
    refused a rewind it could do)."""
    from antdt.schemas.types import utc_now
    from antdt.services.sharder.state import state_at

    core, log = new_core(dataset(size=1050, shard_size=100, epochs=2), quota=2)
    log = finish(core, log)
    cut = len(log) // 2
    snapshot = fold(JOB, log[:cut]).to_snapshot(utc_now())
    new_log = log[cut - 2 : cut] + log[cut:]  # retried records first, then what followed
    version = log[cut + 5].seq
    expected = fold(JOB, [event for event in log if event.seq <= version])
    at = state_at(JOB, version, new_log, snapshot)
    assert at.last_seq == version and at.logical_view() == expected.logical_view()
    assert state_at(JOB, version, new_log).last_seq != version  # what was refused
    # with the whole log, the snapshot is not needed
    assert state_at(JOB, version, log).logical_view() == expected.logical_view()


def test_samples_applied_under_another_worker_s_grant_are_counted_as_pooled():
    """A synchronous rank commits its share of a pooled epoch tail under the holder's grant; a
    worker's DataLoader process's grant, committed by the worker itself, is not pooling."""
    core, log = new_core(dataset(size=200, shard_size=100, epochs=1), quota=1)
    a = send(core, log, report(K.REQUESTED, "w1", 0)).shards[0]
    b = send(core, log, report(K.REQUESTED, "w1.loader0", 0)).shards[0]
    own, share, loaders = [a.start, a.start + 1], [a.start + 2, a.start + 3], [b.start]
    commits = [
        ("w1", ShardCommit(holder="w1", shard_id=a.shard_id, attempt=a.attempt, samples=own)),
        ("w2", ShardCommit(holder="w1", shard_id=a.shard_id, attempt=a.attempt, samples=share)),
        (
            "w1",
            ShardCommit(
                holder="w1.loader0", shard_id=b.shard_id, attempt=b.attempt, samples=loaders
            ),
        ),
    ]
    for worker, commit in commits:
        send(core, log, report(K.COMMIT, worker, 0, commits=[commit]))
    result = audit_log(log)
    assert result.ok, result.violations
    assert result.epochs[0].pooled == 2
