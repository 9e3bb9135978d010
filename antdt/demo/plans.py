"""The plans a scenario runs under: how it trains and which antdt parts are on.

| plan | training | sharding | policy |
|---|---|---|---|
| ``static-bsp`` | synchronous (BSP), all-reduce | static slices | none: the baseline |
| ``dynamic`` | asynchronous, parameter server | dynamic shards | none |
| ``nd`` | asynchronous, parameter server | dynamic shards | AntDT-ND |
| ``dd`` | synchronous, all-reduce | dynamic shards | AntDT-DD, batches sized in-band every step |
| ``dd-commands`` | synchronous, all-reduce | dynamic shards | AntDT-DD, batches sized by the controller's commands |

Every plan trains one shared model: through the parameter server, or kept
identical on every rank by the all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from antdt.demo.scenario import ClusterMode, Scenario
from antdt.errors import ConfigError


@dataclass(frozen=True)
class RunPlan:
    name: str
    training: str  # "async" (parameter server) or "sync" (all-reduce)
    sharding: str  # "dynamic" or "static"
    policy: str | None  # a controller policy, or None for no controller
    sizing: str = "commands"  # sync: "in-band" sizes the local batches at every step (antdt.sizing.inband)

    @property
    def label(self) -> str:
        return {"static-bsp": "static sharding, BSP (baseline)", "dynamic": "dynamic sharding only (PS)",
                "nd": "antdt, AntDT-ND (PS)", "dd": "antdt, AntDT-DD",
                "dd-commands": "antdt, AntDT-DD by commands"}.get(self.name, self.name)


PLANS = {
    "static-bsp": RunPlan("static-bsp", "sync", "static", None),
    "dynamic": RunPlan("dynamic", "async", "dynamic", None),
    "nd": RunPlan("nd", "async", "dynamic", "antdt-nd"),
    "dd": RunPlan("dd", "sync", "dynamic", "antdt-dd", "in-band"),
    "dd-commands": RunPlan("dd-commands", "sync", "dynamic", "antdt-dd"),
}
POLICIES = ("nd", "dd", "off")


def demo_plan(scenario: Scenario, policy: str | None) -> RunPlan:
    """The demo's plan: the scenario's cluster mode, with ``policy`` (default: the mode's own) or none."""
    training = "async" if scenario.mode is ClusterMode.ND else "sync"
    chosen = policy or scenario.mode.value
    if chosen not in POLICIES:
        raise ConfigError(f"policy {chosen!r}: choose one of {', '.join(POLICIES)}")
    if chosen == "off":
        return RunPlan("dynamic" if training == "async" else "sync-dynamic", training, "dynamic", None)
    own = PLANS[chosen].training == training  # the policy's own mode: its bench plan, sizing included
    return RunPlan(chosen if own else f"{chosen}-on-{scenario.mode.value}", training, "dynamic", f"antdt-{chosen}",
                   PLANS[chosen].sizing if own else "commands")
