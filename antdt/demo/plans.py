"""The plans a scenario runs under: how it trains and which antdt parts are on.

| plan | training | sharding | policy |
|---|---|---|---|
| ``static-bsp`` | torch's DDP with ``DistributedSampler`` | static slices | none: the baseline |
| ``static-async`` | asynchronous, parameter server | static: each worker its own shards | none: a plain PS job |
| ``dynamic`` | asynchronous, parameter server | dynamic shards | none |
| ``nd`` | asynchronous, parameter server | dynamic shards | AntDT-ND |
| ``dd`` | ``ElasticJob``, all-reduce | dynamic shards | AntDT-DD, batches sized in-band every step |
| ``dd-commands`` | ``ElasticJob``, all-reduce | dynamic shards | AntDT-DD, batches sized by the controller's commands |
| ``partial-reduce`` | ``PartialReduceJob``: replicas averaged in groups of the first P ready | dynamic shards | none: the grouper forms the groups |

Every plan trains one shared model: through the parameter server, kept
identical on every rank by the all-reduce, or (partial reduce) the mean of
the replicas, which the last group of every rank makes the one model.
"""  # noqa: E501 (a markdown table: a row cannot be wrapped)

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from antdt.demo.scenario import ClusterMode, Scenario
from antdt.errors import ConfigError
from antdt.sizing import BatchSizing
from antdt.training import TrainingMode


class Sharding(str, Enum):
    """Who decides which worker reads which samples."""

    DYNAMIC = "dynamic"  # the sharder, shard by shard
    STATIC = "static"  # fixed before training: DistributedSampler's slices, or owned shards


@dataclass(frozen=True)
class RunPlan:
    name: str
    training: TrainingMode
    sharding: Sharding
    policy: str | None  # a controller policy, or None for no controller
    # sync: who sizes the local batches (in-band: every step, antdt.sizing.inband)
    sizing: BatchSizing = BatchSizing.COMMANDS
    #: Monitor settings the plan runs with on every scenario (printed in the report with the
    #: scenario's own).
    monitor: tuple[tuple[str, str], ...] = ()

    @property
    def uses_sharder(self) -> bool:
        """Dynamic sharding, and every parameter-server plan: the servers apply what the shard log
        commits."""
        return self.sharding is Sharding.DYNAMIC or self.training is TrainingMode.ASYNC

    @property
    def grouped(self) -> bool:
        """The ranks share one process group: one rank's death restarts them all from the last
        checkpoint."""
        return self.training in (TrainingMode.SYNC, TrainingMode.PREDUCE)

    @property
    def label(self) -> str:
        return {
            "static-bsp": "static sharding, BSP (baseline)",
            "static-async": "static sharding (PS)",
            "dynamic": "dynamic sharding only (PS)",
            "nd": "antdt, AntDT-ND (PS)",
            "dd": "antdt, AntDT-DD",
            "dd-commands": "antdt, AntDT-DD by commands",
            "partial-reduce": "antdt, partial reduce",
        }.get(self.name, self.name)


SYNC, ASYNC, PREDUCE = TrainingMode.SYNC, TrainingMode.ASYNC, TrainingMode.PREDUCE
DYNAMIC, STATIC = Sharding.DYNAMIC, Sharding.STATIC
PLANS = {
    "static-bsp": RunPlan("static-bsp", SYNC, STATIC, None),
    "static-async": RunPlan("static-async", ASYNC, STATIC, None),
    "dynamic": RunPlan("dynamic", ASYNC, DYNAMIC, None),
    # The runs last about a minute: a straggler 10 s old is persistent on that scale (the default,
    # 30 s, suits jobs of hours), so a persistent one is moved while moving it still pays.
    "nd": RunPlan("nd", ASYNC, DYNAMIC, "antdt-nd", monitor=(("persistent_s", "10"),)),
    "dd": RunPlan("dd", SYNC, DYNAMIC, "antdt-dd", BatchSizing.IN_BAND),
    "dd-commands": RunPlan("dd-commands", SYNC, DYNAMIC, "antdt-dd"),
    "partial-reduce": RunPlan("partial-reduce", PREDUCE, DYNAMIC, None),
}
POLICIES = ("nd", "dd", "off")


def demo_plan(scenario: Scenario, policy: str | None) -> RunPlan:
    """The demo's plan: the scenario's cluster mode, with ``policy`` (default: the mode's own) or
    none."""
    training = ASYNC if scenario.mode is ClusterMode.ND else SYNC
    chosen = policy or scenario.mode.value
    if chosen not in POLICIES:
        raise ConfigError(f"policy {chosen!r}: choose one of {', '.join(POLICIES)}")
    if chosen == "off":
        return RunPlan("dynamic" if training is ASYNC else "sync-dynamic", training, DYNAMIC, None)
    # the policy's own mode: its bench plan, sizing included
    own = PLANS[chosen].training is training
    return RunPlan(
        chosen if own else f"{chosen}-on-{scenario.mode.value}",
        training,
        DYNAMIC,
        f"antdt-{chosen}",
        PLANS[chosen].sizing if own else BatchSizing.COMMANDS,
        PLANS[chosen].monitor,
    )
