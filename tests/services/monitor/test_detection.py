"""The detector's mechanics: verdict contents, evidence, baseline membership."""

from __future__ import annotations

from antdt.loadgen.traces import TraceSlowdown, TraceSpec, generate
from antdt.schemas.codec import SingleObjectCodec
from antdt.schemas.models import EvidenceCause, StragglerVerdict, VerdictKind
from antdt.services.monitor.detection import DetectorConfig, JobDetector


def verdicts_for(spec: TraceSpec, config: DetectorConfig | None = None, seed: int = 0, mutate=None):
    detector = JobDetector("trace", config)
    out = []
    for report in generate(spec, seed):
        if mutate is not None:
            report = mutate(report)
        out += detector.observe(report)
    return out


def test_verdicts_are_valid_messages_that_round_trip():
    codec = SingleObjectCodec()
    verdicts = verdicts_for(TraceSpec(seconds=70, episodes=[TraceSlowdown("w2", 10, 70, 2.0)]))
    assert verdicts
    for verdict in verdicts:
        decoded = codec.decode(codec.encode(StragglerVerdict.model_validate(verdict.model_dump())))
        assert decoded.verdict_id == verdict.verdict_id and decoded.speed_ratio > 1.3
    assert len({v.verdict_id for v in verdicts}) == len(verdicts)


def test_cpu_steal_is_given_as_evidence():
    def steal(report):
        if report.worker_id != "w2":
            return report
        resources = report.resources.model_copy(update={"cpu_steal_percent": 30.0})
        return report.model_copy(update={"resources": resources})

    verdicts = verdicts_for(
        TraceSpec(seconds=40, episodes=[TraceSlowdown("w2", 10, 40, 2.0)]), mutate=steal
    )
    causes = {e.cause for e in verdicts[0].evidence}
    assert verdicts[0].kind is VerdictKind.STRAGGLER and EvidenceCause.CPU_STEAL in causes


def test_gpu_figures_are_given_as_evidence_when_there_is_a_gpu():
    def gpu(report):
        busy = 99.0 if report.worker_id == "w2" else 60.0  # a competitor on w2's GPU
        resources = report.resources.model_copy(
            update={
                "gpu_utilization_percent": busy,
                "gpu_memory_used_bytes": 8 << 30,
                "gpu_memory_total_bytes": 16 << 30,
            }
        )
        return report.model_copy(update={"resources": resources})

    verdicts = verdicts_for(
        TraceSpec(seconds=40, episodes=[TraceSlowdown("w2", 10, 40, 2.0)]), mutate=gpu
    )
    gpu_evidence = [e for e in verdicts[0].evidence if e.cause is EvidenceCause.GPU]
    assert [(e.metric, e.value, e.baseline) for e in gpu_evidence] == [
        ("resources.gpu_utilization_percent", 99.0, 60.0)
    ]
    without_gpu = verdicts_for(TraceSpec(seconds=40, episodes=[TraceSlowdown("w2", 10, 40, 2.0)]))
    assert all(e.cause is not EvidenceCause.GPU for e in without_gpu[0].evidence)


def test_too_few_workers_give_no_baseline_and_no_verdict():
    assert (
        verdicts_for(TraceSpec(workers=2, seconds=40, episodes=[TraceSlowdown("w1", 10, 40, 4.0)]))
        == []
    )


def test_a_pair_asked_to_be_judged_names_the_slower_member_and_only_it():
    spec = TraceSpec(workers=2, seconds=40, episodes=[TraceSlowdown("w1", 10, 40, 4.0)])
    detector = JobDetector("trace", pairs=True)
    verdicts = [v for report in generate(spec, 0) for v in detector.observe(report)]
    assert verdicts and {v.worker_id for v in verdicts} == {"w1"}
    assert verdicts[0].kind is VerdictKind.STRAGGLER and verdicts[0].speed_ratio > 3
    quiet = JobDetector("trace", pairs=True)
    assert [
        v for r in generate(TraceSpec(workers=2, seconds=40), 0) for v in quiet.observe(r)
    ] == []


def test_thresholds_are_configurable():
    spec = TraceSpec(seconds=60, episodes=[TraceSlowdown("w1", 10, 60, 1.2)])
    assert verdicts_for(spec) == []  # 1.2x is under the default 1.3
    assert verdicts_for(spec, DetectorConfig(straggler_ratio=1.1, clear_ratio=1.05))


def test_slow_hardware_is_deterministic_however_late_its_verdict_and_a_slowdown_is_not():
    from antdt.schemas.models import StragglerClass

    # the verdict comes after the grace: only the speed history can tell
    late = DetectorConfig(join_grace_ticks=0)
    spec = TraceSpec(
        seconds=60, episodes=[TraceSlowdown("w1", 0, 60, 2.0), TraceSlowdown("w3", 20, 60, 3.0)]
    )
    onsets = {
        v.worker_id: v.classification
        for v in verdicts_for(spec, late)
        if v.kind is VerdictKind.STRAGGLER
    }
    assert onsets["w1"] is StragglerClass.DETERMINISTIC  # as slow as it has ever been
    # slower than its own past
    assert onsets["w3"] in (StragglerClass.TRANSIENT, StragglerClass.PERSISTENT)


def test_reports_in_which_a_worker_only_waited_are_not_judged():
    """At an epoch's end the workers wait for the last shards and report no samples; the one whose
    episode just ended must not be judged on its window, which still holds the episode."""
    from antdt.schemas.models import StepTimeStats

    idle = StepTimeStats(sum_s=0.0, min_s=0.0, max_s=0.0, p50_s=0.0, p90_s=0.0)
    start = next(iter(generate(TraceSpec(seconds=1), 0))).window_end

    def waits_from_20_to_24_s(report):
        if not 20 <= (report.window_end - start).total_seconds() < 24:
            return report
        return report.model_copy(
            update={"samples": 0, "step_count": 0, "compute": idle, "sync_wait_s": 1.0}
        )

    verdicts = verdicts_for(
        TraceSpec(seconds=30, episodes=[TraceSlowdown("w2", 8, 18, 3.0)]),
        mutate=waits_from_20_to_24_s,
    )
    kinds = [v.kind for v in verdicts if v.worker_id == "w2"]
    assert kinds == [VerdictKind.STRAGGLER, VerdictKind.CLEARED], kinds
