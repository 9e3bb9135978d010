"""Messages the models accept, however extreme, never crash a decision.

Hypothesis builds valid messages with values anywhere in their ranges
(shard ids up to 2**63, datasets of any size, durations from nothing to
1e300 s, dates across two centuries) and feeds them to the pure cores: the
sharder's decides or refuses whole (ProgressRejected, its state untouched,
so the service can dead-letter the report), the controller's decides, the
monitor's engine refuses only what it names as implausible and publishes
only verdicts the controller can read. Two detector bugs found this way
(a division by a zero median, an infinite ratio against a denormal one) have
tests of their own below.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from antdt.errors import AntdtError
from antdt.schemas import examples
from antdt.schemas.models import ProgressKind, StepTimeStats, WorkerMetrics
from antdt.services.controller.core import ControllerCore
from antdt.services.monitor.engine import MonitorEngine
from antdt.services.sharder.core import CoreConfig, ProgressRejected, ShardCore
from antdt.services.sharder.state import JobState
from tests.reliability.fuzz import (
    CODEC,
    FIXED_TIME,
    job_traces,
    shard_reports,
    verdicts,
    worker_reports,
)

PROPERTY = hypothesis_settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def _rewind_target(log: list, version: int) -> JobState:
    """The fold of the log up to ``version``, as the sharder service builds it for a rewind."""
    target = JobState("job")
    for event in log:
        if event.seq > version:
            break
        target.apply(event)
    return target


@PROPERTY
@given(first=shard_reports("job"), reports=st.lists(shard_reports("job"), max_size=12))
def test_the_sharder_core_refuses_the_impossible_without_changing_anything(first, reports):
    """Any report the model accepts is either decided or refused whole: never a crash, never half a
    change."""
    core = ShardCore(JobState("job"), CoreConfig(max_shards=500))
    log = [core.elect(1, 0, "test")]
    for now_ms, report in enumerate([first, *reports], start=1):
        before = (core.state.last_seq, core.state.logical_view())
        try:
            if report.kind is ProgressKind.REWIND:
                crosses = (
                    core.state.dataset is not None and report.version < core.state.epoch_opened_seq
                )
                target = _rewind_target(log, report.version) if crosses else None
                outcome = core.rewind(report, now_ms, target)
            else:
                outcome = core.on_progress(report, now_ms)
        except ProgressRejected:
            assert (core.state.last_seq, core.state.logical_view()) == before
            continue
        log += outcome.events
        log += core.expire_leases(now_ms * 10_000)


@PROPERTY
@given(events=st.lists(st.one_of(verdicts("job"), worker_reports("job")), max_size=15))
def test_the_controller_core_decides_on_any_valid_event(events):
    core = ControllerCore()
    now = datetime.now(UTC)
    for event in events:
        if isinstance(event, WorkerMetrics):
            core.on_metrics(event, now)
        else:
            core.on_verdict(event, now)


@hypothesis_settings(PROPERTY, max_examples=60)  # each example is a whole trace of up to 48 reports
@given(reports=job_traces("job"))
def test_the_monitor_engine_judges_any_valid_report_and_publishes_valid_verdicts(reports):
    engine = MonitorEngine(CODEC)
    for report in reports:
        for verdict in engine.observe(report, now=0.0):
            CODEC.decode(CODEC.encode(verdict))  # what it publishes, the controller can read


def tick(worker: str, second: int, busy_s: float, samples: int = 32) -> WorkerMetrics:
    """One report of ``worker`` for the second ending at ``second``, all of it compute."""
    end = FIXED_TIME + timedelta(seconds=second)
    stats = StepTimeStats(sum_s=busy_s, min_s=busy_s, max_s=busy_s, p50_s=busy_s, p90_s=busy_s)
    return examples.worker_metrics().model_copy(
        update={
            "job_id": "job",
            "worker_id": worker,
            "seq": second,
            "window_start": end - timedelta(seconds=1),
            "window_end": end,
            "step_count": 1,
            "first_step": second,
            "last_step": second,
            "compute": stats,
            "data_wait_s": 0.0,
            "samples": samples,
        }
    )


def test_workers_that_only_wait_at_barriers_are_not_judged_against_a_zero_median():
    engine = MonitorEngine(CODEC)
    verdicts = [
        v
        for second in range(1, 4)
        for worker in ("w0", "w1", "w2")
        for v in engine.observe(tick(worker, second, 0.0), now=0.0)
    ]
    assert verdicts == []


@pytest.mark.parametrize(("fast_s", "judged"), [(1e-320, False), (1e-9, True)])
def test_verdict_scores_stay_finite_against_a_vanishing_median(fast_s, judged):
    """A denormal median is no measurement (nobody is judged); a tiny real one gives finite,
    readable scores."""
    engine = MonitorEngine(CODEC)
    published = [
        CODEC.decode(CODEC.encode(verdict))
        for second in range(1, 8)
        for worker, busy in (("w0", fast_s), ("w1", fast_s), ("w2", fast_s), ("w3", 1.0))
        for verdict in engine.observe(tick(worker, second, busy, samples=1), now=0.0)
    ]
    assert bool(published) is judged
    assert all(math.isfinite(v.speed_ratio) and math.isfinite(v.relative_score) for v in published)


@PROPERTY
@given(report=worker_reports("job"))
def test_the_monitor_engine_refuses_only_implausible_reports(report):
    try:
        MonitorEngine(CODEC).observe(report, now=0.0)
    except AntdtError as exc:
        assert "in one report" in str(exc) or "is outside" in str(exc)
