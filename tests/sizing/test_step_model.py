"""The step-time model: the fixed part from a batch change, and the split that evens out the slowest
step."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from antdt.sizing.step_model import (
    POOLED_WINDOWS,
    StepModel,
    StepWindow,
    balance,
    current_model,
    fixed_part_evidence,
    fixed_parts,
    slowest_step_s,
    weighted_median,
    worth_moving,
)
from tests.services.controller.helpers import at

models = st.builds(StepModel, scale=st.floats(0.001, 1.0), fixed=st.floats(0.0, 50.0))


def window(
    t: float,
    batch: float,
    step_s: float,
    first: int = 0,
    steps: int = 2,
    size: int | None = None,
    opening: bool = False,
) -> StepWindow:
    return StepWindow(
        at(t),
        first,
        first + steps - 1,
        steps,
        batch,
        step_s,
        round(batch) if size is None else size,
        opening,
    )


@hsettings(max_examples=300, deadline=None)
@given(
    chosen=st.lists(models, min_size=1, max_size=20),
    low=st.integers(1, 16),
    span=st.integers(0, 256),
    data=st.data(),
)
def test_a_split_sums_exactly_within_bounds(chosen, low, span, data):
    high = low + span
    total = data.draw(st.integers(len(chosen) * low, len(chosen) * high))
    sizes = balance(total, chosen, low, high)
    assert sizes is not None and sum(sizes) == total and all(low <= s <= high for s in sizes)


@hsettings(max_examples=200, deadline=None)
@given(chosen=st.lists(models, min_size=1, max_size=3), total=st.integers(3, 24))
def test_the_split_has_the_shortest_slowest_step_of_all_splits(chosen, total):
    sizes = balance(total, chosen, 1, total)
    splits = (
        s for s in itertools.product(range(1, total + 1), repeat=len(chosen)) if sum(s) == total
    )
    best = min(slowest_step_s(chosen, s) for s in splits)
    assert slowest_step_s(chosen, sizes) == pytest.approx(best, rel=1e-9)


@hsettings(max_examples=200, deadline=None)
@given(speeds=st.lists(st.floats(0.1, 100), min_size=1, max_size=30), total=st.integers(30, 10_000))
def test_without_a_fixed_part_the_slowest_step_is_proportional_sizings_to_within_a_sample(
    speeds, total
):
    chosen = [StepModel(1 / s, 0.0) for s in speeds]
    sizes = balance(total, chosen, 0, total)
    assert (
        slowest_step_s(chosen, sizes) <= total / sum(speeds) + max(m.scale for m in chosen) + 1e-9
    )


def test_impossible_splits_are_refused():
    one = StepModel(0.01, 0.0)
    assert balance(5, [one] * 3, 2, 3) is None  # 3 x 2 > 5
    assert balance(10, [one] * 2, 1, 4) is None  # 2 x 4 < 10
    assert balance(10, [], 1, 4) is None


def test_a_fixed_part_gives_the_straggler_less_than_its_share_of_throughput():
    fast, slow = StepModel(0.01, 10.0), StepModel(0.04, 10.0)  # 4x slower at everything
    sizes = balance(64, [fast, slow], 1, 64)
    assert sizes[1] <= 7 and slowest_step_s([fast, slow], sizes) == pytest.approx(0.68)
    # proportional sizing (51 / 13) would make the slowest step a third longer
    assert slowest_step_s([fast, slow], [51, 13]) > 1.3 * slowest_step_s([fast, slow], sizes)


def test_the_fixed_part_is_recovered_from_a_batch_change_at_one_speed():
    scale, fixed = 0.01, 14.0
    evidence = fixed_part_evidence(
        [window(0, 32, scale * (fixed + 32)), window(0.5, 20, scale * (fixed + 20))]
    )
    assert list(evidence) == [at(0.5)]
    assert evidence[at(0.5)][0] == pytest.approx(fixed) and evidence[at(0.5)][1] == pytest.approx(
        12 / 32
    )


def test_pairs_too_close_in_size_or_too_far_apart_in_time_or_not_full_say_nothing():
    assert fixed_part_evidence([window(0, 32, 0.4), window(0.5, 31, 0.39)]) == {}
    assert fixed_part_evidence([window(0, 32, 0.4), window(10, 16, 0.3)]) == {}
    # a short batch
    assert fixed_part_evidence([window(0, 20, 0.4, size=32), window(0.5, 32, 0.39)]) == {}
    # first steps
    assert fixed_part_evidence([window(0, 32, 0.9, opening=True), window(0.5, 16, 0.3)]) == {}


def test_a_worker_without_evidence_borrows_the_jobs_and_no_part_is_negative():
    parts = fixed_parts({"a": [(12.0, 0.4), (14.0, 0.4)], "b": [], "c": [(-3.0, 0.6)]})
    assert parts["b"] == parts["a"] in (12.0, 14.0)
    assert parts["c"] == 0.0
    assert fixed_parts({"a": [], "b": []}) == {"a": 0.0, "b": 0.0}


def test_weighted_median_weighs():
    assert weighted_median([(1.0, 1.0), (5.0, 3.0)]) == 5.0
    assert weighted_median([]) is None


def test_the_current_model_needs_a_report_from_after_the_switch():
    windows = [window(0, 32, 0.64, first=10), window(0.5, 16, 0.32, first=20)]  # steps 20 and 21
    assert current_model(windows, 22, 0.0) is None
    model = current_model(windows, 21, 0.0)
    assert model.scale == pytest.approx(0.02) and model.fixed == 0.0


def test_the_current_model_pools_the_latest_reports_and_never_the_opening_one():
    """One second of a busy machine is noise: the model pools the latest reports (their points lie
    on one line); the opening report's one-off costs never count."""
    opening = window(0, 32, 3.2, first=0, opening=True)  # 0.1 s a sample: set-up costs
    assert current_model([opening], 0, 0.0) is None
    noisy = [window(t, 32, step_s, first=10 * t) for t, step_s in enumerate((0.64, 0.96, 0.64))]
    # (0.64 + 0.96 + 0.64) / 3 over 32 samples: not the last report's 0.02, nor the opening's
    assert current_model([opening, *noisy], 0, 0.0).scale == pytest.approx(0.0233, abs=1e-4)
    many = [window(t, 32, 0.64, first=10 * t) for t in range(POOLED_WINDOWS + 3)]
    slow_first = [window(0, 32, 6.4, first=0), *many[1:]]
    assert current_model(slow_first, 0, 0.0).scale == pytest.approx(0.02)  # the latest only


def test_a_gain_small_against_the_whole_measured_step_is_not_worth_a_move():
    """Compute 0.7 ms of a 3 ms step (the rest the all-reduce): balancing a rank 20 % slower at
    compute saves 9 % of the compute but 2.5 % of the step, not worth moving batches; balancing a
    rank three times slower is."""
    even = [StepModel(0.7e-3 / 32, 0.0), StepModel(0.84e-3 / 32, 0.0)]
    split = balance(64, even, 1, 64)
    assert worth_moving(even, [32, 32], split, 0.05)  # the compute alone says move
    assert not worth_moving(even, [32, 32], split, 0.05, step_s=3e-3)
    slowed = [StepModel(0.7e-3 / 32, 0.0), StepModel(2.1e-3 / 32, 0.0)]
    assert worth_moving(slowed, [32, 32], balance(64, slowed, 1, 64), 0.05, step_s=4.1e-3)
