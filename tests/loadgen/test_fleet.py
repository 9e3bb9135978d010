"""The simulated fleet speaks the agent's protocol: reports, heartbeats, the shard loop, commands
answered."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from antdt.loadgen.fleet import Fleet, FleetSpec, Grant, Grants
from antdt.schemas.models import (
    AckStatus,
    AssignmentStatus,
    CommandAck,
    CommandAction,
    MitigationCommand,
    ProgressKind,
    Shard,
    ShardAssignment,
    ShardProgress,
    WorkerLifecycle,
    WorkerMetrics,
)

START = 1000.0
WALL = datetime(2026, 11, 23, tzinfo=UTC)


def fleet(**overrides) -> Fleet:
    spec = FleetSpec(
        **{
            "workers_per_job": 4,
            "stragglers": 0.25,
            "onset_from_s": 5.0,
            "onset_until_s": 6.0,
            "request_timeout_s": 60.0,
            **overrides,
        }
    )
    return Fleet(spec, START, WALL)


def sent_between(f: Fleet, begin: float, end: float, every: float = 0.01) -> list:
    """What the fleet sends when asked every ``every`` seconds from ``begin`` to ``end``."""
    out, now = [], begin
    while now <= end:
        out += [o.value for o in f.due(now)]
        now += every
    return out


def sent(f: Fleet, until: float) -> list:
    return sent_between(f, START, until)


def requests(records: list) -> list[ShardProgress]:
    return [r for r in records if isinstance(r, ShardProgress) and r.kind is ProgressKind.REQUESTED]


def answer(
    request: ShardProgress,
    status: AssignmentStatus = AssignmentStatus.GRANTED,
    shards: int = 2,
    epoch: int = 0,
) -> ShardAssignment:
    return ShardAssignment(
        job_id=request.job_id,
        worker_id=request.worker_id,
        seq=1,
        writer_epoch=1,
        epoch=epoch,
        status=status,
        quota=2,
        in_reply_to=request.seq,
        timestamp=WALL,
        shards=[Shard(shard_id=i, start=i * 100, length=100, attempt=0) for i in range(shards)]
        if status is AssignmentStatus.GRANTED
        else [],
    )


def test_every_worker_reports_every_second_heartbeats_and_asks_for_shards_at_once():
    records = sent(fleet(), START + 10.0)
    reports = [r for r in records if isinstance(r, WorkerMetrics)]
    assert {r.worker_id for r in reports} == {"w0", "w1", "w2", "w3"}
    assert 9 * 4 <= len(reports) <= 10 * 4
    assert len([r for r in records if isinstance(r, WorkerLifecycle)]) == 2 * 4  # every 5 s
    asked = requests(records)
    # one open request each
    assert len(asked) == 4 and all(r.quota == 2 and r.dataset is not None for r in asked)


def test_a_grant_is_trained_shard_by_shard_then_the_next_request_goes_out_and_the_wait_is_timed():
    f = fleet(stragglers=0.0, workers_per_job=1)
    (request,) = requests([o.value for o in f.due(START)])
    f.asked_at("scale-0/w0", request.seq, START)
    f.on_assignment(answer(request), START + 0.02)
    assert [round(g.read_s, 3) for g in f.seen.grants] == [0.02]
    records = [o.value for o in f.due(START + 0.02)] + sent_between(f, START + 0.03, START + 4.5)
    done = [
        r.shard_id for r in records if isinstance(r, ShardProgress) and r.kind is ProgressKind.DONE
    ]
    assert done == [0, 1]  # 2 s each at full speed
    assert len(requests(records)) == 1


def test_a_wait_is_asked_again_after_half_a_second_and_an_epoch_end_moves_to_the_next_epoch():
    f = fleet(stragglers=0.0, workers_per_job=1)
    (request,) = requests([o.value for o in f.due(START)])
    f.on_assignment(answer(request, AssignmentStatus.WAIT), START + 0.01)
    assert requests(sent_between(f, START + 0.02, START + 0.4)) == []
    (again,) = requests(sent_between(f, START + 0.41, START + 0.6))
    f.on_assignment(answer(again, AssignmentStatus.EPOCH_END, epoch=0), START + 0.61)
    (next_epoch,) = requests(sent_between(f, START + 0.62, START + 0.7))
    assert next_epoch.epoch == 1


def test_a_straggler_slows_at_its_onset_and_its_first_command_is_timed_from_there():
    f = fleet()
    (slow,) = [w for w in f.workers.values() if w.onset is not None]
    reports = [
        r
        for r in sent(f, START + 10.0)
        if isinstance(r, WorkerMetrics) and r.worker_id == slow.worker_id
    ]
    before = [r.compute.p50_s for r in reports if r.window_end <= f.utc(slow.onset)]
    after = [r.compute.p50_s for r in reports if r.window_start >= f.utc(slow.onset)]
    assert before and after and min(after) > 2 * max(before)  # 3x slower, 10 % noise
    command = MitigationCommand(
        command_id="c1",
        job_id=slow.job_id,
        target_worker=slow.worker_id,
        action=CommandAction.SET_SHARD_QUOTA,
        shard_quota=1,
        reason="test",
        evidence=[],
        policy="antdt-nd",
        issued_at=WALL,
        expires_at=WALL + timedelta(minutes=1),
        controller_epoch=3,
    )
    ack = f.on_command(command, slow.onset + 2.5).value
    assert (
        isinstance(ack, CommandAck)
        and ack.status is AckStatus.APPLIED
        and ack.controller_epoch == 3
    )
    assert f.seen.onset_to_command_s() == [2.5] and slow.quota == 1
    f.on_command(command, slow.onset + 4.0)  # later commands do not move the first
    assert (
        f.seen.onset_to_command_s() == [2.5]
        and f.seen.commands == 2
        and f.seen.commands_to_the_unhurried == 0
    )


def test_an_unanswered_request_is_asked_again_and_only_its_answer_counts():
    f = fleet(stragglers=0.0, workers_per_job=1, request_timeout_s=3.0)
    first = requests(sent_between(f, START, START + 2.9))
    again = requests(sent_between(f, START + 3.0, START + 5.0))
    assert len(first) == 1 and len(again) == 1 and again[0].seq > first[0].seq
    assert f.seen.asked_again == 1
    f.on_assignment(answer(first[0]), START + 5.1)  # the lost answer turns up late: ignored
    assert not f.seen.grants
    f.on_assignment(answer(again[0]), START + 5.2)
    assert len(f.seen.grants) == 1 and abs(f.seen.grants[0].read_s - 2.2) < 0.05


def test_grants_read_back_as_they_were_appended():
    """The columns give back every grant in order, by index and by iteration."""
    grants = Grants()
    appended = [Grant(0.5 * k, 0.01 * k, 0.002 * k) for k in range(5)]
    for grant in appended:
        grants.append(grant)
    assert len(grants) == 5 and list(grants) == appended
    assert grants[2] == appended[2] and grants[-1] == appended[-1]
    assert not Grants()
