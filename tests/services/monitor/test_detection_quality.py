"""Detection quality on synthetic traces over many seeds (no Kafka)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from antdt.loadgen.traces import TraceSlowdown, TraceSpec, generate
from antdt.schemas.models import StragglerClass as C
from antdt.schemas.models import VerdictKind as K
from antdt.services.monitor.detection import JobDetector

SEEDS = range(12)


def run(spec: TraceSpec, seed: int):
    detector = JobDetector("trace")
    verdicts = []
    for report in generate(spec, seed):
        verdicts += detector.observe(report)
    return verdicts


def onset_delay(spec: TraceSpec, verdicts, worker: str, onset_s: float) -> float | None:
    first = next((v for v in verdicts if v.worker_id == worker and v.kind is K.STRAGGLER), None)
    return None if first is None else first.issued_at.timestamp() - (spec.start_s + onset_s)


@pytest.mark.parametrize("seed", SEEDS)
def test_homogeneous_workers_with_noise_give_no_verdict(seed):
    assert run(TraceSpec(seconds=120, noise=0.2), seed) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_persistent_slowdown_is_detected_and_classed_persistent(seed):
    spec = TraceSpec(seconds=90, episodes=[TraceSlowdown("w3", 20, 90, 1.5)])
    verdicts = run(spec, seed)
    mine = [(v.kind, v.classification) for v in verdicts if v.worker_id == "w3"]
    assert mine[:2] == [(K.STRAGGLER, C.TRANSIENT), (K.STRAGGLER, C.PERSISTENT)]
    assert all(v.worker_id == "w3" for v in verdicts)
    assert onset_delay(spec, verdicts, "w3", 20) <= 3.0


@pytest.mark.parametrize("seed", SEEDS)
def test_short_episodes_are_transient_and_cleared(seed):
    spec = TraceSpec(
        seconds=90, episodes=[TraceSlowdown("w5", 20, 28, 3.0), TraceSlowdown("w5", 50, 57, 3.0)]
    )
    verdicts = [(v.kind, v.classification) for v in run(spec, seed)]
    assert verdicts == [(K.STRAGGLER, C.TRANSIENT), (K.CLEARED, C.NONE)] * 2


@pytest.mark.parametrize("seed", SEEDS)
def test_fixed_heterogeneous_speeds_are_deterministic_with_leaders(seed):
    speeds = {"w0": 2.0, "w1": 0.6, "w2": 0.6}
    verdicts = run(TraceSpec(seconds=60, speeds=speeds), seed)
    first = {v.worker_id: (v.kind, v.classification) for v in reversed(verdicts)}
    assert first == {
        "w0": (K.STRAGGLER, C.DETERMINISTIC),
        "w1": (K.LEADER, C.DETERMINISTIC),
        "w2": (K.LEADER, C.DETERMINISTIC),
    }


@pytest.mark.parametrize("seed", SEEDS)
def test_waiting_at_barriers_is_never_straggling(seed):
    assert run(TraceSpec(seconds=60, barrier_wait={"w2": 0.3, "w6": 0.1}), seed) == []


@pytest.mark.parametrize("seed", SEEDS)
def test_a_batch_size_change_is_not_a_slowdown(seed):
    assert run(TraceSpec(seconds=60, batch_changes={"w4": (20, 96), "w1": (30, 8)}), seed) == []


def test_quality_report_over_all_seeds():
    """Precision, recall and onset delay over every straggler scenario and seed.

    Onsets fall at a random point inside a report interval, as they do in
    real jobs (an onset on a report boundary is the best case, 2 intervals).
    """
    delays, true_positive, false_positive, missed = [], 0, 0, 0
    for seed in SEEDS:
        phase = random.Random(seed).random()
        for factor in (1.5, 2.0, 4.0):
            onset = 20 + phase
            spec = TraceSpec(seconds=60, episodes=[TraceSlowdown("w1", onset, 60, factor)])
            verdicts = run(spec, seed)
            onsets = Counter(
                v.worker_id
                for v in verdicts
                if v.kind is K.STRAGGLER and v.classification is C.TRANSIENT
            )
            true_positive += onsets.pop("w1", 0) > 0
            missed += "w1" not in {v.worker_id for v in verdicts}
            false_positive += sum(onsets.values())
            delay = onset_delay(spec, verdicts, "w1", onset)
            if delay is not None:
                delays.append(delay)
    precision = true_positive / (true_positive + false_positive)
    recall = true_positive / (true_positive + missed)
    delays.sort()
    print(
        f"precision {precision:.3f} recall {recall:.3f} "
        f"delay p50 {delays[len(delays) // 2]:.2f}s max {delays[-1]:.2f}s"
    )
    assert precision == 1.0 and recall == 1.0
    assert delays[-1] <= 3.0
