"""AntDT-ND: quotas for transient stragglers and leaders, budgeted replacement of persistent ones
(no Kafka)."""

from __future__ import annotations

from antdt.schemas.models import CommandAction as A
from antdt.schemas.models import StragglerClass as C
from antdt.schemas.models import VerdictKind as K
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.core import ControllerCore
from tests.services.controller.helpers import at, report, verdict


def actions(outcome):
    return [(c.action, c.target_worker) for c in outcome.commands]


def core_with(workers: int = 8, **config) -> ControllerCore:
    core = ControllerCore(ControllerConfig(**config))
    for i in range(workers):
        core.job("job").worker(f"w{i}").node_id = f"node-w{i}"
    return core


def test_a_transient_straggler_pulls_fewer_shards_until_cleared():
    core = core_with()
    onset = core.on_verdict(verdict("w1"), at(0))
    assert [(c.action, c.shard_quota) for c in onset.commands] == [(A.SET_SHARD_QUOTA, 1)]
    cleared = core.on_verdict(verdict("w1", K.CLEARED, t=20), at(20))
    assert [(c.action, c.shard_quota) for c in cleared.commands] == [(A.SET_SHARD_QUOTA, 2)]
    # nothing was changed for w2
    assert core.on_verdict(verdict("w2", K.CLEARED, t=21), at(21)).commands == ()


def test_a_leader_gets_more_shards_and_a_deterministic_straggler_fewer():
    core = core_with()
    assert [
        c.shard_quota
        for c in core.on_verdict(verdict("w0", K.LEADER, C.DETERMINISTIC), at(0)).commands
    ] == [4]
    assert [
        c.shard_quota for c in core.on_verdict(verdict("w3", cls=C.DETERMINISTIC), at(0)).commands
    ] == [1]


def test_a_persistent_straggler_is_replaced_away_from_its_node():
    core = core_with()
    core.on_verdict(verdict("w1", t=0), at(0))
    outcome = core.on_verdict(verdict("w1", cls=C.PERSISTENT, t=30), at(30))
    assert actions(outcome) == [(A.MARK_NODE_DEGRADED, "w1"), (A.RESTART, "w1")]
    assert outcome.commands[0].parameters == {"node": "node-w1"}
    assert "node-w1" in core.job("job").degraded_nodes
    assert all(
        c.verdict_id == verdict("w1", cls=C.PERSISTENT, t=30).verdict_id for c in outcome.commands
    )


def test_a_parameter_server_shard_gets_no_quota_and_is_moved_when_persistently_slow():
    core = core_with()
    core.on_metrics(report("ps-1", 1000.0, 32, 10).model_copy(update={"role": "ps"}), at(0))
    # it pulls no shards: no quota
    assert core.on_verdict(verdict("ps-1", t=0), at(0)).commands == ()
    outcome = core.on_verdict(verdict("ps-1", cls=C.PERSISTENT, t=30), at(30))
    assert actions(outcome) == [(A.MARK_NODE_DEGRADED, "ps-1"), (A.RESTART, "ps-1")]


def test_evict_can_replace_restart():
    outcome = core_with(persistent_action="EVICT").on_verdict(
        verdict("w1", cls=C.PERSISTENT), at(0)
    )
    assert actions(outcome)[-1] == (A.EVICT, "w1")


def test_restarts_per_hour_are_budgeted():
    core = core_with(workers=20, max_restarts_per_hour=2, max_acted_fraction=1.0, node_cooldown_s=0)
    done = [core.on_verdict(verdict(f"w{i}", cls=C.PERSISTENT, t=i), at(i)) for i in range(3)]
    assert [A.RESTART in {c.action for c in o.commands} for o in done] == [True, True, False]
    assert "budget of 2 restarts per hour spent" in done[2].skipped[0]
    later = core.on_verdict(verdict("w3", cls=C.PERSISTENT, t=3700), at(3700))
    assert A.RESTART in {c.action for c in later.commands}  # an hour on, the budget is back


def test_at_most_a_fraction_of_workers_is_replaced_at_once():
    core = core_with(workers=8, max_acted_fraction=0.25, max_restarts_per_hour=100)
    done = [core.on_verdict(verdict(f"w{i}", cls=C.PERSISTENT, t=i), at(i)) for i in range(3)]
    assert [A.RESTART in {c.action for c in o.commands} for o in done] == [True, True, False]
    assert "2 of 8 workers already being replaced (cap 2)" in done[2].skipped[0]


def test_a_worker_back_from_restart_no_longer_counts_as_acted_on():
    core = core_with(
        workers=4, max_acted_fraction=0.25, max_restarts_per_hour=100, worker_cooldown_s=0
    )
    core.on_verdict(verdict("w0", cls=C.PERSISTENT), at(0))
    core.on_metrics(report("w0", 100, 32, 10, t=1, incarnation="i1"), at(1))
    assert A.RESTART not in {
        c.action for c in core.on_verdict(verdict("w1", cls=C.PERSISTENT, t=2), at(2)).commands
    }
    # the replacement reports
    core.on_metrics(report("w0", 100, 32, 5, t=30, incarnation="i2"), at(30))
    assert A.RESTART in {
        c.action for c in core.on_verdict(verdict("w1", cls=C.PERSISTENT, t=31), at(31)).commands
    }


def test_cooldowns_per_worker_and_per_node():
    core = core_with(
        workers=10,
        max_acted_fraction=1.0,
        max_restarts_per_hour=100,
        worker_cooldown_s=600,
        node_cooldown_s=600,
    )
    core.on_verdict(verdict("w1", cls=C.PERSISTENT), at(0))
    again = core.on_verdict(verdict("w1", cls=C.PERSISTENT, t=100), at(100))
    assert (
        A.RESTART not in {c.action for c in again.commands}
        and "worker cooldown" in again.skipped[0]
    )
    neighbour = core.on_verdict(verdict("w2", cls=C.PERSISTENT, t=101, node="node-w1"), at(101))
    assert (
        A.RESTART not in {c.action for c in neighbour.commands}
        and "node cooldown" in neighbour.skipped[0]
    )
    assert A.RESTART in {
        c.action for c in core.on_verdict(verdict("w1", cls=C.PERSISTENT, t=700), at(700)).commands
    }


def test_a_successor_recalls_the_budget_spent_before_it():
    first = core_with(
        workers=20, max_restarts_per_hour=2, max_acted_fraction=1.0, node_cooldown_s=0
    )
    issued = [
        c
        for i in range(2)
        for c in first.on_verdict(verdict(f"w{i}", cls=C.PERSISTENT, t=i), at(i)).commands
    ]
    successor = core_with(
        workers=20, max_restarts_per_hour=2, max_acted_fraction=1.0, node_cooldown_s=0
    )
    assert successor.recall(issued) == len(issued)
    refused = successor.on_verdict(verdict("w5", cls=C.PERSISTENT, t=10), at(10))
    assert A.RESTART not in {c.action for c in refused.commands} and "budget" in refused.skipped[0]
    # acted on already
    assert successor.on_verdict(verdict("w0", cls=C.PERSISTENT, t=0), at(11)).commands == ()


def test_ten_minutes_of_a_homogeneous_job_with_20_percent_noise_restart_nobody():
    """The monitor and AntDT-ND as the nd plan runs them, on 8 equal workers whose load wanders +-20
    %."""
    from antdt.demo.plans import PLANS
    from antdt.loadgen.traces import TraceSpec, generate
    from antdt.services.monitor.detection import DetectorConfig, JobDetector

    config = DetectorConfig().with_changes(dict(PLANS["nd"].monitor))
    for seed in range(6):
        spec = TraceSpec(
            seconds=600, interval_s=0.5, noise=0.2, noise_period_s=10, job_id=f"job-{seed}"
        )
        detector, core, disruptive = (
            JobDetector(spec.job_id, config),
            ControllerCore(ControllerConfig()),
            [],
        )
        for metrics in generate(spec, seed):
            core.on_metrics(metrics, metrics.window_end)
            for found in detector.observe(metrics):
                outcome = core.on_verdict(found, found.issued_at)
                disruptive += [c for c in outcome.commands if c.action in (A.RESTART, A.EVICT)]
        assert disruptive == [], [(c.target_worker, c.reason) for c in disruptive]
