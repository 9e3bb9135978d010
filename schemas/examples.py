"""One realistic, valid instance of every message type.

Used by the codec benchmark, the bus check in ``antdt demo`` and the tests,
so that all of them exercise the same, fully populated messages (every
nullable field set, so encoders see every branch).
"""

from __future__ import annotations

from datetime import timedelta

from antdt.schemas.models import (
    AckStatus,
    AppliedSamples,
    AssignmentStatus,
    AvroModel,
    CommandAck,
    CommandAction,
    ControlComponent,
    ControlConfig,
    DatasetSpec,
    Evidence,
    EvidenceCause,
    GroupFormed,
    GroupReady,
    GroupReason,
    LifecycleEvent,
    MitigationCommand,
    ProgressKind,
    ResourceSnapshot,
    Shard,
    ShardAssignment,
    ShardCommit,
    ShardLogEvent,
    ShardProgress,
    ShardSnapshot,
    ShardState,
    ShardStateEntry,
    ShardTransition,
    StepTimeStats,
    StragglerClass,
    StragglerVerdict,
    VerdictKind,
    VerdictWindow,
    WorkerLifecycle,
    WorkerMetrics,
)
from antdt.schemas.types import utc_now

JOB = "job-demo"
WORKER = "worker-3"


def worker_metrics(seq: int = 7) -> WorkerMetrics:
    now = utc_now()
    return WorkerMetrics(
        job_id=JOB,
        worker_id=WORKER,
        rank=3,
        node_id="node-a",
        seq=seq,
        incarnation="inc-5f2a",
        window_start=now - timedelta(seconds=1),
        window_end=now,
        step_count=4,
        first_step=120,
        last_step=123,
        compute=StepTimeStats(sum_s=0.412, min_s=0.098, max_s=0.111, p50_s=0.101, p90_s=0.109),
        data_wait_s=0.012,
        sync_wait_s=0.048,
        samples=128,
        local_batch_size=32,
        resources=ResourceSnapshot(
            process_cpu_percent=97.5,
            host_cpu_percent=61.0,
            cpu_steal_percent=0.4,
            load_1m=0.8,
            rss_bytes=1_812_000_000,
            host_memory_percent=43.0,
            io_read_bytes=1_048_576,
            io_write_bytes=4096,
            net_sent_bytes=20_000_000,
            net_recv_bytes=19_500_000,
            gpu_utilization_percent=88.0,
            gpu_memory_used_bytes=12_000_000_000,
            gpu_memory_total_bytes=80_000_000_000,
        ),
        role="worker",
        queue_depth=0,
        world_size=8,
    )


def worker_lifecycle() -> WorkerLifecycle:
    return WorkerLifecycle(
        job_id=JOB,
        worker_id=WORKER,
        incarnation="inc-5f2a",
        event=LifecycleEvent.LEFT,
        timestamp=utc_now(),
        host="host-a",
        node_id="node-a",
        pid=4242,
        rank=3,
        exit_code=0,
        reason="finished",
    )


def shard_progress() -> ShardProgress:
    return ShardProgress(
        job_id=JOB,
        worker_id=WORKER,
        incarnation="inc-5f2a",
        seq=31,
        kind=ProgressKind.COMMIT,
        epoch=1,
        step=123,
        error="OSError: corrupt record",
        attempt=1,
        quota=2,
        dataset=dataset_spec(),
        commits=shard_commits(),
        update_id=f"{WORKER}/inc-5f2a/7",
        timestamp=utc_now(),
    )


def shard_commits() -> list[ShardCommit]:
    return [
        ShardCommit(holder=WORKER, shard_id=17, attempt=1, samples=[17_003, 17_998]),
        ShardCommit(holder=f"{WORKER}.loader1", shard_id=18, attempt=0, samples=[18_000]),
    ]


def shard_assignment() -> ShardAssignment:
    now = utc_now()
    return ShardAssignment(
        job_id=JOB,
        worker_id=WORKER,
        seq=120,
        writer_epoch=2,
        epoch=1,
        status=AssignmentStatus.GRANTED,
        shards=[
            Shard(shard_id=17, start=17_000, length=1000, attempt=1, done=[17_003, 17_998]),
            Shard(shard_id=18, start=18_000, length=1000, attempt=0),
        ],
        lease_expires=now + timedelta(seconds=30),
        quota=2,
        in_reply_to=30,
        version=120,
        reason="granted",
        timestamp=now,
    )


def dataset_spec() -> DatasetSpec:
    return DatasetSpec(
        name="synthetic-1m",
        size=1_000_000,
        shard_size=1000,
        epochs=3,
        shuffle_seed=1234,
        max_attempts=3,
        lease_s=30.0,
    )


def shard_log_event() -> ShardLogEvent:
    return ShardLogEvent(
        job_id=JOB,
        seq=1,
        writer_epoch=2,
        transition=ShardTransition.DATASET_DEFINED,
        epoch=0,
        shard_id=None,
        worker_id=WORKER,
        attempt=0,
        lease_expires=utc_now(),
        quota=2,
        reason="job start",
        dataset=dataset_spec(),
        version=None,
        shard_ids=[3, 4],
        commits=shard_commits(),
        update_id=f"{WORKER}/inc-5f2a/7",
        cause=f"{WORKER}/inc-5f2a/30",
        timestamp=utc_now(),
    )


def shard_snapshot() -> ShardSnapshot:
    now = utc_now()
    return ShardSnapshot(
        job_id=JOB,
        seq=120,
        writer_epoch=2,
        writer="writer sharder-1",
        dataset=dataset_spec(),
        epoch=1,
        finished=False,
        shards=[
            ShardStateEntry(
                shard_id=0, state=ShardState.DONE, worker_id="worker-0", attempt=0, done_seq=57
            ),
            ShardStateEntry(
                shard_id=17,
                state=ShardState.DOING,
                worker_id=WORKER,
                lease_expires=now,
                started=True,
                attempt=1,
                applied=[
                    AppliedSamples(
                        seq=101, samples=[17_003, 17_998], update_id=f"{WORKER}/inc-5f2a/7"
                    )
                ],
            ),
            ShardStateEntry(
                shard_id=99, state=ShardState.QUARANTINED, attempt=3, reason="failed 3 times"
            ),
        ],
        quotas={WORKER: 1},
        epoch_opened_seq=40,
        rewinds={f"{WORKER}/inc-5f2a/30": 88},
        log_offset=1234,
        timestamp=now,
    )


def evidence() -> list[Evidence]:
    return [
        Evidence(
            cause=EvidenceCause.CPU_STEAL,
            metric="resources.cpu_steal_percent",
            value=22.0,
            baseline=0.3,
            detail="hypervisor steal",
        )
    ]


def straggler_verdict() -> StragglerVerdict:
    now = utc_now()
    return StragglerVerdict(
        verdict_id="v-0001",
        job_id=JOB,
        worker_id=WORKER,
        node_id="node-a",
        kind=VerdictKind.STRAGGLER,
        classification=StragglerClass.PERSISTENT,
        relative_score=6.2,
        individual_score=3.9,
        speed_ratio=4.0,
        window=VerdictWindow(start=now - timedelta(seconds=10), end=now, reports=10),
        episode_start=now - timedelta(seconds=45),
        evidence=evidence(),
        issued_at=now,
    )


def mitigation_command() -> MitigationCommand:
    now = utc_now()
    return MitigationCommand(
        command_id="c-0001",
        job_id=JOB,
        target_worker=WORKER,
        action=CommandAction.ADJUST_BATCH_SIZE,
        batch_size=8,
        global_batch_size=256,
        shard_quota=1,
        custom_action="noop",
        parameters={"node": "node-a"},
        effective_step=140,
        reason="persistent straggler, 4.0x slower",
        verdict_id="v-0001",
        evidence=evidence(),
        policy="antdt-dd",
        issued_at=now,
        expires_at=now + timedelta(seconds=60),
        controller_epoch=3,
        dry_run=False,
        signature=b"\x01" * 32,
    )


def command_ack() -> CommandAck:
    return CommandAck(
        command_id="c-0001",
        job_id=JOB,
        worker_id=WORKER,
        status=AckStatus.SCHEDULED,
        reason="at step 140",
        applied_step=140,
        controller_epoch=3,
        timestamp=utc_now(),
    )


def control_config() -> ControlConfig:
    return ControlConfig(
        config_id="cfg-0001",
        job_id=JOB,
        component=ControlComponent.MONITOR,
        changes={"monitor.window_s": "10", "monitor.threshold": "3.5"},
        issued_by="operator",
        issued_at=utc_now(),
    )


def group_ready() -> GroupReady:
    return GroupReady(
        job_id=JOB,
        worker_id=WORKER,
        incarnation="inc-3a",
        generation=0,
        rank=3,
        world_size=8,
        seq=12,
        step=11,
        finished=False,
        timestamp=utc_now(),
    )


def group_formed() -> GroupFormed:
    return GroupFormed(
        job_id=JOB,
        worker_id=WORKER,
        group_id=40,
        generation=0,
        reason=GroupReason.QUORUM,
        members=["worker-1", WORKER, "worker-6"],
        ranks=[1, 3, 6],
        in_reply_to=12,
        waited_ms=4,
        timestamp=utc_now(),
    )


def all_examples() -> list[AvroModel]:
    """One of each message type, in registry order."""
    return [
        worker_metrics(),
        worker_lifecycle(),
        shard_progress(),
        shard_assignment(),
        shard_log_event(),
        shard_snapshot(),
        straggler_verdict(),
        mitigation_command(),
        command_ack(),
        control_config(),
        group_ready(),
        group_formed(),
    ]
