"""The grouper's decisions: first come first served, deadlines, the whole-group points,
generations."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from antdt.errors import ConfigError
from antdt.schemas.models import GroupReady, GroupReason
from antdt.schemas.types import utc_now
from antdt.services.grouper.core import GrouperConfig, GroupFormer

JOB = "job-pr"


def ready(
    rank: int,
    seq: int,
    world: int = 4,
    finished: bool = False,
    generation: int = 0,
    incarnation: str | None = None,
) -> GroupReady:
    return GroupReady(
        job_id=JOB,
        worker_id=f"w{rank}",
        incarnation=incarnation or f"inc-{rank}",
        generation=generation,
        rank=rank,
        world_size=world,
        seq=seq,
        step=seq,
        finished=finished,
        timestamp=utc_now(),
    )


def former(p: int = 2, deadline: float = 0.05, checkpoint: float = 0.0) -> GroupFormer:
    return GroupFormer(
        GrouperConfig(group_size=p, deadline_s=deadline, checkpoint_every_s=checkpoint)
    )


def test_the_first_p_ready_form_a_group_in_arrival_order():
    grouper = former(p=2)
    assert grouper.ready(ready(3, 1), 0.0) == []
    [group] = grouper.ready(ready(1, 1), 0.01)
    assert (group.reason, group.ranks, [m.seq for m in group.members]) == (
        GroupReason.QUORUM,
        [1, 3],
        [1, 1],
    )
    assert grouper.ready(ready(0, 1), 0.02) == []  # the next group starts empty
    assert grouper.ready(ready(2, 1), 0.03)[0].ranks == [0, 2]


def test_a_worker_alone_past_the_deadline_goes_on_in_a_group_of_one():
    grouper = former(p=3, deadline=0.05)
    grouper.ready(ready(0, 1), 0.0)
    grouper.ready(ready(2, 1), 0.02)
    assert grouper.tick(0.049) == []
    [group] = grouper.tick(0.05)
    assert (group.reason, group.ranks) == (GroupReason.DEADLINE, [0, 2])
    grouper.ready(ready(1, 1), 0.06)
    [alone] = grouper.tick(0.2)
    assert (alone.reason, alone.ranks) == (GroupReason.DEADLINE, [1])


def test_when_the_others_have_no_data_left_nobody_waits_for_them():
    grouper = former(p=2, deadline=10.0)
    for rank in (0, 1, 2):
        assert grouper.ready(ready(rank, 5, finished=True), 0.0) == []
    [group] = grouper.ready(ready(3, 9), 0.1)  # the only one still training: no one else can come
    assert (group.reason, group.ranks) == (GroupReason.NO_MORE, [3])
    [final] = grouper.ready(ready(3, 10, finished=True), 0.2)
    assert (final.reason, final.ranks, [m.seq for m in final.members]) == (
        GroupReason.FINAL,
        [0, 1, 2, 3],
        [5, 5, 5, 10],
    )


def test_a_due_checkpoint_gathers_every_rank_and_no_partial_group_forms_meanwhile():
    grouper = former(p=2, checkpoint=10.0)
    grouper.ready(ready(0, 1), 0.0)
    # the job's clock started at 0.0
    assert grouper.ready(ready(1, 1), 0.0)[0].reason is GroupReason.QUORUM
    # due: no quorum
    assert grouper.ready(ready(2, 1), 10.0) == [] and grouper.ready(ready(3, 1), 10.0) == []
    assert grouper.tick(11.0) == []  # no deadline either: everyone gathers
    assert grouper.ready(ready(0, 2), 11.1) == []
    [whole] = grouper.ready(ready(1, 2), 11.2)
    assert (whole.reason, whole.ranks, whole.at) == (GroupReason.CHECKPOINT, [0, 1, 2, 3], 11.2)
    grouper.ready(ready(0, 3), 11.3)
    # the clock restarted at the checkpoint
    assert grouper.ready(ready(1, 3), 11.3)[0].reason is GroupReason.QUORUM


def test_a_newer_generation_starts_afresh_and_an_older_one_is_ignored():
    grouper = former(p=2)
    grouper.ready(ready(0, 7, generation=0), 0.0)
    # rank 0 of gen 0 dropped
    assert grouper.ready(ready(1, 1, generation=1, incarnation="new-1"), 0.01) == []
    assert grouper.ready(ready(2, 8, generation=0), 0.02) == [] and grouper.ignored == 1
    [group] = grouper.ready(ready(0, 1, generation=1, incarnation="new-0"), 0.03)
    assert (group.generation, group.ranks) == (1, [0, 1])


def test_an_announcement_sent_again_keeps_its_place_and_one_already_grouped_is_not_grouped_twice():
    grouper = former(p=2, deadline=0.05)
    grouper.ready(ready(0, 1), 0.0)
    grouper.ready(ready(0, 1), 0.04)  # sent again: still waiting since 0.0
    assert grouper.tick(0.05)[0].members[0].since == 0.0
    # its group formed already: answered again, to this rank only, and not grouped twice
    [again] = grouper.ready(ready(0, 1), 0.06)
    assert (again.resent_to, again.group_id, again.ranks) == (0, 1, [0])
    assert grouper.jobs[JOB].waiting == {}


def test_a_rank_whose_group_record_was_lost_gets_the_same_group_again_and_a_late_one_nothing():
    grouper = former(p=2)
    [group] = grouper.ready(ready(0, 1), 0.0) + grouper.ready(ready(1, 1), 0.01)
    # rank 1 never got its record (a bus reset failed the delivery) and announces step 1 again
    [again] = grouper.ready(ready(1, 1), 2.0)
    assert again.resent_to == 1 and (again.group_id, again.ranks) == (group.group_id, [0, 1])
    assert grouper.jobs[JOB].waiting == {}
    # rank 0 moved on to step 2; a slow copy of its step-1 announcement gets nothing
    grouper.ready(ready(0, 2), 2.1)
    assert grouper.ready(ready(0, 1), 2.2) == []
    assert list(grouper.jobs[JOB].waiting) == [0]


def test_group_ids_grow_within_a_job_from_the_first_id():
    grouper = GroupFormer(GrouperConfig(group_size=2), first_id=1000)
    ids = []
    for seq in (1, 2, 3):
        grouper.ready(ready(0, seq), float(seq))
        ids += [g.group_id for g in grouper.ready(ready(1, seq), float(seq))]
    assert ids == [1000, 1001, 1002]


@pytest.mark.parametrize(
    "bad", [dict(group_size=1), dict(deadline_s=-1), dict(checkpoint_every_s=-5)]
)
def test_a_broken_config_is_refused(bad):
    with pytest.raises(ConfigError):
        GrouperConfig(**bad)


# ------------------------------------------------------------ properties


@st.composite
def runs(draw):
    """A world, P, a deadline, and a schedule: at each tick some ranks finish their step (or their
    data) and announce."""
    world = draw(st.integers(2, 6))
    p = draw(st.integers(2, 4))
    deadline = draw(st.sampled_from([0.0, 0.05, 0.5]))
    checkpoint = draw(st.sampled_from([0.0, 1.0]))
    ticks = draw(
        st.lists(
            st.tuples(st.floats(0.0, 0.4), st.lists(st.integers(0, world - 1), max_size=world)),
            max_size=40,
        )
    )
    return world, p, deadline, checkpoint, ticks


@hsettings(max_examples=150, deadline=None)
@given(runs())
def test_every_announcement_is_grouped_at_most_once_with_live_ranks_and_deadlines_hold(run):
    world, p, deadline, checkpoint, ticks = run
    grouper = former(p=p, deadline=deadline, checkpoint=checkpoint)
    seq = {rank: 0 for rank in range(world)}
    waiting: dict[int, float] = {}  # rank -> since
    grouped: set[tuple[int, int]] = set()
    now = 0.0

    def check(groups):
        for group in groups:
            assert group.ranks == sorted(set(group.ranks)) and all(
                r in waiting for r in group.ranks
            )
            if group.reason in (GroupReason.CHECKPOINT, GroupReason.FINAL):
                assert group.ranks == list(range(world))
            else:
                assert 1 <= len(group.ranks) <= p
            for member in group.members:
                assert (member.rank, member.seq) not in grouped
                grouped.add((member.rank, member.seq))
                del waiting[member.rank]

    for advance, announcing in ticks:
        now += advance
        for rank in announcing:
            if rank in waiting:
                continue  # a rank waits for its group before it steps again
            seq[rank] += 1
            waiting[rank] = now
            check(grouper.ready(ready(rank, seq[rank], world=world), now))
        check(grouper.tick(now))
        due = (
            checkpoint and now - grouper.jobs[JOB].last_whole_at >= checkpoint
            if JOB in grouper.jobs
            else False
        )
        # nobody outwaits the deadline (unless every rank is gathering for a checkpoint)
        if not due:
            assert (
                all(now - since < deadline for since in waiting.values())
                or deadline == 0
                and not waiting
            )


@hsettings(max_examples=100, deadline=None)
@given(st.integers(2, 6), st.integers(2, 4), st.permutations(list(range(6))))
def test_the_final_group_forms_once_when_every_rank_has_run_out_of_data(world, p, order):
    grouper = former(p=p, deadline=0.05)
    finals = []
    for i, rank in enumerate([r for r in order if r < world]):
        finals += [
            g
            for g in grouper.ready(ready(rank, 1, world=world, finished=True), 0.01 * i)
            if g.reason is GroupReason.FINAL
        ]
        finals += [g for g in grouper.tick(1.0) if g.reason is GroupReason.FINAL]
    assert len(finals) == 1 and finals[0].ranks == list(range(world))
