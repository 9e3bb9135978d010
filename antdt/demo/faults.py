"""Random fault schedules: what a chaos run injects, drawn from a seed.

A fixed schedule tries the faults someone thought of; a drawn one tries the
orders and timings nobody did. :func:`draw_schedule` turns a seed into a
list of :class:`Fault`, each due some seconds after the one before it:

* ``KILL`` (SIGKILL; the orchestrator restarts the victim at once) of a
  training rank, a service or a parameter-server shard;
* ``STOP`` (SIGSTOP, then SIGCONT after ``hold_s``) of the same: a rank or a
  service that hangs without dying, the fail-slow fault NVIDIA's fault
  injector tries too;
* ``HOG``: a CPU hog shares one core with one rank for ``hold_s``;
* ``RESTART`` of the embedded broker, which comes back empty.

Which rank or service a fault hits is picked when it goes off, among those
running then (``target`` says ``worker`` or ``service``), so the draw does not
depend on the training mode; the chaos run (:mod:`antdt.demo.chaos`) injects
one fault at a time, each once every earlier one has recovered, as the
design's fault model requires.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum


class FaultAction(str, Enum):
    """What is done to the victim."""

    KILL = "kill"
    STOP = "stop"
    HOG = "hog"
    RESTART = "restart"


class Target(str, Enum):
    """Who is hit: a training rank, a service (a parameter-server shard is one), or the broker."""

    WORKER = "worker"
    SERVICE = "service"
    BROKER = "broker"


@dataclass(frozen=True)
class Fault:
    """One fault to inject: due ``at_s`` after the start, to a running ``target`` picked then (or
    the named service), held ``hold_s`` (a stop or a hog); ``mid_step``: a worker is hit in the
    middle of its step's exchange."""

    at_s: float
    action: FaultAction
    target: Target
    name: str | None = None
    hold_s: float = 0.0
    mid_step: bool = False

    @property
    def label(self) -> str:
        """``stop worker`` and the like: the row a runner counts it under."""
        return f"{self.action.value} {self.target.value}"


#: (action, target) -> how often it is drawn, relative to the others.
WEIGHTS: dict[tuple[FaultAction, Target], float] = {
    (FaultAction.KILL, Target.WORKER): 3.0,
    (FaultAction.STOP, Target.WORKER): 3.0,
    (FaultAction.HOG, Target.WORKER): 1.0,
    (FaultAction.KILL, Target.SERVICE): 1.5,
    (FaultAction.STOP, Target.SERVICE): 1.5,
    (FaultAction.RESTART, Target.BROKER): 0.5,
}


@dataclass(frozen=True)
class ScheduleShape:
    """How many faults, how far apart (s), and how long a stop or a hog lasts (s)."""

    faults: int = 6
    first_at_s: float = 5.0
    gap_s: tuple[float, float] = (2.0, 6.0)
    stop_s: tuple[float, float] = (1.0, 15.0)
    hog_s: tuple[float, float] = (3.0, 10.0)
    #: at most this many broker restarts in one run (each empties the bus)
    broker_restarts: int = 1


def draw_schedule(seed: int, shape: ScheduleShape | None = None) -> tuple[Fault, ...]:
    """The faults seed ``seed`` draws, due in order: the same seed, the same schedule."""
    shape = shape or ScheduleShape()
    rng = random.Random(seed)
    faults: list[Fault] = []
    at_s = shape.first_at_s
    kinds = list(WEIGHTS)
    for _ in range(shape.faults):
        restarts = sum(f.target is Target.BROKER for f in faults)
        allowed = [
            k for k in kinds if k[1] is not Target.BROKER or restarts < shape.broker_restarts
        ]
        action, target = rng.choices(allowed, weights=[WEIGHTS[k] for k in allowed])[0]
        hold_s = 0.0
        if action is FaultAction.STOP:
            hold_s = round(rng.uniform(*shape.stop_s), 1)
        elif action is FaultAction.HOG:
            hold_s = round(rng.uniform(*shape.hog_s), 1)
        mid_step = target is Target.WORKER and action is not FaultAction.HOG and rng.random() < 0.5
        faults.append(Fault(round(at_s, 1), action, target, None, hold_s, mid_step))
        at_s += rng.uniform(*shape.gap_s)
    return tuple(faults)
