"""Pacing a step to the speed the scenario gives a worker at that moment.

A demo worker does real torch work for every step (forward, backward, SGD on its batch), which on
its own takes a millisecond or so. The scenario says how long the step *should* take on the worker's
simulated hardware: ``(fixed + samples) / speed(t)`` (:meth:`Scenario.step_s`). :class:`Pacer` fills
the difference, either by sleeping (``cause: sleep``, and outside episodes) or, during a ``cause:
cpu`` episode, by running more torch matrix products until the deadline, so the worker really keeps
a core busy as a noisy neighbour would. If the real work alone overruns the target (an overloaded
machine), nothing is added: the step is as slow as it really was, and that counts against the run's
efficiency.
"""

from __future__ import annotations

import time

import torch

from antdt.demo.scenario import Scenario


class Pacer:
    """Makes worker ``rank``'s steps last as long as the scenario says on the node it runs on."""

    def __init__(self, scenario: Scenario, rank: int, start_wall: float, node: str | None = None):
        self.scenario, self.rank, self.start_wall = scenario, rank, start_wall
        self.node = scenario.node(node or scenario.home(scenario.workers[rank].name))
        self._burn = torch.ones(64, 64)

    def now_s(self) -> float:
        """Seconds since the run's start signal."""
        return time.time() - self.start_wall

    def pace(self, samples: int, started_s: float) -> None:
        """Hold until the step that began at ``started_s`` (run time) has lasted what the scenario
        says."""
        if samples <= 0:
            return
        target = self.scenario.step_s(self.rank, started_s, samples, self.node.name)
        remaining = started_s + target - self.now_s()
        if remaining <= 0:
            return
        episode = self.node.episode_at(started_s)
        if episode is not None and episode.cause == "cpu":
            self._busy_until(time.perf_counter() + remaining)
        else:
            time.sleep(remaining)

    def _busy_until(self, deadline: float) -> None:
        burn = self._burn
        while time.perf_counter() < deadline:
            burn = torch.mm(burn, self._burn).clamp_(-1, 1)
