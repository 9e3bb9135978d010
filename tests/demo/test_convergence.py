"""Time to a target held-out loss from the evaluator's curve."""

from __future__ import annotations

from antdt.demo.convergence import time_to_target

CURVE = [(0.0, 2.3, 0.1), (1.1, 0.9, 0.6), (2.0, 0.45, 0.8), (3.2, 0.3, 0.9), (4.1, 0.5, 0.85)]


def test_the_first_measured_point_at_or_below_the_target_not_an_interpolation():
    assert time_to_target(CURVE, 0.5, 5.0, 0.28) == 2.0
    assert time_to_target(CURVE, 0.45, 5.0, 0.28) == 2.0  # at the target counts
    assert time_to_target(CURVE, 0.3, 5.0, 0.28) == 3.2  # a later rise does not undo it


def test_a_target_only_the_final_model_reaches_is_reached_at_the_wall_time():
    assert time_to_target(CURVE, 0.29, 5.0, 0.28) == 5.0
    assert time_to_target([], 0.29, 5.0, 0.28) == 5.0


def test_a_target_never_reached_or_no_target_gives_none():
    assert time_to_target(CURVE, 0.1, 5.0, 0.28) is None
    assert time_to_target(CURVE, 0.1, 5.0, None) is None  # the final model could not be read
    assert time_to_target(CURVE, None, 5.0, 0.28) is None
