"""The agent's Prometheus metrics: what a worker sees of itself, on an opt-in ``/metrics`` port.

The services' metrics show what reached the bus. A worker whose events stop
arriving (the bus away, its queue dropping the oldest) is visible only from
its own side: ``antdt_agent_report_lag_seconds`` grows, the dropped and
pending counts rise. Off by default; ``ANTDT_AGENT_METRICS_PORT`` turns it on.

* One ``CollectorRegistry`` per agent, never the global one: two agents in a
  process (tests, a parameter server's own agent) do not collide, and a
  service's metrics never mix with a worker's.
* Read at scrape time by one collector, from numbers the agent keeps anyway:
  the steps are added up once per report, off the training thread
  (:class:`StepTotals`); the training thread's only addition is one float,
  its own overhead, from clock reads it makes anyway. No lock and no
  Prometheus call on its path.
* Every series carries ``job_id`` and ``worker_id``: one agent is one scrape
  target, so they add no series, and they name the worker whatever the
  relabelling.
* Only the training process serves. A DataLoader worker process (fork or
  spawn) never starts a server (:func:`serve`), a forked one closes its copy
  of the socket (:mod:`antdt.runtime.observability`), and nothing here is
  pickled with a dataset: counts are made and read in the training process.
* Under torchrun the ranks of a node share its address: each serves on the
  set port plus ``LOCAL_RANK`` (:func:`metrics_port`); 0 means any free port
  for each, :attr:`AgentMetrics.port` tells which.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from antdt.runtime.observability import HealthServer
from antdt.schemas.models import AckStatus, CommandAction

if TYPE_CHECKING:
    from antdt.worker.agent import Agent
    from antdt.worker.emitter import EventEmitter
    from antdt.worker.steps import StepSummary

log = logging.getLogger(__name__)

#: The labels on every series: which job and worker the agent is.
IDENTITY = ("job_id", "worker_id")


def metrics_port(base: int | None, environ: Mapping[str, str] = os.environ) -> int | None:
    """The port this process serves on: None (off) unless set, else the set port plus
    ``LOCAL_RANK`` (torchrun's and other launchers'), so the ranks of one node do not collide.
    0 stays 0: each rank takes any free port."""
    if not base:
        return base
    local_rank = environ.get("LOCAL_RANK", "")
    return base + int(local_rank) if local_rank.isdigit() else base


class StepTotals:
    """The steps reported so far, added up (a checkpoint restore rewinds ``step_count``, not these:
    counters never go down). Added to once per report, off the training thread: a step shows
    here once its report is made."""

    def __init__(self) -> None:
        self.steps = self.samples = 0
        self.compute_s = self.data_wait_s = self.sync_wait_s = 0.0
        # reports are made by the reporter thread, and by the training thread at a restore
        self._lock = threading.Lock()

    def add(self, summary: StepSummary) -> None:
        with self._lock:
            self.steps += summary.step_count
            self.samples += summary.samples
            self.compute_s += summary.compute.sum_s
            self.data_wait_s += summary.data_wait_s
            self.sync_wait_s += summary.sync_wait_s


class CommandTally:
    """Acks sent, by action and status: counted on the listener thread (refusals, schedules) and
    the training thread (applied, failed) alike, hence the lock."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def add(self, action: CommandAction, status: AckStatus) -> None:
        with self._lock:
            self._counts[action.value, status.value] += 1

    def snapshot(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._counts)


class AgentMetrics:
    """One agent's registry, the numbers it reads, and (opt-in) the server that exposes them."""

    def __init__(self, agent: Agent, emitter: EventEmitter):
        self.totals = StepTotals()
        self.commands = CommandTally()
        self.registry = CollectorRegistry()
        self.registry.register(AgentCollector(agent, emitter, self))
        self._server: HealthServer | None = None

    @property
    def port(self) -> int | None:
        """The port ``/metrics`` is served on (the bound one when 0 was asked), None when off."""
        return self._server.port if self._server is not None else None

    def start(self, port: int | None, ready: Callable[[], bool]) -> None:
        if port is not None:
            self._server = serve(self.registry, port, ready)

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


def serve(registry: CollectorRegistry, port: int, ready: Callable[[], bool]) -> HealthServer | None:
    """``/metrics`` (and ``/healthz``, ``/readyz``) on ``port``, from the training process only.

    None in a DataLoader worker process (an agent made there must not take a
    second port), and when the port cannot be had: metrics are not worth a
    training run, the warning and the missing scrape target say it.
    """
    if _in_loader_process():
        log.info("agent metrics: not served from a DataLoader worker process")
        return None
    try:
        return HealthServer(port, ready, registry).start()
    except OSError as exc:
        log.warning("agent metrics: cannot serve on port %d (%s); training goes on", port, exc)
        return None


def _in_loader_process() -> bool:
    data = sys.modules.get("torch.utils.data")  # never imports torch itself
    return data is not None and data.get_worker_info() is not None


class AgentCollector(Collector):
    """Reads one agent's numbers into Prometheus families at each scrape."""

    def __init__(self, agent: Agent, emitter: EventEmitter, metrics: AgentMetrics):
        self._agent, self._emitter, self._metrics = agent, emitter, metrics

    def collect(self) -> Iterator[Metric]:
        agent = self._agent
        family = _Families([agent.spec.job_id, agent.spec.worker_id])
        yield from self._steps(family)
        yield from self._events(family)
        yield from self._commands(family)
        yield family.counter(
            "antdt_agent_deadlettered",
            "Records on this worker's keys that were no command or shard answer (dead-lettered)",
            agent.deadlettered,
        )
        yield family.gauge("antdt_agent_paused", "1 while a PAUSE holds training", agent.paused)
        yield family.gauge("antdt_agent_batch_size", "The local batch size", agent.batch_size)

    def _steps(self, family: _Families) -> Iterator[Metric]:
        totals = self._metrics.totals
        yield family.counter("antdt_agent_steps", "Training steps reported", totals.steps)
        yield family.counter("antdt_agent_samples", "Samples trained, as reported", totals.samples)
        yield family.counter(
            "antdt_agent_step_seconds",
            "Step time by part: compute, waiting for data, waiting at synchronisation",
            {
                ("compute",): totals.compute_s,
                ("data_wait",): totals.data_wait_s,
                ("sync_wait",): totals.sync_wait_s,
            },
            ("part",),
        )
        yield family.counter(
            "antdt_agent_overhead_seconds",
            "Training-thread time in the agent's own step() (not in any step's time)",
            self._agent.overhead_s,
        )

    def _events(self, family: _Families) -> Iterator[Metric]:
        emitter = self._emitter
        yield family.counter(
            "antdt_agent_events_sent",
            "Events (reports, heartbeats, acks) the bus acknowledged",
            emitter.delivered,
        )
        yield family.counter(
            "antdt_agent_events_dropped",
            "Events lost: undelivered (queue full while the bus was away, or refused) or "
            "unencodable",
            {("undelivered",): emitter.dropped, ("unencodable",): emitter.failed},
            ("reason",),
        )
        yield family.gauge(
            "antdt_agent_events_pending", "Events queued, not yet acknowledged", emitter.unsent
        )
        yield family.gauge(
            "antdt_agent_report_lag_seconds",
            "Seconds since the bus last acknowledged an event of this agent (since it was made, "
            "before the first); heartbeats keep it under the heartbeat interval while it reports",
            time.monotonic() - emitter.last_delivered,
        )

    def _commands(self, family: _Families) -> Iterator[Metric]:
        yield family.counter(
            "antdt_agent_commands",
            "Commands acknowledged, by action and status (APPLIED, REJECTED, FAILED, ...)",
            self._metrics.commands.snapshot(),
            ("action", "status"),
        )
        # dict() copies the listener thread's Counter in one step under the GIL
        rejected = dict(self._agent.verifier.rejected)
        yield family.counter(
            "antdt_agent_commands_rejected",
            "Commands refused, by reason (wrong_target, unsigned, bad_signature, stale_epoch, "
            "expired, duplicate)",
            {(reason.replace(" ", "_"),): count for reason, count in rejected.items()},
            ("reason",),
        )


class _Families:
    """Builds families whose every sample carries the agent's identity labels."""

    def __init__(self, identity: list[str]):
        self._identity = identity

    def counter(self, name, documentation, values, labels=()) -> CounterMetricFamily:
        return self._filled(CounterMetricFamily, name, documentation, values, labels)

    def gauge(self, name, documentation, values, labels=()) -> GaugeMetricFamily:
        return self._filled(GaugeMetricFamily, name, documentation, values, labels)

    def _filled(self, kind, name, documentation, values, labels):
        """``values``: one number, or a mapping from label values (a tuple) to numbers."""
        family = kind(name, documentation, labels=[*IDENTITY, *labels])
        items = values.items() if isinstance(values, Mapping) else [((), values)]
        for label_values, value in items:
            family.add_metric([*self._identity, *label_values], float(value))
        return family
