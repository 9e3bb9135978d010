"""Where each process of a run is, and where a replaced one goes: the harness as the orchestrator.

The rule is the Kubernetes remediation's (``services/controller/k8s.py``):
a process the controller RESTARTs or EVICTs is deleted and scheduled afresh,
never onto a node marked degraded (MARK_NODE_DEGRADED), and, since it was
replaced for being slow where it was, never back onto the node it left. Among
the free nodes left, spares come first. A node hosts one process. If no node
qualifies the process stays where it was, and the move says so: that restart
cannot help, and the report shows it.

A process that merely died (a chaos kill) is restarted where it was, as a
pod's container is.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from antdt.demo.scenario import Scenario
from antdt.worker.agent import EXIT_EVICTED, EXIT_RESTART

#: Exit codes of a process the controller replaced, and the command's name.
REPLACED = {EXIT_RESTART: "RESTART", EXIT_EVICTED: "EVICT"}


@dataclass(frozen=True)
class Move:
    """One placement decision, for the timeline and the report."""

    t: float
    process: str
    source: str
    target: str
    reason: str

    @property
    def helped(self) -> bool:
        return self.target != self.source

    def describe(self) -> str:
        return f"{self.process}: {self.source} -> {self.target} ({self.reason})"


class Placement:
    """The run's placement: process -> node, the degraded nodes, and every move made."""

    def __init__(self, scenario: Scenario, on_move: Callable[[Move], None] = lambda move: None):
        """``on_move``: told of each move as it is made (the run's timeline)."""
        self.scenario, self.on_move = scenario, on_move
        names = [w.name for w in scenario.workers] + scenario.server_names
        self.where: dict[str, str] = {name: scenario.home(name) for name in names}
        self.degraded: set[str] = set()
        self.moves: list[Move] = []

    def mark_degraded(self, node: str) -> None:
        self.degraded.add(node)

    def replace(self, process: str, t: float, why: str) -> Move:
        """Place ``process`` again after a RESTART or EVICT (module docstring); the move is
        recorded."""
        source = self.where[process]
        taken = set(self.where.values())
        free = [
            n for n in self.scenario.cluster if n.name not in taken and n.name not in self.degraded
        ]
        free.sort(key=lambda n: not n.spare)  # spares first, then the cluster's order
        if free:
            target = free[0]
            reason = f"{why}; {'spare' if target.spare else 'free node'} {target.name}" + (
                f", {source} marked degraded" if source in self.degraded else ""
            )
        else:
            target = self.scenario.node(source)
            reason = f"{why}; no free healthy node: stays on {source}"
        self.where[process] = target.name
        move = Move(t, process, source, target.name, reason)
        self.moves.append(move)
        self.on_move(move)
        return move


def node_at(scenario: Scenario, process: str, moves: list[Move], t: float) -> str:
    """The node ``process`` ran on at ``t``: where it started, or where its last move before ``t``
    took it."""
    node = scenario.home(process)
    for move in moves:
        if move.process == process and move.t <= t:
            node = move.target
    return node
