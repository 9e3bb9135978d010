"""The controller's knobs; every one can change at run time as ``controller.<key>`` on the control
topic."""

from __future__ import annotations

from dataclasses import dataclass

from antdt.control.topic import refuse_broken, with_text_changes
from antdt.sizing import BatchSizing

PERSISTENT_ACTIONS = ("RESTART", "EVICT")
BATCH_SIZINGS = tuple(sizing.value for sizing in BatchSizing)


@dataclass(frozen=True)
class ControllerConfig:
    """Policy choice, safety limits and the parameters of the built-in policies."""

    policy: str = "antdt-nd"  # a registered name, or module:attribute of a custom policy
    dry_run: bool = False
    command_ttl_s: float = 60.0
    max_commands_per_minute: int = 120  # per job; a decision is published whole or not at all
    # AntDT-ND
    default_quota: int = 2
    straggler_quota: int = 1
    leader_quota: int = 4
    persistent_action: str = "RESTART"
    # a persistent straggler less slow than this keeps the quota only
    min_restart_ratio: float = 1.5
    max_restarts_per_hour: int = 4
    max_acted_fraction: float = 0.25
    worker_cooldown_s: float = 600.0
    node_cooldown_s: float = 600.0
    # a restarted worker counts as "acted on" until it is back, or this long
    action_timeout_s: float = 300.0
    # AntDT-DD
    # "in-band": the workers size their batches every step (antdt.sizing.inband)
    batch_sizing: str = "commands"
    global_batch_size: int = 0  # 0: the sum of the workers' batch sizes when the job is first seen
    min_batch_size: int = 1
    max_batch_size: int = 4096
    # a decision waits anyway until every worker has reported steps from the last switch on; 10 s
    # kept a 3x straggler at its first, rough split (734/290 of 768/256) for 10 s (docs/torchrun.md)
    rebalance_interval_s: float = 2.0
    # a healthy user-style job moved 32/32 to 36/28 at 0.05 and got 6 % slower (docs/torchrun.md)
    min_relative_change: float = 0.10
    # a command arriving after its switch step delays the switch in-band, never splits it
    switch_lead_s: float = 1.0
    # a worker with no report for this long has left (an evicted node, a shrunk job)
    silent_after_s: float = 15.0

    def __post_init__(self) -> None:
        refuse_broken(
            "controller config",
            (
                (not self.policy.strip(), "policy must be named"),
                (self.command_ttl_s <= 0, "command_ttl_s must be > 0"),
                (self.max_commands_per_minute < 1, "max_commands_per_minute must be >= 1"),
                (
                    not 0 <= self.straggler_quota <= self.default_quota <= self.leader_quota,
                    "need 0 <= straggler_quota <= default_quota <= leader_quota",
                ),
                (
                    self.persistent_action not in PERSISTENT_ACTIONS,
                    f"persistent_action must be one of {PERSISTENT_ACTIONS}",
                ),
                (self.min_restart_ratio < 1, "min_restart_ratio must be >= 1"),
                (self.max_restarts_per_hour < 0, "max_restarts_per_hour must be >= 0"),
                (not 0 < self.max_acted_fraction <= 1, "max_acted_fraction must be in (0, 1]"),
                (
                    min(self.worker_cooldown_s, self.node_cooldown_s, self.action_timeout_s) < 0,
                    "cooldowns must be >= 0",
                ),
                (self.global_batch_size < 0, "global_batch_size must be >= 0"),
                (
                    not 1 <= self.min_batch_size <= self.max_batch_size,
                    "need 1 <= min_batch_size <= max_batch_size",
                ),
                (self.rebalance_interval_s < 0, "rebalance_interval_s must be >= 0"),
                (
                    self.batch_sizing not in BATCH_SIZINGS,
                    f"batch_sizing must be one of {BATCH_SIZINGS}",
                ),
                (not 0 <= self.min_relative_change < 1, "min_relative_change must be in [0, 1)"),
                (self.switch_lead_s <= 0, "switch_lead_s must be > 0"),
                (self.silent_after_s <= 0, "silent_after_s must be > 0"),
            ),
        )

    def with_changes(self, changes: dict[str, str]) -> ControllerConfig:
        return with_text_changes(self, changes, "controller config")
