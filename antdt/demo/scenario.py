"""Scenarios: who trains how fast, when stragglers strike, and the ideal time that allows.

A scenario file (YAML or JSON, see ``scenarios/standard.yaml``) describes the
workers and their base speeds, straggler episodes (worker, start, end, how
many times slower, and whether the cause is a sleep or CPU contention),
speed noise, the cluster mode (``nd``: shared cluster, workers train
independently; ``dd``: dedicated cluster, synchronous all-reduce), the
dataset and the epochs, and optionally the held-out loss ``antdt bench``
times each plan to (``target_loss``).

Speeds are in samples per second. A worker's speed at time ``t`` (seconds
since the run's start signal) is ``base_rate * speed / factor(t) / noise(t)``
where ``factor`` is the active episode's slowdown (1 outside episodes) and
``noise`` is a factor drawn uniformly in ``[1 - amplitude, 1 + amplitude]``,
held for ``period_s`` and redrawn (seeded, so every run and the ideal see the
same noise). A step of ``b`` samples starting at ``t`` is paced to last
``(A + b) / speed(t)`` (:mod:`antdt.demo.pacing`), where ``A`` is the step's
fixed cost in samples (``step_fixed_s`` of a speed-1.0 worker, so a slower
worker is slower at both parts, as a slower device is).

The ideal (:meth:`Scenario.ideal_time_s`) is the physical limit: the time at
which the integral of the workers' summed speeds reaches the total work
(dataset size x epochs). With a fixed cost, at the scenario's global batch
``B = n b`` the best any split can do, synchronous or not, is every worker
busy with steps that all end together, which trains ``b / (b + A)`` of the
summed speed; or, when a slow worker's fixed part alone outlasts that step,
the same with only the fastest ``k`` workers taking part (a worker with no
samples computes nothing), whichever trains more (:meth:`Scenario.rate_at`).
No schedule can train faster on these workers at that batch.
"""

from __future__ import annotations

import functools
import json
import math
import random
from enum import Enum
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from antdt.demo.cluster import Episode, NodeSpec, best_speeds, check_apart
from antdt.errors import ConfigError

SCENARIO_DIR = Path(__file__).parent / "scenarios"


class ClusterMode(str, Enum):
    """How the workers train: independently (shared cluster) or in lockstep (dedicated cluster)."""

    ND = "nd"
    DD = "dd"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class WorkerSpec(_Strict):
    """One worker: the node it starts on, or (a scenario without nodes) its own speed and
    episodes."""

    name: str = Field(pattern=r"^[A-Za-z0-9._-]+$")
    node: str | None = None
    speed: float = Field(1.0, gt=0)
    episodes: tuple[Episode, ...] = ()

    @model_validator(mode="after")
    def _apart(self) -> WorkerSpec:
        if self.node is not None and (self.speed != 1.0 or self.episodes):
            raise ValueError(
                f"worker {self.name} runs on node {self.node}: "
                "its speed and episodes belong to the node"
            )
        check_apart(f"worker {self.name}", self.episodes)
        return self

    def own_node(self) -> NodeSpec:
        """The node of its own a worker has in a scenario without nodes."""
        return NodeSpec(name=f"node-{self.name}", speed=self.speed, episodes=self.episodes)


class Noise(_Strict):
    """Each worker's speed varies by up to ``amplitude`` either way, redrawn every ``period_s``."""

    amplitude: float = Field(0.0, ge=0, lt=1)
    period_s: float = Field(5.0, gt=0)


class Scenario(_Strict):
    """Everything a demo or benchmark run needs to know about the workload."""

    name: str
    description: str = ""
    mode: ClusterMode = ClusterMode.ND
    base_rate: float = Field(400.0, gt=0, description="samples per second of a speed-1.0 worker")
    workers: tuple[WorkerSpec, ...] = Field(min_length=1)
    noise: Noise = Noise()
    dataset_size: int = Field(gt=0)
    shard_size: int = Field(gt=0)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(32, ge=1, description="each worker's initial local batch")
    step_fixed_s: float = Field(
        0.0, ge=0, description="each step's fixed cost on a speed-1.0 worker, in seconds"
    )
    checkpoint_every_s: float = Field(
        10.0, gt=0, description="sync: seconds between the group's checkpoints"
    )
    parameter_servers: int = Field(
        1, ge=1, le=64, description="parameter-server shards of asynchronous plans"
    )
    ps_work_s: float = Field(
        0.0,
        ge=0,
        description="seconds of parameter-server work per pull, gradient and "
        "update on a speed-1.0 node (0: the servers are not paced)",
    )
    nodes: tuple[NodeSpec, ...] = Field(
        (), description="the machines; none: each worker has one of its own"
    )
    server_nodes: tuple[str, ...] = Field(
        (), description="the node each parameter-server shard starts on, in shard order"
    )
    seed: int = 0
    report_interval_s: float = Field(1.0, gt=0)
    monitor: dict[str, str] = Field(
        default_factory=dict, description="monitor settings (monitor.<key>)"
    )
    controller: dict[str, str] = Field(
        default_factory=dict, description="controller settings (controller.<key>)"
    )
    grouper: dict[str, str] = Field(
        default_factory=dict,
        description="partial reduce: `antdt grouper` options (group_size, deadline_ms)",
    )
    target_loss: float | None = Field(
        None,
        gt=0,
        description="the held-out loss a run must reach; `antdt bench` reports the time to it",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        names = [w.name for w in self.workers]
        if len(set(names)) != len(names):
            raise ValueError("worker names must be unique")
        if self.dataset_size % len(self.workers):
            raise ValueError(
                f"dataset_size {self.dataset_size} must split evenly over "
                f"{len(self.workers)} workers (static sharding gives each the same slice)"
            )
        self._placed_on_nodes()
        return self

    def _placed_on_nodes(self) -> None:
        """With nodes: every process on a node of its own that is not a spare; without: nobody names
        a node."""
        if not self.nodes:
            if self.server_nodes or any(w.node for w in self.workers):
                raise ValueError("processes name nodes but the scenario has no nodes")
            return
        known = {n.name: n for n in self.nodes}
        if len(known) != len(self.nodes):
            raise ValueError("node names must be unique")
        if len(self.server_nodes) != self.parameter_servers:
            raise ValueError(
                "server_nodes must name a node for each of the "
                f"{self.parameter_servers} parameter servers"
            )
        homes = [w.node for w in self.workers] + list(self.server_nodes)
        for name, home in zip([w.name for w in self.workers] + self.server_names, homes):
            if home is None or home not in known:
                raise ValueError(f"{name} must run on one of the scenario's nodes (got {home})")
            if known[home].spare:
                raise ValueError(f"{name} starts on {home}, a spare: spares start empty")
        if len(set(homes)) != len(homes):
            raise ValueError("two processes start on one node: a node hosts one process")

    # ------------------------------------------------------------ loading

    @classmethod
    def load(cls, source: str | Path) -> Scenario:
        """A file path, or the name of a shipped scenario (``standard``, ``short``); ConfigError on
        one line."""
        path = Path(source)
        if not path.exists() and (SCENARIO_DIR / f"{source}.yaml").exists():
            path = SCENARIO_DIR / f"{source}.yaml"
        try:
            text = path.read_text()
        except OSError as exc:
            shipped = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml")))
            raise ConfigError(
                f"scenario {source}: {exc.strerror or exc} (shipped scenarios: {shipped})"
            ) from None
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
            return cls.model_validate(data)
        except (yaml.YAMLError, json.JSONDecodeError) as exc:
            raise ConfigError(
                f"scenario {path}: not valid {'JSON' if path.suffix == '.json' else 'YAML'}: "
                f"{str(exc).splitlines()[0]}"
            ) from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "top level"
            raise ConfigError(f"scenario {path}: {where}: {first['msg']}") from None

    def with_workers(self, count: int) -> Scenario:
        """The first ``count`` workers (plain speed-1.0 ones added if there are fewer); the dataset
        is trimmed to split evenly.

        A scenario with nodes places its own processes: ConfigError.
        """
        if self.nodes:
            raise ConfigError(
                f"scenario {self.name} places its workers on nodes: run it with its own "
                f"{len(self.workers)} workers (no --workers)"
            )
        workers = list(self.workers[:count])
        workers += [WorkerSpec(name=f"w{i}") for i in range(len(workers), count)]
        size = max(count, self.dataset_size - self.dataset_size % count)
        return self.model_copy(update={"workers": tuple(workers), "dataset_size": size})

    # ------------------------------------------------------------ nodes

    @property
    def server_names(self) -> list[str]:
        return [f"ps-{k}" for k in range(self.parameter_servers)]

    @property
    def cluster(self) -> tuple[NodeSpec, ...]:
        """Every node: the scenario's, or one per worker (its speed and episodes) and one per
        parameter server."""
        return _cluster(self.nodes, self.workers, self.parameter_servers)

    def home(self, process: str) -> str:
        """The node a worker (by name) or parameter-server shard (``ps-<k>``) starts on."""
        names = [w.name for w in self.workers] + self.server_names
        if process not in names:
            raise KeyError(f"no process {process} in scenario {self.name}")
        return [node.name for node in self._homes()][names.index(process)]

    def _homes(self) -> list[NodeSpec]:
        by_name = {n.name: n for n in self.cluster}
        if not self.nodes:
            return list(self.cluster)
        return [by_name[w.node] for w in self.workers] + [by_name[n] for n in self.server_nodes]

    def node(self, name: str) -> NodeSpec:
        index = _node_index(self.cluster).get(name)
        if index is None:
            raise KeyError(f"no node {name} in scenario {self.name}")
        return self.cluster[index]

    def node_speed(self, name: str, t: float) -> float:
        """Node ``name``'s speed in samples per second at ``t`` (noise included: it belongs to the
        node)."""
        index = _node_index(self.cluster)[name]
        node = self.cluster[index]
        return self.base_rate * node.speed / node.factor_at(t) / self.noise_at(index, t)

    # ------------------------------------------------------------ speeds

    @property
    def total_samples(self) -> int:
        return self.dataset_size * self.epochs

    def noise_at(self, index: int, t: float) -> float:
        """The noise factor on the step times of node ``index`` of :attr:`cluster` at ``t`` (1.0
        without noise)."""
        if not self.noise.amplitude:
            return 1.0
        period = math.floor(max(t, 0.0) / self.noise.period_s)
        draw = random.Random(f"{self.seed}/{index}/{period}").uniform(-1.0, 1.0)
        return 1.0 + self.noise.amplitude * draw

    @property
    def fixed_samples(self) -> float:
        """A step's fixed cost in samples: what a speed-1.0 worker trains in ``step_fixed_s``."""
        return self.step_fixed_s * self.base_rate

    @property
    def fixed_cost_factor(self) -> float:
        """The share of the summed speed a split at the scenario's batch can train (1.0 without a
        fixed cost)."""
        return self.batch_size / (self.batch_size + self.fixed_samples)

    def step_s(self, rank: int, t: float, samples: int, node: str | None = None) -> float:
        """How long worker ``rank``'s step of ``samples`` starting at ``t`` lasts on ``node``
        (default: where it started)."""
        return (self.fixed_samples + samples) / self.node_speed(node or self._homes()[rank].name, t)

    def speed_at(self, rank: int, t: float) -> float:
        """Worker ``rank``'s speed in samples per second at ``t``, on the node it started on."""
        return self.node_speed(self._homes()[rank].name, t)

    def change_points(self, horizon_s: float) -> list[float]:
        """Every time up to ``horizon_s`` at which some node's speed may change (sorted, from 0)."""
        points = {0.0, horizon_s}
        for node in self.cluster:
            points.update(p for p in node.change_points() if p < horizon_s)
        if self.noise.amplitude:
            points.update(
                k * self.noise.period_s for k in range(1, int(horizon_s / self.noise.period_s) + 1)
            )
        return sorted(p for p in points if p <= horizon_s)

    def worker_speeds(self, t: float) -> list[float]:
        """The workers' speeds at ``t`` the ideal counts: where they started or, with nodes, under
        the best placement."""
        if not self.nodes:
            return [self.speed_at(rank, t) for rank in range(len(self.workers))]
        nodes = self.cluster
        return best_speeds(
            [self.node_speed(n.name, t) for n in nodes],
            [n.healthy_at(t) for n in nodes],
            len(self.workers),
            self.parameter_servers,
        )

    def rate_at(self, t: float) -> float:
        """The most samples per second any split of the global batch trains at ``t`` (module
        docstring)."""
        speeds = sorted(self.worker_speeds(t), reverse=True)
        best = self.fixed_cost_factor * sum(speeds)
        total, fixed = self.batch_size * len(speeds), self.fixed_samples
        for k in range(1, len(speeds) + 1):  # the fastest k take part, each busy the whole step
            step_s = (total + k * fixed) / sum(speeds[:k])
            if speeds[k - 1] * step_s >= fixed:  # the slowest of them still has a batch >= 0
                best = max(best, total / step_s)
        return best

    def ideal_time_s(self, samples: int | None = None) -> float:
        """When the workers' summed speed has done ``samples`` (default all the work): exact, speeds
        are piecewise constant."""
        remaining = float(self.total_samples if samples is None else samples)
        horizon = 60.0
        while True:
            points = self.change_points(horizon)
            for start, end in zip(points, points[1:]):
                rate = self.rate_at(start)
                if rate * (end - start) >= remaining:
                    return start + remaining / rate
                remaining -= rate * (end - start)
            remaining = float(self.total_samples if samples is None else samples)
            horizon *= 4

    def ideal_curve(self, until_s: float, points: int = 200) -> list[tuple[float, float]]:
        """(t, samples the ideal has done by t), for the report's plot."""
        curve, done, now = [(0.0, 0.0)], 0.0, 0.0
        marks = sorted(
            set(self.change_points(until_s)) | {until_s * i / points for i in range(1, points + 1)}
        )
        for mark in marks[1:]:
            done += self.rate_at(now) * (mark - now)
            now = mark
            curve.append((now, min(done, float(self.total_samples))))
        return curve

    def summary_rows(self) -> list[tuple[str, str, str, str]]:
        """(node, who starts there, hardware speed, episodes) for the report."""
        names = [w.name for w in self.workers] + self.server_names
        homes = dict(zip([n.name for n in self._homes()], names))
        return [
            (
                node.name,
                homes.get(node.name, "spare" if node.spare else "-"),
                f"{node.speed:g}",
                ", ".join(e.describe() for e in node.episodes) or "-",
            )
            for node in self.cluster
        ]


@functools.lru_cache(maxsize=64)
def _cluster(
    nodes: tuple[NodeSpec, ...], workers: tuple[WorkerSpec, ...], servers: int
) -> tuple[NodeSpec, ...]:
    if nodes:
        return nodes
    return tuple(w.own_node() for w in workers) + tuple(
        NodeSpec(name=f"node-ps-{k}") for k in range(servers)
    )


@functools.lru_cache(maxsize=64)
def _node_index(cluster: tuple[NodeSpec, ...]) -> dict[str, int]:
    return {node.name: index for index, node in enumerate(cluster)}
