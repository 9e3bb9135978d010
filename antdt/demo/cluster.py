"""The machines of a scenario: nodes with a speed, contention episodes, and spares.

Slowness belongs to nodes, not to processes: a process runs at the speed of
the node it is on, so one moved to a healthy node runs at that node's speed
(:mod:`antdt.demo.placement` decides where a restarted process goes).

A node's speed at ``t`` is ``base_rate * speed / factor(t) / noise(t)``:
``speed`` is its hardware (0.5: half as fast, for good), ``factor`` the
active contention episode's slowdown, ``noise`` the scenario's seeded jitter.
A spare starts empty; every other node hosts one process at the start, and a
node never hosts two (one machine per worker or parameter-server shard).

:func:`best_speeds` is what the ideal uses: the speeds the workers would
have at ``t`` under the best placement of every process on the hardware
there is, spares included.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Episode(_Strict):
    """``start_s <= t < end_s`` (no end: to the end of the run): ``factor`` times slower, from a
    sleep or CPU work."""

    start_s: float = Field(ge=0)
    end_s: float | None = Field(None, gt=0)
    factor: float = Field(ge=1)
    cause: Literal["sleep", "cpu"] = "sleep"

    @model_validator(mode="after")
    def _ordered(self) -> Episode:
        if self.end_s is not None and self.end_s <= self.start_s:
            raise ValueError(f"episode {self.start_s:g}-{self.end_s:g}: end must be after start")
        return self

    @property
    def until_s(self) -> float:
        return math.inf if self.end_s is None else self.end_s

    def covers(self, t: float) -> bool:
        return self.start_s <= t < self.until_s

    def describe(self) -> str:
        end = "end" if self.end_s is None else f"{self.end_s:g}"
        return f"{self.start_s:g}-{end} s x{self.factor:g} ({self.cause})"


def check_apart(owner: str, episodes: tuple[Episode, ...]) -> None:
    """Episodes of one machine may not overlap (ValueError naming ``owner``)."""
    ordered = sorted(episodes, key=lambda e: e.start_s)
    for before, after in zip(ordered, ordered[1:]):
        if after.start_s < before.until_s:
            raise ValueError(
                f"{owner}: episodes starting at {before.start_s:g} and {after.start_s:g} overlap"
            )


class NodeSpec(_Strict):
    """One machine: its hardware speed (1.0 = the scenario's ``base_rate``), its contention, and
    whether it is a spare."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    speed: float = Field(1.0, gt=0)
    episodes: tuple[Episode, ...] = ()
    spare: bool = False

    @model_validator(mode="after")
    def _apart(self) -> NodeSpec:
        check_apart(f"node {self.name}", self.episodes)
        return self

    def episode_at(self, t: float) -> Episode | None:
        return next((e for e in self.episodes if e.covers(t)), None)

    def factor_at(self, t: float) -> float:
        episode = self.episode_at(t)
        return episode.factor if episode else 1.0

    def healthy_at(self, t: float) -> bool:
        """Full hardware and no contention at ``t``: a node the ideal would trust a parameter server
        to."""
        return self.speed >= 1.0 and self.episode_at(t) is None

    def change_points(self) -> set[float]:
        return {p for e in self.episodes for p in (e.start_s, e.end_s) if p is not None}


def best_speeds(
    speeds: list[float], healthy: list[bool], workers: int, servers: int
) -> list[float]:
    """The workers' speeds under the best placement of ``workers`` workers and ``servers`` PS
    shards, one per node.

    Every parameter-server shard gets a healthy node (a PS on a contended
    node slows every worker), the slowest healthy ones, so the fastest nodes
    are left to the workers; with too few healthy nodes the PS shards take
    the fastest of the rest. The workers take the fastest remaining nodes.
    """
    order = sorted(range(len(speeds)), key=lambda i: speeds[i])
    reserved = [i for i in order if healthy[i]][:servers]
    reserved += [i for i in reversed(order) if i not in reserved][: servers - len(reserved)]
    left = sorted((speeds[i] for i in range(len(speeds)) if i not in reserved), reverse=True)
    return left[:workers]
