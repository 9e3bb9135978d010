"""Batch sizes switch at one step on every rank they change, however late a command arrives
(pure)."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from antdt.schemas.models import RANKS_CHANGED, CommandAction, MitigationCommand
from antdt.schemas.types import utc_now
from antdt.worker.elastic.job import split_evenly
from antdt.worker.elastic.resize import AgreedResize


def command(
    rank: int, size: int, step: int, global_batch: int, changed: int | None = None
) -> MitigationCommand:
    now = utc_now()
    return MitigationCommand(
        command_id=f"c{rank}-{step}",
        job_id="j",
        target_worker=f"r{rank}",
        action=CommandAction.ADJUST_BATCH_SIZE,
        reason="test",
        evidence=[],
        policy="antdt-dd",
        issued_at=now,
        expires_at=now + timedelta(minutes=1),
        controller_epoch=1,
        batch_size=size,
        global_batch_size=global_batch,
        effective_step=step,
        parameters={} if changed is None else {RANKS_CHANGED: str(changed)},
    )


def run(
    old: list[int],
    new: list[int],
    effective: int,
    arrivals: dict[int, int],
    steps: int = 60,
    counted: bool = True,
):
    """Lockstep steps; rank r's command arrives before step arrivals[r]. Returns (switch steps,
    globals).

    ``counted``: the commands say how many ranks the decision changes (as the DD controller's do).
    """
    ranks, sizes, switched, globals_ = [AgreedResize() for _ in old], list(old), {}, []
    changed = len(arrivals) if counted else None
    for step in range(steps):
        for rank, arrival in arrivals.items():
            if arrival == step:
                ranks[rank].receive(command(rank, new[rank], effective, sum(old), changed))
        offers = [r.offer(size) for r, size in zip(ranks, sizes)]
        sums = [sum(column) for column in zip(*offers)]
        globals_.append(sum(sizes))
        for rank, resize in enumerate(ranks):
            agreed = resize.agreed(sums, step + 1, sum(old))
            if agreed is not None:
                sizes[rank], switched[rank] = agreed.batch_size, step + 1
    return switched, globals_


#: (old sizes, new sizes, effective step, arrival step per rank): a decision that moves samples
#: between ranks.
CASES = st.lists(st.integers(1, 64), min_size=2, max_size=6).flatmap(
    lambda old: st.tuples(
        st.just(old),
        st.permutations(old),
        st.integers(0, 30),
        st.lists(st.integers(0, 40), min_size=len(old), max_size=len(old)),
    )
)


def test_commands_in_time_switch_at_their_step():
    switched, _ = run([32, 32, 32], [40, 40, 16], 10, {0: 3, 1: 5, 2: 9})
    assert switched == {0: 10, 1: 10, 2: 10}


def test_a_late_command_delays_every_changed_rank_alike():
    switched, globals_ = run([32, 32, 32], [40, 40, 16], 10, {0: 3, 1: 5, 2: 17})
    assert switched == {0: 18, 1: 18, 2: 18} and set(globals_) == {96}


def test_a_rank_whose_size_stays_is_not_waited_for():
    switched, _ = run([32, 32, 32], [48, 32, 16], 4, {0: 1, 2: 2})
    assert switched == {0: 4, 2: 4}


def test_a_later_command_supersedes_a_pending_one():
    resize = AgreedResize()
    first, second = command(0, 40, 10, 96), command(0, 44, 20, 96)
    assert resize.receive(first) is None and resize.receive(second) is first
    assert resize.pending is second


@given(CASES)
def test_every_changed_rank_switches_at_one_step_and_the_global_batch_never_moves(case):
    old, new, effective, arrival_steps = case
    arrivals = {rank: step for rank, step in enumerate(arrival_steps) if new[rank] != old[rank]}
    switched, globals_ = run(old, list(new), effective, arrivals)
    assert set(globals_) == {sum(old)}
    assert set(switched) == set(arrivals)
    if arrivals:
        assert set(switched.values()) == {max(effective, max(arrivals.values()) + 1)}


@given(CASES)
def test_commands_sent_by_hand_keep_the_global_batch_too(case):
    old, new, effective, arrival_steps = case
    arrivals = {rank: step for rank, step in enumerate(arrival_steps) if new[rank] != old[rank]}
    switched, globals_ = run(old, list(new), effective, arrivals, counted=False)
    assert set(globals_) == {sum(old)} and set(switched) == set(arrivals)


@given(st.integers(0, 10_000), st.integers(1, 64))
def test_an_even_split_keeps_the_total(total, parts):
    sizes = split_evenly(total, parts)
    assert sum(sizes) == total and max(sizes) - min(sizes) <= 1 and len(sizes) == parts
