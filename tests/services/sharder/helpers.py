"""Builders shared by the sharder tests."""

from __future__ import annotations

import itertools

from antdt.schemas.models import DatasetSpec, ProgressKind, ShardProgress
from antdt.services.sharder.core import CoreConfig, ShardCore
from antdt.services.sharder.state import JobState, from_ms

JOB = "job-t"
_seq = itertools.count(1)


def dataset(
    size: int = 1000,
    shard_size: int = 100,
    epochs: int = 2,
    max_attempts: int = 3,
    lease_s: float = 10.0,
) -> DatasetSpec:
    return DatasetSpec(
        name="t",
        size=size,
        shard_size=shard_size,
        epochs=epochs,
        shuffle_seed=7,
        max_attempts=max_attempts,
        lease_s=lease_s,
    )


def report(kind: ProgressKind, worker: str, epoch: int, now_ms: int = 0, **fields) -> ShardProgress:
    return ShardProgress(
        job_id=JOB,
        worker_id=worker,
        incarnation=f"{worker}-1",
        seq=next(_seq),
        kind=kind,
        epoch=epoch,
        timestamp=from_ms(now_ms),
        **fields,
    )


def new_core(
    spec: DatasetSpec | None = None, quota: int = 2, now_ms: int = 0
) -> tuple[ShardCore, list]:
    """An elected core with the dataset defined; returns it and its log so far."""
    core = ShardCore(JobState(JOB), CoreConfig(default_quota=quota))
    log = [core.elect(1, now_ms, "test")]
    if spec is not None:
        log += core.on_progress(
            report(ProgressKind.REQUESTED, "w0", 0, now_ms, dataset=spec, quota=0), now_ms
        ).events
    return core, log
