"""Synthetic WorkerMetrics traces with known stragglers, for tests and benchmarks.

Each worker runs steps of ``batch_size`` samples at ``base_s_per_sample``
(times a factor during its episodes) with uniform ±``noise`` per step (or
held for ``noise_period_s``, as a node's changing load would be), and
reports every ``interval_s`` the steps that ended in the interval, exactly as
the agent aggregates them. Workers may also wait at barriers (sync time,
never a slowdown of their own) and change batch size mid-run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from antdt.schemas.models import ResourceSnapshot, StepTimeStats, WorkerMetrics, trusted
from antdt.services.monitor.detection import utc

#: A busy, healthy worker's resources: nothing in them points to a cause.
IDLE_RESOURCES = ResourceSnapshot(
    process_cpu_percent=95,
    host_cpu_percent=50,
    cpu_steal_percent=0,
    load_1m=0.5,
    rss_bytes=10**9,
    host_memory_percent=40,
    io_read_bytes=0,
    io_write_bytes=0,
    net_sent_bytes=10**6,
    net_recv_bytes=10**6,
)


@dataclass(frozen=True)
class TraceSlowdown:
    """Worker ``worker`` is ``factor`` times slower from ``start_s`` to ``end_s``."""

    worker: str
    start_s: float
    end_s: float
    factor: float


@dataclass
class TraceSpec:
    workers: int = 8
    seconds: float = 120.0
    interval_s: float = 1.0
    base_s_per_sample: float = 0.004
    batch_size: int = 32
    noise: float = 0.2
    # 0: each step drawn afresh; else one draw per worker held this long (a node's load)
    noise_period_s: float = 0.0
    # fixed heterogeneous factors from the start
    speeds: dict[str, float] = field(default_factory=dict)
    episodes: list[TraceSlowdown] = field(default_factory=list)
    barrier_wait: dict[str, float] = field(default_factory=dict)  # worker -> sync seconds per step
    # worker -> (at_s, new size)
    batch_changes: dict[str, tuple[float, int]] = field(default_factory=dict)
    start_s: float = 1_800_000_000.0
    job_id: str = "trace"


def factor(spec: TraceSpec, worker: str, t: float) -> float:
    value = spec.speeds.get(worker, 1.0)
    for episode in spec.episodes:
        if episode.worker == worker and episode.start_s <= t < episode.end_s:
            value *= episode.factor
    return value


def generate(spec: TraceSpec, seed: int) -> list[WorkerMetrics]:
    """All reports of all workers, in report-time order."""
    rng = random.Random(seed)
    reports = []
    for w in range(spec.workers):
        reports += _worker_reports(spec, f"w{w}", rng)
    reports.sort(key=lambda r: (r.window_end, r.worker_id))
    return reports


def _worker_reports(spec: TraceSpec, worker: str, rng: random.Random) -> list[WorkerMetrics]:
    t, step, seq, out = rng.uniform(0, 0.5), 0, 0, []
    pending: list[tuple[int, float, float, int]] = []
    next_report = spec.interval_s
    while t < spec.seconds:
        size = spec.batch_size
        change = spec.batch_changes.get(worker)
        if change and t >= change[0]:
            size = change[1]
        compute = (
            size * spec.base_s_per_sample * factor(spec, worker, t) * _noise(spec, worker, t, rng)
        )
        sync = spec.barrier_wait.get(worker, 0.0)
        t += compute + sync
        pending.append((step, compute, sync, size))
        step += 1
        while t >= next_report:
            seq += 1
            out.append(_report(spec, worker, seq, next_report, [p for p in pending]))
            pending = []
            next_report += spec.interval_s
    return out


def _noise(spec: TraceSpec, worker: str, t: float, rng: random.Random) -> float:
    if not spec.noise_period_s:
        return rng.uniform(1 - spec.noise, 1 + spec.noise)
    period = int(t // spec.noise_period_s)
    return random.Random(f"{spec.job_id}/{worker}/{period}").uniform(1 - spec.noise, 1 + spec.noise)


def _report(spec: TraceSpec, worker: str, seq: int, end_s: float, steps) -> WorkerMetrics:
    compute = sorted(c for _, c, _, _ in steps)
    stats = (
        trusted(
            StepTimeStats,
            sum_s=sum(compute),
            min_s=compute[0],
            max_s=compute[-1],
            p50_s=compute[len(compute) // 2],
            p90_s=compute[int(0.9 * len(compute))],
        )
        if compute
        else trusted(StepTimeStats, sum_s=0.0, min_s=0.0, max_s=0.0, p50_s=0.0, p90_s=0.0)
    )
    return trusted(
        WorkerMetrics,
        job_id=spec.job_id,
        worker_id=worker,
        rank=None,
        node_id=f"node-{worker}",
        seq=seq,
        incarnation="i",
        window_start=utc(spec.start_s + end_s - spec.interval_s),
        window_end=utc(spec.start_s + end_s),
        step_count=len(steps),
        first_step=steps[0][0] if steps else None,
        last_step=steps[-1][0] if steps else None,
        compute=stats,
        data_wait_s=0.0,
        sync_wait_s=sum(s for _, _, s, _ in steps),
        samples=sum(n for _, _, _, n in steps),
        local_batch_size=steps[-1][3] if steps else spec.batch_size,
        resources=IDLE_RESOURCES,
    )
