"""Drawn fault schedules: reproducible from the seed, one fault after another, every kind of fault
the chaos runs claim to survive among them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from antdt.demo.faults import WEIGHTS, FaultAction, ScheduleShape, Target, draw_schedule


def test_a_seed_always_draws_the_same_schedule_and_another_seed_another():
    assert draw_schedule(7) == draw_schedule(7)
    assert len({draw_schedule(seed) for seed in range(10)}) == 10


@given(st.integers(0, 2**32), st.integers(1, 30))
def test_a_schedule_is_faults_in_order_each_as_long_as_its_kind_allows(seed, faults):
    shape = ScheduleShape(faults=faults)
    schedule = draw_schedule(seed, shape)
    assert len(schedule) == faults
    times = [fault.at_s for fault in schedule]
    assert times[0] == shape.first_at_s and times == sorted(times)
    assert all(b - a >= shape.gap_s[0] - 0.1 for a, b in zip(times, times[1:]))
    assert sum(fault.target is Target.BROKER for fault in schedule) <= shape.broker_restarts
    for fault in schedule:
        assert (fault.action, fault.target) in WEIGHTS
        if fault.action is FaultAction.STOP:
            assert shape.stop_s[0] <= fault.hold_s <= shape.stop_s[1]
        elif fault.action is FaultAction.HOG:
            assert shape.hog_s[0] <= fault.hold_s <= shape.hog_s[1]
        else:
            assert fault.hold_s == 0
        assert not fault.mid_step or fault.target is Target.WORKER
        assert fault.name is None  # the victim is picked among those running when it goes off


def test_no_broker_restart_is_drawn_when_the_bus_is_not_ours():
    shape = ScheduleShape(faults=20, broker_restarts=0)
    drawn = [fault for seed in range(30) for fault in draw_schedule(seed, shape)]
    assert all(fault.target is not Target.BROKER for fault in drawn)


def test_thirty_seeds_try_every_kind_of_fault_stops_of_workers_and_services_included():
    drawn = {fault.label for seed in range(1, 31) for fault in draw_schedule(seed)}
    assert drawn == {f"{action.value} {target.value}" for action, target in WEIGHTS}
    every = [fault for seed in range(1, 31) for fault in draw_schedule(seed)]
    stops = [fault for fault in every if fault.action is FaultAction.STOP]
    assert any(f.mid_step for f in stops)  # a rank stopped in the middle of its collective
