"""Batch-size commands that take effect at one step on every rank they change.

The DD controller sends a new size only to the ranks whose size changes,
all with one effective step and the number of ranks it changes. A command
that arrives after that step would otherwise be applied late on its rank
alone, and the global batch would be off for the steps between. So the ranks
agree in-band: in every step's all-reduce each rank offers whether it holds
a pending command, the size it would then have (its current size otherwise)
and the command's effective step; the sums are the same on every rank, and
once every changed rank holds its command of the same decision and the
sizes add up to the global batch, the pending commands take effect at the
next step at or after their effective step, on every changed rank at once.
Normally that is the effective step itself; a late command delays the
switch, never splits it. Ranks whose size does not change are never waited
for. A command that does not say how many ranks it changes (sent by hand)
switches once the sizes add up: the global batch still never moves.
"""

from __future__ import annotations

from dataclasses import dataclass

from antdt.schemas.models import RANKS_CHANGED, MitigationCommand


@dataclass
class AgreedResize:
    """One rank's pending batch-size command and the in-band agreement on when it switches
    (pure)."""

    pending: MitigationCommand | None = None
    _offered: MitigationCommand | None = None

    def receive(self, command: MitigationCommand) -> MitigationCommand | None:
        """Hold ``command`` until agreed; returns the pending one it supersedes, if any."""
        superseded, self.pending = self.pending, command
        return superseded

    def offer(self, current_size: int) -> list[int]:
        """This rank's counters for the step's all-reduce: [holds a command, size it would have, its
        step]."""
        self._offered = self.pending
        if self.pending is None:
            return [0, current_size, 0]
        return [1, self.pending.batch_size, self.pending.effective_step or 0]

    def agreed(
        self, sums: list[int], next_step: int, global_batch: int
    ) -> MitigationCommand | None:
        """The command to apply from ``next_step`` on, given the summed offers of the last
        all-reduce.

        ``global_batch``: the job's, for a command that does not name one.
        """
        command = self._offered
        holders, total, steps = sums
        if command is None or command is not self.pending or not holders:
            return None
        step = command.effective_step or 0
        changed = int(command.parameters.get(RANKS_CHANGED, holders))
        if (
            holders != changed
            or steps != holders * step
            or total != (command.global_batch_size or global_batch)
        ):
            return None  # some changed rank does not hold its command (of this decision) yet
        if next_step < step:
            return None
        self.pending = self._offered = None
        return command
