"""The monitor engine: decoding, routing by job, run-time configuration (no Kafka)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from antdt.errors import AntdtError, CodecError, ConfigError
from antdt.loadgen.traces import TraceSlowdown, TraceSpec, generate
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.examples import control_config, worker_metrics
from antdt.schemas.models import ControlComponent, ControlConfig
from antdt.schemas.models import StragglerClass as C
from antdt.schemas.models import VerdictKind as K
from antdt.services.monitor.detection import DetectorConfig
from antdt.services.monitor.engine import MonitorEngine

CODEC = SingleObjectCodec()


def control(changes, job=None, component=ControlComponent.MONITOR):
    return ControlConfig(
        config_id="c",
        job_id=job,
        component=component,
        changes=changes,
        issued_by="t",
        issued_at=datetime.now(UTC),
    )


def feed(engine, reports):
    return [v for r in reports for v in engine.observe(r, now=0.0)]


def test_decode_accepts_worker_metrics_and_rejects_anything_else():
    engine = MonitorEngine(CODEC)
    report = worker_metrics()
    assert engine.decode(CODEC.encode(report)) == report
    with pytest.raises(CodecError):
        engine.decode(b"\xc3\x01garbage")
    with pytest.raises(AntdtError, match="expected WorkerMetrics, got ControlConfig"):
        engine.decode(CODEC.encode(control_config()))
    with pytest.raises(AntdtError, match="no value"):
        engine.decode(None)


def test_jobs_are_detected_independently():
    engine = MonitorEngine(CODEC)
    slow = generate(
        TraceSpec(seconds=40, episodes=[TraceSlowdown("w2", 10, 40, 3.0)], job_id="a"), seed=0
    )
    calm = generate(TraceSpec(seconds=40, job_id="b"), seed=0)
    verdicts = feed(engine, sorted(slow + calm, key=lambda r: r.window_end))
    assert {(v.job_id, v.worker_id) for v in verdicts} == {("a", "w2")}
    assert set(engine.jobs) == {"a", "b"}


def test_a_job_override_changes_only_that_job():
    engine = MonitorEngine(CODEC)
    assert engine.apply(
        control({"monitor.straggler_ratio": "1.1", "monitor.clear_ratio": "1.05"}, job="a")
    )
    mild = [TraceSlowdown("w1", 10, 40, 1.2)]
    verdicts = feed(engine, generate(TraceSpec(seconds=40, episodes=mild, job_id="a"), seed=1))
    verdicts += feed(engine, generate(TraceSpec(seconds=40, episodes=mild, job_id="b"), seed=1))
    assert {v.job_id for v in verdicts} == {"a"}
    assert (
        engine.config_for("a").straggler_ratio == 1.1 and engine.config_for("b") == DetectorConfig()
    )


def test_a_default_change_reaches_running_jobs_and_keeps_their_overrides():
    engine = MonitorEngine(CODEC)
    feed(engine, generate(TraceSpec(seconds=5, job_id="a"), seed=0))
    engine.apply(control({"monitor.k": "3"}, job="a"))
    engine.apply(control({"monitor.window_s": "20"}))
    assert (
        engine.jobs["a"].detector.config.window_s == 20 and engine.jobs["a"].detector.config.k == 3
    )
    assert engine.config_for("new").k == 2


def test_an_invalid_change_is_refused_and_changes_nothing():
    engine = MonitorEngine(CODEC)
    feed(engine, generate(TraceSpec(seconds=5, job_id="a"), seed=0))
    for changes in (
        {"monitor.k": "two"},
        {"monitor.clear_ratio": "2.0"},
        {"monitor.nope": "1"},
        {"controller.x": "1"},
    ):
        with pytest.raises(ConfigError):
            engine.apply(control(changes))
    with pytest.raises(ConfigError):  # the job's own override would break an invariant
        engine.apply(control({"monitor.straggler_ratio": "1.05"}, job="a"))
    assert engine.jobs["a"].detector.config == DetectorConfig() and engine.config.overrides == {}


def test_records_for_other_components_are_ignored_and_all_takes_monitor_keys():
    engine = MonitorEngine(CODEC)
    assert not engine.apply(
        control({"controller.dry_run": "true"}, component=ControlComponent.CONTROLLER)
    )
    assert engine.apply(
        control({"controller.dry_run": "true", "monitor.k": "4"}, component=ControlComponent.ALL)
    )
    assert engine.config.defaults.k == 4


def test_idle_jobs_are_forgotten():
    engine = MonitorEngine(CODEC, idle_job_s=60)
    for report in generate(TraceSpec(seconds=3, job_id="old"), seed=0):
        engine.observe(report, now=0.0)
    for report in generate(TraceSpec(seconds=3, job_id="live"), seed=0):
        engine.observe(report, now=100.0)
    assert engine.forget_idle(now=120.0) == ["old"] and set(engine.jobs) == {"live"}


def test_redelivered_reports_are_dropped():
    engine = MonitorEngine(CODEC)
    reports = generate(TraceSpec(seconds=40, episodes=[TraceSlowdown("w2", 10, 40, 3.0)]), seed=0)
    once = feed(engine, reports)
    again = feed(engine, reports)  # a whole redelivery, as after a rebalance
    assert once and again == []


def test_a_restarted_worker_ends_its_episode():
    engine = MonitorEngine(CODEC)
    reports = generate(TraceSpec(seconds=20, episodes=[TraceSlowdown("w2", 5, 20, 3.0)]), seed=0)
    assert [v.kind for v in feed(engine, reports)] == [K.STRAGGLER]
    later = generate(TraceSpec(seconds=22, start_s=reports[-1].window_end.timestamp()), seed=1)
    restarted = [
        r.model_copy(update={"incarnation": "new"})
        if r.worker_id == "w2"
        # the others go on counting
        else r.model_copy(update={"seq": r.seq + 1000})
        for r in later
    ]
    verdicts = feed(engine, restarted)
    assert [(v.worker_id, v.kind, v.classification) for v in verdicts] == [
        ("w2", K.CLEARED, C.NONE)
    ]


def test_parameter_servers_are_compared_with_each_other_not_with_the_workers():
    """A PS shard's step (one applied update, a millisecond) would make every worker look slow, or
    itself a leader."""
    engine = MonitorEngine(CODEC)
    workers = generate(TraceSpec(seconds=40, job_id="j"), seed=3)
    servers = [
        r.model_copy(
            update={"worker_id": f"ps-{r.worker_id}", "role": "ps", "samples": r.samples * 10}
        )
        for r in generate(TraceSpec(seconds=40, job_id="j", workers=3), seed=4)
    ]
    verdicts = feed(engine, sorted(workers + servers, key=lambda r: r.window_end))
    assert verdicts == []
    entry = engine.jobs["j"]
    assert set(entry.roles) == {"ps"} and all(
        w.startswith("ps-") for w in entry.roles["ps"].workers
    )
    assert not any(w.startswith("ps-") for w in entry.detector.workers)
