"""AntDT-DD: the split follows the step-time model, one switch step, one decision per measured
change (no Kafka)."""

from __future__ import annotations

from antdt.schemas.models import CommandAction
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.dd import DedicatedPolicy
from antdt.services.controller.state import JobView
from tests.services.controller.helpers import at, report

POLICY = DedicatedPolicy()


def feed(job: JobView, metrics) -> None:
    """``metrics``, after an opening report of the same speed where it is its incarnation's first
    (the opening report carries one-off costs: never a model's data)."""
    view = job.worker(metrics.worker_id)
    if not view.windows or view.incarnation != metrics.incarnation:
        count = metrics.last_step - metrics.first_step + 1
        job.on_metrics(
            metrics.model_copy(
                update={
                    "first_step": metrics.first_step - count,
                    "last_step": metrics.first_step - 1,
                    "window_start": metrics.window_start
                    - (metrics.window_end - metrics.window_start),
                    "window_end": metrics.window_start,
                }
            )
        )
    job.on_metrics(metrics)


def job_with(speeds: dict[str, float], batch: int = 32, step: int = 100, t: float = 0.0) -> JobView:
    job = JobView("job")
    for worker, speed in speeds.items():
        feed(job, report(worker, speed, batch, step, t=t))
    return job


def decide(job: JobView, config: ControllerConfig, t: float):
    """One decision, kept as the controller keeps it (memo stored, commanded sizes recorded)."""
    worker = next(iter(job.workers))
    decision = POLICY.decide(job, report(worker, 100, 32, 100), config, at(t))
    if decision.memo is not None:
        job.memo[POLICY.name] = decision.memo
    return decision


def sizes_of(decision) -> dict[str, int]:
    return {i.target_worker: i.batch_size for i in decision.intents}


def test_batches_follow_throughput_and_keep_the_global_batch():
    decision = decide(job_with({"a": 100, "b": 100, "c": 200}), ControllerConfig(), 0)
    assert sizes_of(decision) == {"a": 24, "b": 24, "c": 48}
    assert {i.global_batch_size for i in decision.intents} == {96}
    assert all(i.action is CommandAction.ADJUST_BATCH_SIZE for i in decision.intents)


def test_every_worker_switches_at_one_step_ahead_of_all():
    job = JobView("job")
    for worker, step in (("a", 100), ("b", 103), ("c", 101)):
        feed(job, report(worker, 100 if worker != "c" else 300, 32, step, steps_per_s=5.0))
    decision = decide(job, ControllerConfig(switch_lead_s=2.0), 0)
    assert {i.effective_step for i in decision.intents} == {103 + 10 + 1}


def test_bounds_are_respected():
    job = job_with({"a": 10, "b": 1000, "c": 1000})
    decision = decide(job, ControllerConfig(min_batch_size=16, max_batch_size=40), 0)
    sizes = {w: job.workers[w].batch_size for w in job.workers} | sizes_of(decision)
    assert (
        sum(sizes.values()) == 96
        and all(16 <= s <= 40 for s in sizes.values())
        and sizes["a"] == 16
    )


def test_no_second_decision_until_every_worker_reported_from_after_the_switch():
    job = job_with({"a": 100, "b": 300})
    config = ControllerConfig(rebalance_interval_s=0)
    first = decide(job, config, 0)
    assert sizes_of(first) == {"a": 16, "b": 48}
    switch = first.intents[0].effective_step
    # still the old size: the command is on its way
    feed(job, report("a", 100, 32, switch - 1, t=1))
    feed(job, report("b", 300, 32, switch - 1, t=1))
    assert decide(job, config, 1).intents == ()
    feed(job, report("a", 100, 16, switch + 10, t=3))
    assert decide(job, config, 3).intents == ()  # b has not reported from after the switch
    feed(job, report("b", 150, 48, switch + 10, t=3))  # b slowed down meanwhile
    assert sizes_of(decide(job, config, 3)) == {"a": 26, "b": 38}  # 100 : 150 samples/s


def test_small_gains_and_early_rebalances_are_not_sent():
    assert decide(job_with({"a": 100, "b": 102}), ControllerConfig(), 0).intents == ()
    job = job_with({"a": 100, "b": 300})
    assert decide(job, ControllerConfig(rebalance_interval_s=10), 0).intents
    feed(job, report("a", 300, 32, 10_000, t=5))
    feed(job, report("b", 100, 32, 10_000, t=5))
    assert decide(job, ControllerConfig(rebalance_interval_s=10), 5).intents == ()


def test_the_fixed_part_learnt_from_the_first_switch_shapes_the_second():
    """Steps cost 0.01 s x (10 + batch) on a and 4x that on b; the first split is proportional, the
    second exact."""

    def step_report(worker, batch, step, t):
        per_sample = 0.01 if worker == "a" else 0.04
        return report(worker, batch / (per_sample * (10 + batch)), batch, step, t=t)

    job = JobView("job")
    for worker in "ab":
        # the first report carries one-off costs: not evidence
        feed(job, step_report(worker, 32, 95, -0.5))
        feed(job, step_report(worker, 32, 100, 0))
    config = ControllerConfig(rebalance_interval_s=0)
    first = decide(job, config, 0)
    # throughput alone: 32/0.42 vs 32/1.68 samples/s
    assert sizes_of(first) in ({"a": 51, "b": 13}, {"a": 52, "b": 12})
    switch = first.intents[0].effective_step
    for worker, batch in sizes_of(first).items():
        feed(job, step_report(worker, batch, switch + 5, 0.5))
    second = decide(job, config, 0.5)
    assert sizes_of(second) in ({"a": 57, "b": 7}, {"a": 58, "b": 6})
    assert "fixed part 10.0 samples" in second.intents[0].reason


def test_nothing_until_every_worker_has_reported():
    job = job_with({"a": 100, "b": 300})
    job.worker("c")  # known from a verdict, no report yet
    assert decide(job, ControllerConfig(), 0).intents == ()


def test_a_configured_global_batch_is_not_split_over_the_first_workers_to_report():
    # 64 of a global batch of 256: six more workers still to come
    job = job_with({"a": 100, "b": 300})
    config = ControllerConfig(global_batch_size=256)
    assert decide(job, config, 0).intents == ()
    assert decide(job, config, 4).intents == ()
    # nobody else came: the job is these two
    assert sum(sizes_of(decide(job, config, 6)).values()) == 256


def test_in_band_sizing_leaves_the_batches_to_the_workers():
    config = ControllerConfig(batch_sizing="in-band", rebalance_interval_s=0)
    assert decide(job_with({"a": 100, "b": 300}), config, 0).intents == ()


def test_a_worker_silent_for_long_has_left_and_the_rest_share_the_global_batch():
    job = job_with({"a": 100, "b": 100, "c": 100})
    for worker in ("a", "b"):  # c (an evicted node) reports no more
        feed(job, report(worker, 100 if worker == "a" else 300, 48, 200, t=20, incarnation="i2"))
    config = ControllerConfig(global_batch_size=96)
    assert decide(job, config, 10).intents == ()  # c not silent long enough yet: still counted
    assert sum(sizes_of(decide(job, config, 20)).values()) == 96


def test_nothing_until_as_many_workers_as_the_group_reports():
    job = JobView("job")
    for worker in ("r0", "r2"):  # r1 of a group of three has not reported yet
        feed(
            job,
            report(worker, 100 if worker == "r0" else 300, 32, 100).model_copy(
                update={"world_size": 3}
            ),
        )
    assert decide(job, ControllerConfig(), 0).intents == ()
    feed(job, report("r1", 100, 32, 100).model_copy(update={"world_size": 3}))
    assert sum(sizes_of(decide(job, ControllerConfig(), 0)).values()) == 96


def test_a_restarted_group_is_sized_again_from_its_own_steps():
    job = job_with({"a": 100, "b": 300})
    config = ControllerConfig(rebalance_interval_s=0)
    switch = decide(job, config, 0).intents[0].effective_step
    # restarted from a checkpoint far before the switch
    for worker, speed in (("a", 100), ("b", 100)):
        feed(
            job,
            report(worker, speed, 16 if worker == "a" else 48, switch - 50, t=5, incarnation="i2"),
        )
    assert sizes_of(decide(job, config, 5)) == {"a": 32, "b": 32}
