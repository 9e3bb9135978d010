"""Building controller inputs for tests: verdicts and worker reports with only what matters set."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from antdt.schemas.models import (
    ResourceSnapshot,
    StepTimeStats,
    StragglerClass,
    StragglerVerdict,
    VerdictKind,
    VerdictWindow,
    WorkerMetrics,
)

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
_IDLE = ResourceSnapshot(
    process_cpu_percent=90,
    host_cpu_percent=50,
    cpu_steal_percent=0,
    load_1m=1,
    rss_bytes=1,
    host_memory_percent=40,
    io_read_bytes=0,
    io_write_bytes=0,
    net_sent_bytes=0,
    net_recv_bytes=0,
)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def verdict(
    worker: str,
    kind=VerdictKind.STRAGGLER,
    cls=StragglerClass.TRANSIENT,
    t: float = 0.0,
    job: str = "job",
    node: str | None = None,
    ratio: float = 2.0,
) -> StragglerVerdict:
    now = at(t)
    return StragglerVerdict(
        verdict_id=f"{job}:{worker}:{t}:{kind.value}:{cls.value}",
        job_id=job,
        worker_id=worker,
        node_id=node or f"node-{worker}",
        kind=kind,
        classification=StragglerClass.NONE if kind is VerdictKind.CLEARED else cls,
        relative_score=5.0,
        individual_score=ratio,
        speed_ratio=ratio,
        window=VerdictWindow(start=now - timedelta(seconds=10), end=now, reports=10),
        episode_start=now - timedelta(seconds=40),
        evidence=[],
        issued_at=now,
    )


def report(
    worker: str,
    samples_per_s: float,
    batch: int,
    step: int,
    t: float = 0.0,
    job: str = "job",
    seq: int = 1,
    incarnation: str = "i1",
    steps_per_s: float = 5.0,
) -> WorkerMetrics:
    """One 1 s report: ``steps_per_s`` steps of ``batch`` samples at ``samples_per_s`` compute
    throughput."""
    samples = int(batch * steps_per_s)
    compute = samples / samples_per_s
    stats = StepTimeStats(
        sum_s=compute,
        min_s=compute / steps_per_s,
        max_s=compute / steps_per_s,
        p50_s=compute / steps_per_s,
        p90_s=compute / steps_per_s,
    )
    return WorkerMetrics(
        job_id=job,
        worker_id=worker,
        node_id=f"node-{worker}",
        seq=seq,
        incarnation=incarnation,
        window_start=at(t - 1),
        window_end=at(t),
        step_count=int(steps_per_s),
        first_step=step - int(steps_per_s) + 1,
        last_step=step,
        compute=stats,
        data_wait_s=0.0,
        sync_wait_s=0.0,
        samples=samples,
        local_batch_size=batch,
        resources=_IDLE,
    )
