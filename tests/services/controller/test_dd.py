"""AntDT-DD: exact allocation, bounds, damping, one switch step (no Kafka)."""

from __future__ import annotations

from hypothesis import given, settings as hsettings, strategies as st

from antdt.schemas.models import CommandAction
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.dd import DedicatedPolicy, allocate
from antdt.services.controller.state import JobView
from tests.services.controller.helpers import at, report

POLICY = DedicatedPolicy()


@hsettings(max_examples=300, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=0, max_value=1e4, allow_nan=False), min_size=1, max_size=40),
    low=st.integers(1, 16), span=st.integers(0, 512), data=st.data(),
)
def test_allocation_sums_exactly_within_bounds(weights, low, span, data):
    high = low + span
    total = data.draw(st.integers(len(weights) * low, len(weights) * high))
    sizes = allocate(total, weights, low, high)
    assert sizes is not None
    assert sum(sizes) == total and all(low <= s <= high for s in sizes)


@hsettings(max_examples=200, deadline=None)
@given(weights=st.lists(st.floats(min_value=0.1, max_value=100), min_size=1, max_size=30), total=st.integers(1, 10_000))
def test_unbounded_allocation_is_proportional_to_within_one(weights, total):
    sizes = allocate(total, weights, 0, total)
    ideal = [total * w / sum(weights) for w in weights]
    assert all(abs(s - i) < 1 for s, i in zip(sizes, ideal))


def test_impossible_allocations_are_refused():
    assert allocate(5, [1, 1, 1], 2, 3) is None  # 3 x 2 > 5
    assert allocate(10, [1, 1], 1, 4) is None  # 2 x 4 < 10
    assert allocate(10, [], 1, 4) is None


def job_with(speeds: dict[str, float], batch: int = 32, step: int = 100, t: float = 0.0) -> JobView:
    job = JobView("job")
    for worker, speed in speeds.items():
        job.on_metrics(report(worker, speed, batch, step, t=t))
    return job


def test_batches_follow_throughput_and_keep_the_global_batch():
    job = job_with({"a": 100, "b": 100, "c": 200})
    decision = POLICY.decide(job, report("c", 200, 32, 100), ControllerConfig(), at(0))
    sizes = {i.target_worker: i.batch_size for i in decision.intents}
    assert sizes == {"a": 24, "b": 24, "c": 48}
    assert {i.global_batch_size for i in decision.intents} == {96}
    assert all(i.action is CommandAction.ADJUST_BATCH_SIZE for i in decision.intents)


def test_every_worker_switches_at_one_step_ahead_of_all():
    job = JobView("job")
    for worker, step in (("a", 100), ("b", 103), ("c", 101)):
        job.on_metrics(report(worker, 100 if worker != "c" else 300, 32, step, steps_per_s=5.0))
    decision = POLICY.decide(job, report("c", 300, 32, 101), ControllerConfig(switch_lead_s=2.0), at(0))
    assert {i.effective_step for i in decision.intents} == {103 + 10 + 1}


def test_bounds_are_respected():
    job = job_with({"a": 10, "b": 1000, "c": 1000})
    config = ControllerConfig(min_batch_size=16, max_batch_size=40)
    decision = POLICY.decide(job, report("a", 10, 32, 100), config, at(0))
    sizes = {w: job.workers[w].batch_size for w in job.workers} | {i.target_worker: i.batch_size for i in decision.intents}
    assert sum(sizes.values()) == 96 and all(16 <= s <= 40 for s in sizes.values()) and sizes["a"] == 16


def test_a_reversal_halves_the_step():
    job = job_with({"a": 100, "b": 300})  # targets 16 / 48 from 32 / 32
    config = ControllerConfig(rebalance_interval_s=0)
    first = POLICY.decide(job, report("a", 100, 32, 100), config, at(0))
    assert {i.target_worker: i.batch_size for i in first.intents} == {"a": 16, "b": 48}
    job.memo[POLICY.name] = first.memo
    for intent in first.intents:
        job.workers[intent.target_worker].batch_size = intent.batch_size
    job.workers["a"].samples_per_s, job.workers["b"].samples_per_s = 300, 100  # the estimate swings back
    second = POLICY.decide(job, report("a", 300, 16, 120), config, at(10))
    assert {i.target_worker: i.batch_size for i in second.intents} == {"a": 32, "b": 32}  # half of the way to 48 / 16
    assert second.memo.gains == {"a": 0.5, "b": 0.5}


def test_small_changes_and_early_rebalances_are_not_sent():
    job = job_with({"a": 100, "b": 102})
    assert POLICY.decide(job, report("a", 100, 32, 100), ControllerConfig(), at(0)).intents == ()
    job = job_with({"a": 100, "b": 300})
    first = POLICY.decide(job, report("a", 100, 32, 100), ControllerConfig(rebalance_interval_s=10), at(0))
    job.memo[POLICY.name] = first.memo
    assert POLICY.decide(job, report("a", 100, 32, 100), ControllerConfig(rebalance_interval_s=10), at(5)).intents == ()


def test_nothing_until_every_worker_has_reported():
    job = job_with({"a": 100, "b": 300})
    job.worker("c")  # known from a verdict, no report yet
    assert POLICY.decide(job, report("a", 100, 32, 100), ControllerConfig(), at(0)).intents == ()
