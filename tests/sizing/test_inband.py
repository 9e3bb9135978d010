"""In-band sizing: every rank reaches the same split from the same summed counters, one step after a
change."""

from __future__ import annotations

import pytest

from antdt.sizing.inband import PROBE_EVERY, TICK_S, InBandSizer


def step(sizers, step_s_per_rank):
    """One all-reduce: each rank's counters summed, every sizer deciding from the sum."""
    world = len(sizers)
    sums = [0] * (2 * world)
    for sizer in sizers:
        x = sizer.size
        for i, value in enumerate(sizer.encode(x, step_s_per_rank[sizer.rank](x))):
            sums[i] += value
    return [sizer.decide(sums) for sizer in sizers]


def ranks(world=3, size=32, **knobs):
    return [InBandSizer(world, r, [size] * world, **knobs) for r in range(world)]


def linear(fixed_s, per_sample_s):
    return lambda x: fixed_s + per_sample_s * x


def test_every_rank_reaches_the_same_split_after_the_first_step_and_the_global_batch_holds():
    sizers = ranks()
    speeds = [linear(0, 0.01), linear(0, 0.01), linear(0, 0.04)]  # rank 2 is 4x slower
    sizes = step(sizers, speeds)
    # the slowest step 0.43 s; proportional 43 / 42 / 11 would take 0.44 s
    assert sizes == [43, 43, 10]
    assert all(s.sizes == [43, 43, 10] for s in sizers)


def test_a_slowdown_is_answered_at_the_next_step():
    sizers = ranks()
    even = [linear(0, 0.01)] * 3
    for _ in range(3):
        assert step(sizers, even) == [32, 32, 32]  # balanced: nothing moves
    assert all(sizer.saving_s == 0 for sizer in sizers)
    slowed = [linear(0, 0.01), linear(0, 0.01), linear(0, 0.03)]
    sizes = step(sizers, slowed)
    assert sizes[2] < 20 and sum(sizes) == 96
    # what the move gains, the same on every rank (the job cuts the taken batch when it is worth
    # a collective): the slowest step from 0.96 s to rank 2's new one
    then_s = max(0.01 * sizes[0], 0.01 * sizes[1], 0.03 * sizes[2])
    for sizer in sizers:
        assert sizer.saving_s == pytest.approx(0.96 - then_s)


def test_the_fixed_part_is_learnt_from_the_resizes_and_shapes_the_split():
    sizers = ranks(world=2)
    # 10 samples' worth of fixed cost, rank 1 4x slower
    speeds = [linear(0.10, 0.01), linear(0.40, 0.04)]
    first = step(sizers, speeds)  # proportional: the fixed part is not known yet
    assert first in ([51, 13], [52, 12])
    # the proportional split leaves the straggler slow: it is cut again, at another size
    step(sizers, speeds)
    settled = step(sizers, speeds)  # those two sizes showed the fixed part
    assert settled[1] <= 7 and sum(settled) == 64
    assert step(sizers, speeds) == settled  # and it stays


def test_jitter_under_the_gain_moves_nothing():
    sizers = ranks(world=2, size=32)
    jitter = iter([1.0, 1.02, 0.99, 1.03, 1.0, 0.98] * 4)

    def noisy(x):
        return 0.01 * x * next(jitter)

    for _ in range(10):
        step(sizers, [noisy, linear(0, 0.01)])
    assert sizers[0].resizes == 0 and sizers[0].sizes == [32, 32]


def test_an_empty_step_says_nothing_and_bad_arguments_are_refused():
    sizer = InBandSizer(2, 0, [4, 4])
    # rank 0 had nothing: no model for it yet
    assert sizer.decide([0, 0, 4, round(0.1 / TICK_S)]) == 4
    with pytest.raises(ValueError):
        InBandSizer(2, 2, [4, 4])


def test_a_short_first_step_still_sets_the_first_split():
    sizers = ranks(world=2)
    sums = [0] * 4
    # both short; rank 1 4x slower
    for sizer, (samples, step_s) in zip(sizers, ((16, 0.16), (16, 0.64))):
        sums = [a + b for a, b in zip(sums, sizer.encode(samples, step_s))]
    assert [sizer.decide(sums) for sizer in sizers] in ([51, 13], [52, 12])


def test_a_checkpoints_sizes_are_restored_only_if_they_fit_the_group():
    sizer = InBandSizer(2, 1, [32, 32])
    sizer.restore([50, 14])
    assert sizer.size == 14
    with pytest.raises(ValueError):
        sizer.restore([50, 50])  # not the global batch


def test_a_rank_whose_fixed_part_outlasts_the_step_sits_out_and_is_retimed_now_and_then():
    sizers = ranks(world=4)
    # 15 samples' worth of fixed cost; rank 3 4x slower at both
    fast, slow = linear(0.15, 0.01), linear(0.60, 0.04)
    settled = [step(sizers, [fast, fast, fast, slow]) for _ in range(3)][-1]
    # its 0.6 s alone outlasts the others' 0.58 s step
    assert settled[3] == 0 and sum(settled) == 128
    later = [step(sizers, [fast, fast, fast, slow]) for _ in range(PROBE_EVERY + 1)]
    probes = [i for i, sizes in enumerate(later) if sizes[3]]
    # still too slow: out again
    assert len(probes) == 1 and later[probes[0]][3] == 1 and later[probes[0] + 1] == settled
    recovered = [step(sizers, [fast] * 4) for _ in range(PROBE_EVERY + 2)]
    # the next probe shows it fast: it takes its share at once
    assert recovered[-1] == [32, 32, 32, 32]
    assert all(sum(sizes) == 128 for sizes in later + recovered)
