"""The topic registry: every antdt topic in one table.

Services create the topics they use explicitly and idempotently at start-up
(:func:`antdt.bus.admin.ensure_topics`), the Kubernetes ``KafkaTopic``
resources and the README's table are generated from :data:`TOPICS`, and tests
keep all of them in sync. Names are ``<prefix>.<component>.<name>`` with the
prefix from settings (``antdt`` by default), except the dead-letter topic,
``<prefix>.deadletter``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from antdt.schemas.models import (
    AvroModel,
    CommandAck,
    ControlConfig,
    GroupFormed,
    GroupReady,
    MitigationCommand,
    ShardAssignment,
    ShardLogEvent,
    ShardProgress,
    ShardSnapshot,
    StragglerVerdict,
    WorkerLifecycle,
    WorkerMetrics,
)

DAY_MS = 24 * 3600 * 1000
FOREVER = "-1"


@dataclass(frozen=True)
class TopicSpec:
    """One topic: where it lives, how it is keyed, what it carries, and its configs."""

    component: str
    name: str
    partitions: int
    key: str
    value: type[AvroModel] | None
    purpose: str
    configs: dict[str, str] = field(default_factory=dict)

    def full_name(self, prefix: str) -> str:
        """The topic name under a prefix."""
        return (
            f"{prefix}.{self.component}.{self.name}" if self.component else f"{prefix}.{self.name}"
        )

    @property
    def value_name(self) -> str:
        return self.value.__name__ if self.value else "raw bytes (original record)"


def _retention(ms: int | str) -> dict[str, str]:
    return {"retention.ms": str(ms), "cleanup.policy": "delete"}


TOPICS: tuple[TopicSpec, ...] = (
    TopicSpec(
        "worker",
        "metrics",
        6,
        "job id",
        WorkerMetrics,
        "per-worker step timing and resources, one per report interval",
        _retention(DAY_MS),
    ),
    TopicSpec(
        "worker",
        "lifecycle",
        3,
        "job id",
        WorkerLifecycle,
        "joined / heartbeat / left",
        _retention(7 * DAY_MS),
    ),
    TopicSpec(
        "worker",
        "acks",
        3,
        "job id",
        CommandAck,
        "agents' answers to commands",
        _retention(FOREVER),
    ),
    TopicSpec(
        "shard",
        "progress",
        3,
        "job id",
        ShardProgress,
        "shard requests and progress from workers",
        _retention(7 * DAY_MS),
    ),
    TopicSpec(
        "shard",
        "assignments",
        6,
        "job id/worker id",
        ShardAssignment,
        "sharder grants, read by each worker from its own partition",
        _retention(7 * DAY_MS),
    ),
    TopicSpec(
        "shard",
        "log",
        3,
        "job id",
        ShardLogEvent,
        "every shard state transition: the replayable source of truth",
        _retention(FOREVER),
    ),
    TopicSpec(
        "shard",
        "snapshots",
        3,
        "job id",
        ShardSnapshot,
        "periodic full shard state for fast recovery",
        {**_retention(FOREVER), "max.message.bytes": str(16 << 20)},
    ),
    TopicSpec(
        "monitor",
        "verdicts",
        6,
        "job id",
        StragglerVerdict,
        "straggler and leader verdicts with evidence",
        _retention(30 * DAY_MS),
    ),
    TopicSpec(
        "controller",
        "commands",
        6,
        "job id/worker id",
        MitigationCommand,
        "signed mitigation commands: the audit log of every action",
        _retention(FOREVER),
    ),
    TopicSpec(
        "group",
        "ready",
        3,
        "job id",
        GroupReady,
        "partial-reduce: workers ready to average their models, read by the grouper",
        _retention(7 * DAY_MS),
    ),
    TopicSpec(
        "group",
        "formed",
        6,
        "job id/worker id",
        GroupFormed,
        "partial-reduce groups, one record per member: who, when, why",
        _retention(7 * DAY_MS),
    ),
    TopicSpec(
        "control",
        "config",
        1,
        "job id or *",
        ControlConfig,
        "runtime reconfiguration of the services",
        _retention(FOREVER),
    ),
    TopicSpec(
        "",
        "deadletter",
        1,
        "original key",
        None,
        "records that failed to decode or validate, with provenance headers",
        _retention(30 * DAY_MS),
    ),
)


def topic_spec(component: str, name: str) -> TopicSpec:
    """Look a topic up by component and name."""
    for spec in TOPICS:
        if (spec.component, spec.name) == (component, name):
            return spec
    raise KeyError(f"no topic {component}.{name} in the registry")


def worker_key(job_id: str, worker_id: str) -> str:
    """Key of the per-worker topics (assignments, commands)."""
    return f"{job_id}/{worker_id}"


def markdown_table(prefix: str = "antdt") -> str:
    """The README's topic table, generated from the registry."""
    rows = ["| topic | partitions | key | value | purpose |", "|---|---|---|---|---|"]
    for spec in TOPICS:
        rows.append(
            f"| `{spec.full_name(prefix)}` | {spec.partitions} | {spec.key} | "
            f"{spec.value_name} | {spec.purpose} |"
        )
    return "\n".join(rows)
