"""A managed roll of the embedded broker: started again, empty, once its log holds too much.

The embedded broker keeps every record in memory and deletes none (it has no
retention, and DeleteRecords drops the connection), and every fetch that
returns data lists every stored batch of its partition: its memory and its
CPU grow with its log until it starves the services (docs/reliability.md,
"Soak"). A Kafka cluster has retention; ``antdt up`` on the embedded broker
has this roll instead: once the broker's resident memory passes a bound, it
is restarted empty and the topics are created again. Everything on the bus
survives that as it survives a broker crash, which the chaos runs inject:
clients see the cluster id change, the sharder writes its jobs' shard state
into the new log, agents send their recent reports again. What a roll costs
(a few seconds without a bus, the shard log's history before it) is written
up beside the soak's figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from antdt.embedded.broker import EmbeddedBroker
from antdt.errors import BrokerError


@dataclass
class BrokerRoll:
    """Restarts ``broker`` when its RSS passes ``bound_mb`` (checked every ``every_s``).

    ``recreate`` makes the topics again after a roll (the services would too,
    on noticing the reset, but a few seconds later).
    """

    broker: EmbeddedBroker
    bound_mb: float
    recreate: Callable[[], object]
    every_s: float = 5.0
    rolls: list[float] = field(default_factory=list)  # each roll's seconds without a broker
    _next_check: float = 0.0

    def __post_init__(self) -> None:
        if self.bound_mb <= 0:
            raise ValueError(f"the roll's bound must be positive, not {self.bound_mb} MB")

    def resident_mb(self) -> float:
        """The broker process's resident memory, MiB."""
        try:
            return psutil.Process(self.broker.pid).memory_info().rss / 2**20
        except (psutil.Error, TypeError, ValueError) as exc:
            raise BrokerError(f"the embedded broker's memory cannot be read: {exc}") from None

    def check(self, now: float | None = None) -> str | None:
        """Roll if the bound is passed (at most once every ``every_s``); a line saying so, or
        None."""
        now = time.monotonic() if now is None else now
        if now < self._next_check:
            return None
        self._next_check = now + self.every_s
        held = self.resident_mb()
        if held <= self.bound_mb:
            return None
        down_s = self.broker.restart()
        self.recreate()
        self.rolls.append(down_s)
        return (
            f"rolled the embedded broker's log (roll {len(self.rolls)}): it held {held:.0f} MB, "
            f"more than {self.bound_mb:g} MB; back in {down_s:.2f} s, empty"
        )
