"""Pydantic models that mirror the Avro contracts in ``avro/*.avsc``.

The ``.avsc`` files are the contract anyone can consume with any Avro library;
these models are how antdt's own code builds and validates messages. A test
(``tests/schemas/test_contracts.py``) checks that every model agrees with its
schema field by field: names, types, nullability and defaults.

Models also carry the semantic checks Avro cannot express (no negative
durations or counts, steps ordered, timestamps in UTC), so a schema-valid but
meaningless record is rejected at decode time and dead-lettered.
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from antdt.schemas.types import (
    AvroType,
    Count32,
    Count64,
    Double,
    Int32,
    Long,
    Name,
    Percent,
    Positive32,
    Positive64,
    Seconds,
    Timestamp,
)


class AvroModel(BaseModel):
    """Base of every message: immutable, strict about unknown fields."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    #: Full Avro name of the record this model mirrors.
    avro_name: ClassVar[str] = ""


class AvroRecord(AvroModel):
    """A nested Avro record (not a top-level message)."""


_DEFAULTS: dict[type, dict[str, object]] = {}


def _defaults(cls: type[AvroModel]) -> dict[str, object]:
    """The class's optional fields with their defaults (immutable ones only: lists are made
    fresh)."""
    if cls not in _DEFAULTS:
        _DEFAULTS[cls] = {
            name: f.get_default(call_default_factory=True)
            for name, f in cls.model_fields.items()
            if not f.is_required()
        }
    return {
        name: (
            list(value)
            if isinstance(value, list)
            else dict(value)
            if isinstance(value, dict)
            else value
        )
        for name, value in _DEFAULTS[cls].items()
    }


def trusted(cls: type[AvroModel], **values: object):
    """Build a model from values that are valid by construction, skipping validation.

    For hot paths that create messages from state they own (the sharder makes
    tens of thousands of log events a second). Required fields must be given;
    optional ones left out take their defaults, so a field added to a schema
    does not break the callers. Anything that arrives from outside goes
    through normal validation.
    """
    values = {**_defaults(cls), **values}
    instance = cls.__new__(cls)
    object.__setattr__(instance, "__dict__", values)
    object.__setattr__(instance, "__pydantic_fields_set__", set(values))
    object.__setattr__(instance, "__pydantic_extra__", None)
    object.__setattr__(instance, "__pydantic_private__", None)
    return instance


# ---------------------------------------------------------------- enums


class LifecycleEvent(str, Enum):
    JOINED = "JOINED"
    HEARTBEAT = "HEARTBEAT"
    LEFT = "LEFT"


class ProgressKind(str, Enum):
    REQUESTED = "REQUESTED"
    STARTED = "STARTED"
    DONE = "DONE"
    FAILED = "FAILED"
    CHECKPOINT = "CHECKPOINT"
    REWIND = "REWIND"
    COMMIT = "COMMIT"


#: Progress kinds that are about one shard (and so must name it).
SHARD_PROGRESS_KINDS = frozenset({ProgressKind.STARTED, ProgressKind.DONE, ProgressKind.FAILED})


class AssignmentStatus(str, Enum):
    GRANTED = "GRANTED"
    WAIT = "WAIT"
    EPOCH_END = "EPOCH_END"
    FINISHED = "FINISHED"
    REFUSED = "REFUSED"


class ShardTransition(str, Enum):
    DATASET_DEFINED = "DATASET_DEFINED"
    EPOCH_OPENED = "EPOCH_OPENED"
    GRANTED = "GRANTED"
    STARTED = "STARTED"
    DONE = "DONE"
    FAILED = "FAILED"
    QUARANTINED = "QUARANTINED"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    RELEASED = "RELEASED"
    QUOTA_SET = "QUOTA_SET"
    EPOCH_CLOSED = "EPOCH_CLOSED"
    WRITER_ELECTED = "WRITER_ELECTED"
    LEASE_RENEWED = "LEASE_RENEWED"
    CHECKPOINT = "CHECKPOINT"
    REWOUND = "REWOUND"
    APPLIED = "APPLIED"
    GIVEN_BACK = "GIVEN_BACK"


class ShardState(str, Enum):
    TODO = "TODO"
    DOING = "DOING"
    DONE = "DONE"
    QUARANTINED = "QUARANTINED"


class VerdictKind(str, Enum):
    STRAGGLER = "STRAGGLER"
    LEADER = "LEADER"
    CLEARED = "CLEARED"


class StragglerClass(str, Enum):
    NONE = "NONE"
    TRANSIENT = "TRANSIENT"
    PERSISTENT = "PERSISTENT"
    DETERMINISTIC = "DETERMINISTIC"


class EvidenceCause(str, Enum):
    CPU_CONTENTION = "CPU_CONTENTION"
    CPU_STEAL = "CPU_STEAL"
    MEMORY_PRESSURE = "MEMORY_PRESSURE"
    IO = "IO"
    NETWORK = "NETWORK"
    GPU = "GPU"
    DATA_WAIT = "DATA_WAIT"
    UNKNOWN = "UNKNOWN"


class CommandAction(str, Enum):
    ADJUST_BATCH_SIZE = "ADJUST_BATCH_SIZE"
    SET_SHARD_QUOTA = "SET_SHARD_QUOTA"
    RESTART = "RESTART"
    EVICT = "EVICT"
    PAUSE = "PAUSE"
    RESUME = "RESUME"
    MARK_NODE_DEGRADED = "MARK_NODE_DEGRADED"
    CUSTOM = "CUSTOM"


class AckStatus(str, Enum):
    SCHEDULED = "SCHEDULED"
    APPLIED = "APPLIED"
    REJECTED = "REJECTED"
    IGNORED = "IGNORED"
    FAILED = "FAILED"


class ControlComponent(str, Enum):
    ALL = "ALL"
    MONITOR = "MONITOR"
    CONTROLLER = "CONTROLLER"
    SHARDER = "SHARDER"


# ---------------------------------------------------------------- worker metrics


class StepTimeStats(AvroRecord):
    avro_name: ClassVar[str] = "antdt.StepTimeStats"

    sum_s: Seconds
    min_s: Seconds
    max_s: Seconds
    p50_s: Seconds
    p90_s: Seconds

    @model_validator(mode="after")
    def _ordered(self) -> StepTimeStats:
        if not self.min_s <= self.p50_s <= self.p90_s <= self.max_s:
            raise ValueError("step time statistics must satisfy min <= p50 <= p90 <= max")
        return self


class ResourceSnapshot(AvroRecord):
    avro_name: ClassVar[str] = "antdt.ResourceSnapshot"

    process_cpu_percent: Percent
    host_cpu_percent: Percent
    cpu_steal_percent: Percent
    load_1m: Percent
    rss_bytes: Count64
    host_memory_percent: Percent
    io_read_bytes: Count64
    io_write_bytes: Count64
    net_sent_bytes: Count64
    net_recv_bytes: Count64
    gpu_utilization_percent: Percent | None = None
    gpu_memory_used_bytes: Count64 | None = None
    gpu_memory_total_bytes: Count64 | None = None


#: ``WorkerMetrics.role`` of a training worker; a parameter-server shard reports as "ps".
WORKER_ROLE = "worker"


class WorkerMetrics(AvroModel):
    avro_name: ClassVar[str] = "antdt.WorkerMetrics"

    job_id: Name
    worker_id: Name
    rank: Count32 | None = None
    node_id: Name | None = None
    seq: Count64
    incarnation: Name
    window_start: Timestamp
    window_end: Timestamp
    step_count: Count32
    first_step: Count64 | None = None
    last_step: Count64 | None = None
    compute: StepTimeStats
    data_wait_s: Seconds
    sync_wait_s: Seconds
    samples: Count64
    local_batch_size: Count32
    resources: ResourceSnapshot
    role: Name = WORKER_ROLE
    queue_depth: Count32 | None = None
    world_size: Count32 | None = None

    @model_validator(mode="after")
    def _consistent(self) -> WorkerMetrics:
        if self.window_end < self.window_start:
            raise ValueError("window_end is before window_start")
        has_steps = self.step_count > 0
        if has_steps != (self.first_step is not None and self.last_step is not None):
            raise ValueError("first_step and last_step must be set exactly when step_count > 0")
        if has_steps and self.last_step - self.first_step + 1 < self.step_count:  # type: ignore[operator]
            raise ValueError("step range is shorter than step_count")
        return self


class WorkerLifecycle(AvroModel):
    avro_name: ClassVar[str] = "antdt.WorkerLifecycle"

    job_id: Name
    worker_id: Name
    incarnation: Name
    event: LifecycleEvent
    timestamp: Timestamp
    host: Name
    node_id: Name | None = None
    pid: Count32
    rank: Count32 | None = None
    exit_code: Int32 | None = None
    reason: str | None = None


# ---------------------------------------------------------------- sharding


class DatasetSpec(AvroRecord):
    avro_name: ClassVar[str] = "antdt.DatasetSpec"

    name: Name
    size: Positive64
    shard_size: Positive64
    epochs: Positive32
    shuffle_seed: Long
    max_attempts: Positive32
    lease_s: Annotated[float, AvroType("double"), Field(gt=0, allow_inf_nan=False)]
    owners: list[Name] = Field(default_factory=list)

    @property
    def shard_count(self) -> int:
        """Number of shards per epoch (the last one may be short)."""
        return -(-self.size // self.shard_size)

    @classmethod
    def with_shard_count(cls, name: str, size: int, shards: int, **fields) -> DatasetSpec:
        """A spec given the number of shards instead of their size (as close to ``shards`` as sizes
        allow)."""
        if not 1 <= shards <= size:
            raise ValueError(
                f"shards must be between 1 and the dataset size ({size}), got {shards}"
            )
        return cls(name=name, size=size, shard_size=-(-size // shards), **fields)

    def owner_of(self, shard_id: int) -> str | None:
        """The worker a shard belongs to under static assignment (``owners``), or None: any worker
        may take it."""
        return self.owners[shard_id % len(self.owners)] if self.owners else None


class ShardCommit(AvroRecord):
    """Samples of one shard grant whose training update is (to be) in the model."""

    avro_name: ClassVar[str] = "antdt.ShardCommit"

    holder: Name | None = None
    shard_id: Count64
    attempt: Count32
    samples: list[Count64]


#: What names a worker's DataLoader process after the worker: ``<worker>.loader<N>``.
LOADER_INFIX = ".loader"


def loader_holder(worker_id: str, loader: int) -> str:
    """The sharder client name of ``worker_id``'s DataLoader process ``loader``: it holds its own
    grants, whose samples the worker's main process commits (:attr:`ShardCommit.holder`)."""
    return f"{worker_id}{LOADER_INFIX}{loader}"


def held_by_worker(holder: str, worker_id: str) -> bool:
    """Whether grants of ``holder`` are ``worker_id``'s own: its main process's or one of its
    DataLoader processes' (:func:`loader_holder`)."""
    return holder == worker_id or holder.startswith(f"{worker_id}{LOADER_INFIX}")


class GrantRef(AvroRecord):
    """One shard grant, by shard and attempt."""

    avro_name: ClassVar[str] = "antdt.GrantRef"

    shard_id: Count64
    attempt: Count32


class ShardProgress(AvroModel):
    avro_name: ClassVar[str] = "antdt.ShardProgress"

    job_id: Name
    worker_id: Name
    incarnation: Name
    seq: Count64
    kind: ProgressKind
    epoch: Count32
    shard_id: Count64 | None = None
    step: Count64 | None = None
    error: str | None = None
    attempt: Count32 | None = None
    quota: Count32 | None = None
    dataset: DatasetSpec | None = None
    version: Count64 | None = None
    commits: list[ShardCommit] = Field(default_factory=list)
    update_id: Name | None = None
    read_shards: list[Count64] = Field(default_factory=list)
    given_back: list[GrantRef] = Field(default_factory=list)
    timestamp: Timestamp

    @model_validator(mode="after")
    def _fields_match_kind(self) -> ShardProgress:
        if (self.kind in SHARD_PROGRESS_KINDS) != (self.shard_id is not None):
            raise ValueError("shard_id must be set for STARTED, DONE, FAILED and only for them")
        if (self.kind is ProgressKind.REWIND) != (self.version is not None):
            raise ValueError("version must be set for REWIND and only for it")
        if (self.kind is ProgressKind.COMMIT) != bool(self.commits):
            raise ValueError("commits must be listed for COMMIT and only for it")
        if self.update_id is not None and self.kind is not ProgressKind.COMMIT:
            raise ValueError("update_id belongs to COMMIT only")
        if self.read_shards and self.kind is not ProgressKind.REQUESTED:
            raise ValueError("read_shards belongs to REQUESTED only")
        if self.given_back and self.kind is not ProgressKind.REQUESTED:
            raise ValueError("given_back belongs to REQUESTED only")
        return self


class Shard(AvroRecord):
    avro_name: ClassVar[str] = "antdt.Shard"

    shard_id: Count64
    start: Count64
    length: Positive64
    attempt: Count32
    done: list[Count64] = Field(default_factory=list)


class ShardAssignment(AvroModel):
    avro_name: ClassVar[str] = "antdt.ShardAssignment"

    job_id: Name
    worker_id: Name
    seq: Count64
    writer_epoch: Count64
    epoch: Count32
    status: AssignmentStatus
    shards: list[Shard]
    lease_expires: Timestamp | None = None
    quota: Count32
    in_reply_to: Count64 | None = None
    version: Count64 | None = None
    reason: str | None = None
    timestamp: Timestamp

    @model_validator(mode="after")
    def _shards_only_when_granted(self) -> ShardAssignment:
        if self.status is AssignmentStatus.GRANTED and not self.shards:
            raise ValueError("a GRANTED assignment must list shards")
        if self.status is not AssignmentStatus.GRANTED and self.shards:
            raise ValueError(f"a {self.status.value} assignment must not list shards")
        return self


class ShardLogEvent(AvroModel):
    avro_name: ClassVar[str] = "antdt.ShardLogEvent"

    job_id: Name
    seq: Positive64
    writer_epoch: Count64
    transition: ShardTransition
    epoch: Count32
    shard_id: Count64 | None = None
    worker_id: Name | None = None
    attempt: Count32 | None = None
    lease_expires: Timestamp | None = None
    quota: Count32 | None = None
    reason: str | None = None
    dataset: DatasetSpec | None = None
    version: Count64 | None = None
    shard_ids: list[Count64] = Field(default_factory=list)
    commits: list[ShardCommit] = Field(default_factory=list)
    update_id: Name | None = None
    cause: str | None = None
    timestamp: Timestamp

    @model_validator(mode="after")
    def _dataset_when_defined(self) -> ShardLogEvent:
        if (self.transition is ShardTransition.DATASET_DEFINED) != (self.dataset is not None):
            raise ValueError("dataset must be set exactly for DATASET_DEFINED")
        return self


class AppliedSamples(AvroRecord):
    avro_name: ClassVar[str] = "antdt.AppliedSamples"

    seq: Count64
    samples: list[Count64]
    update_id: Name | None = None


class ShardStateEntry(AvroRecord):
    avro_name: ClassVar[str] = "antdt.ShardStateEntry"

    shard_id: Count64
    state: ShardState
    worker_id: Name | None = None
    lease_expires: Timestamp | None = None
    started: bool = False
    attempt: Count32
    done_seq: Count64 | None = None
    reason: str | None = None
    applied: list[AppliedSamples] = Field(default_factory=list)
    rewound_below: Count32 = 0


class ShardSnapshot(AvroModel):
    avro_name: ClassVar[str] = "antdt.ShardSnapshot"

    job_id: Name
    seq: Count64
    writer_epoch: Count64
    writer: str | None = None
    dataset: DatasetSpec
    epoch: Count32
    finished: bool
    shards: list[ShardStateEntry]
    quotas: dict[str, Count32] = Field(default_factory=dict)
    epoch_opened_seq: Count64 = 0
    rewinds: dict[str, Count64] = Field(default_factory=dict)
    attempt_base: Count32 = 0
    attempt_high: Count32 = 0
    log_offset: Count64 | None = None
    timestamp: Timestamp


# ---------------------------------------------------------------- monitor and controller


class Evidence(AvroRecord):
    avro_name: ClassVar[str] = "antdt.Evidence"

    cause: EvidenceCause
    metric: Name
    value: Double
    baseline: Double
    detail: str | None = None


class VerdictWindow(AvroRecord):
    avro_name: ClassVar[str] = "antdt.VerdictWindow"

    start: Timestamp
    end: Timestamp
    reports: Count32

    @model_validator(mode="after")
    def _ordered(self) -> VerdictWindow:
        if self.end < self.start:
            raise ValueError("window end is before its start")
        return self


class StragglerVerdict(AvroModel):
    avro_name: ClassVar[str] = "antdt.StragglerVerdict"

    verdict_id: Name
    job_id: Name
    worker_id: Name
    node_id: Name | None = None
    kind: VerdictKind
    classification: StragglerClass
    relative_score: Double
    individual_score: Annotated[float, AvroType("double"), Field(ge=0, allow_inf_nan=False)]
    speed_ratio: Annotated[float, AvroType("double"), Field(ge=0, allow_inf_nan=False)]
    window: VerdictWindow
    episode_start: Timestamp | None = None
    evidence: list[Evidence]
    issued_at: Timestamp


#: An ADJUST_BATCH_SIZE parameter: how many workers its decision resizes, so synchronous ranks can
#: agree to switch together however late one command arrives (antdt.worker.elastic.resize).
RANKS_CHANGED = "ranks_changed"


class MitigationCommand(AvroModel):
    avro_name: ClassVar[str] = "antdt.MitigationCommand"

    command_id: Name
    job_id: Name
    target_worker: Name
    action: CommandAction
    batch_size: Positive32 | None = None
    global_batch_size: Positive32 | None = None
    shard_quota: Count32 | None = None
    custom_action: Name | None = None
    parameters: dict[str, str] = Field(default_factory=dict)
    effective_step: Count64 | None = None
    reason: str
    verdict_id: Name | None = None
    evidence: list[Evidence]
    policy: Name
    issued_at: Timestamp
    expires_at: Timestamp
    controller_epoch: Count64
    dry_run: bool = False
    signature: bytes | None = None

    @model_validator(mode="after")
    def _parameters_match_action(self) -> MitigationCommand:
        required = {
            CommandAction.ADJUST_BATCH_SIZE: ("batch_size", self.batch_size),
            CommandAction.SET_SHARD_QUOTA: ("shard_quota", self.shard_quota),
            CommandAction.CUSTOM: ("custom_action", self.custom_action),
        }.get(self.action)
        if required is not None and required[1] is None:
            raise ValueError(f"{self.action.value} needs {required[0]}")
        if self.expires_at < self.issued_at:
            raise ValueError("expires_at is before issued_at")
        return self


class CommandAck(AvroModel):
    avro_name: ClassVar[str] = "antdt.CommandAck"

    command_id: Name
    job_id: Name
    worker_id: Name
    status: AckStatus
    reason: str | None = None
    applied_step: Count64 | None = None
    controller_epoch: Count64
    timestamp: Timestamp


class ControlConfig(AvroModel):
    avro_name: ClassVar[str] = "antdt.ControlConfig"

    config_id: Name
    job_id: Name | None = None
    component: ControlComponent
    changes: dict[str, str]
    issued_by: Name
    issued_at: Timestamp
    signature: bytes | None = None


#: Every top-level message, in the order the docs list them.
class GroupReason(str, Enum):
    QUORUM = "QUORUM"
    DEADLINE = "DEADLINE"
    NO_MORE = "NO_MORE"
    CHECKPOINT = "CHECKPOINT"
    FINAL = "FINAL"


#: Reasons whose group holds every rank (a global synchronisation point).
WHOLE_GROUP_REASONS = frozenset({GroupReason.CHECKPOINT, GroupReason.FINAL})


class GroupReady(AvroModel):
    """Partial-reduce: a worker is ready to average its model (``finished``: it has no data
    left)."""

    avro_name: ClassVar[str] = "antdt.GroupReady"

    job_id: Name
    worker_id: Name
    incarnation: Name
    generation: Count32
    rank: Count32
    world_size: Positive32
    seq: Count64
    step: Count64
    finished: bool = False
    timestamp: Timestamp

    @model_validator(mode="after")
    def _rank_in_world(self) -> GroupReady:
        if self.rank >= self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of {self.world_size}")
        return self


class GroupFormed(AvroModel):
    """Partial-reduce: one member's copy of a group the grouper formed."""

    avro_name: ClassVar[str] = "antdt.GroupFormed"

    job_id: Name
    worker_id: Name
    group_id: Count64
    generation: Count32
    reason: GroupReason
    members: list[Name] = Field(min_length=1)
    ranks: list[Count32] = Field(min_length=1)
    in_reply_to: Count64
    waited_ms: Count64
    timestamp: Timestamp

    @model_validator(mode="after")
    def _members_match(self) -> GroupFormed:
        if (
            len(self.members) != len(self.ranks)
            or sorted(self.ranks) != self.ranks
            or len(set(self.ranks)) != len(self.ranks)
        ):
            raise ValueError("ranks must be distinct, ascending and one per member")
        if self.worker_id not in self.members:
            raise ValueError(f"{self.worker_id} is not a member of the group it was sent")
        return self

    @property
    def leader(self) -> int:
        """The rank that averages the group's models (the lowest)."""
        return self.ranks[0]


MESSAGE_TYPES: tuple[type[AvroModel], ...] = (
    WorkerMetrics,
    WorkerLifecycle,
    ShardProgress,
    ShardAssignment,
    ShardLogEvent,
    ShardSnapshot,
    StragglerVerdict,
    MitigationCommand,
    CommandAck,
    ControlConfig,
    GroupReady,
    GroupFormed,
)
