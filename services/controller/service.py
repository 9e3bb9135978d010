"""``antdt controller``: verdicts and worker reports in, signed and fenced commands out.

One active controller per deployment. Each cycle it

1. reads a batch of verdicts (``monitor.verdicts``) and worker reports
   (``worker.metrics``) from every partition by manual assignment, so the two
   topics need not be co-partitioned and no group join delays a takeover;
   it resumes from the offsets it committed, or from the end the first time
   (old verdicts are not acted on again);
2. lets :class:`ControllerCore` decide (policies, budgets, dry run, rate
   limit, ids, epoch, signature);
3. publishes the commands to ``controller.commands`` keyed
   ``<job>/<worker>`` (each agent reads its own partition) and waits until
   they are durable before committing the input: the commands topic is the
   audit log.

**Memory.** At start the controller reads the last hour of the commands
topic back (its predecessors' decisions) to rebuild budgets, cooldowns,
quotas and batch sizes, and the verdict ids already acted on.

**Epoch.** At start the controller reads the control topic's history, takes
the highest ``controller.epoch`` written so far plus one and appends it; of
two rivals claiming the same epoch, the first in the log wins and the other
claims the next. A controller that later sees a higher epoch than its own has
been replaced: it stops issuing commands and reports not ready. Agents reject
commands older than the highest epoch they have seen, which fences a
controller that has not noticed yet.

Run-time configuration (policy, thresholds, dry run) follows the control
topic as ``controller.<key>`` without a restart.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from confluent_kafka import OFFSET_END, Message, TopicPartition

from antdt.bus.admin import ensure_topics, partition_counts
from antdt.bus.clients import drain, flush_or_raise, make_admin, make_consumer, make_producer
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.readers import assign_now, decode_or_deadletter, poll_batch
from antdt.bus.watch import Rewinder, refresh_metadata, shared_watch
from antdt.control import ControlFollower, apply_and_count, control_topic
from antdt.errors import BusError
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import ControlConfig, MitigationCommand, StragglerVerdict, WorkerMetrics
from antdt.services.controller import metrics
from antdt.services.controller.audit import read_commands
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.core import ControllerCore, Outcome
from antdt.services.controller.epoch import claimed_epoch, epoch_claim
from antdt.services.controller.k8s import KubernetesActuator
from antdt.services.controller.safety import Stamp
from antdt.service_loop import LoopService
from antdt.settings import Settings
from antdt.topics import topic_spec, worker_key

log = logging.getLogger(__name__)

#: How far back a starting controller reads its predecessors' commands: the
#: longest budget window (restarts per hour) and cooldown it must honour.
RECALL = timedelta(hours=1)


@dataclass(frozen=True)
class ServiceConfig:
    batch_size: int = 1000
    poll_timeout_s: float = 0.05
    control_poll_s: float = 0.25


class ControllerService(LoopService):
    """See the module docstring."""

    def __init__(self, settings: Settings, defaults: ControllerConfig | None = None, config: ServiceConfig | None = None,
                 controller_id: str | None = None, actuator: KubernetesActuator | None = None):
        self.settings = settings
        self.actuator = actuator
        self.config = config or ServiceConfig()
        self.controller_id = controller_id or f"controller-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.codec: Codec = make_codec(settings.schema_registry_url)
        self.core = ControllerCore(defaults)
        self.ready = threading.Event()
        self.fenced = False
        self.highest_epoch = 0
        self._producer = make_producer(settings, client_id=self.controller_id, **{"linger.ms": 0})
        self._deadletter = DeadLetter.for_settings(self._producer, settings, "controller", counter=metrics.DEADLETTERED)
        self._follower = ControlFollower(settings, self.codec, client_id=f"{self.controller_id}-control")
        self._commands_topic = settings.topic("controller", "commands")
        self._inputs = [settings.topic("monitor", "verdicts"), settings.topic("worker", "metrics")]
        self._consumer = None
        self._watch = None
        self._rewinder: Rewinder | None = None
        self._last_control_poll = 0.0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ControllerService:
        """Create topics, fold the control history, claim an epoch, position the input."""
        ensure_topics(make_admin(self.settings), self.settings)
        for change in self._follower.catch_up():
            self._on_control(change)
        self._claim_epoch()
        if self.highest_epoch > self.core.stamp.epoch:
            self._stand_down(f"epoch {self.highest_epoch} was claimed while we claimed {self.core.stamp.epoch}")
        self._recall_recent_commands()
        self._consumer = make_consumer(self.settings, group_id=f"{self.settings.topic_prefix}.controller",
                                       client_id=self.controller_id, low_latency=True)
        assign_now(self._consumer, self._start_positions())
        self._watch = shared_watch(self.settings)
        self._rewinder = Rewinder(self._consumer, self._watch)
        self._follower.follow_resets(self._watch)
        if self.actuator is not None:
            self.actuator.start()
        if not self.fenced:
            self.ready.set()
        log.info("controller %s serving with epoch %d", self.controller_id, self.core.stamp.epoch)
        return self

    def _recall_recent_commands(self) -> None:
        """Rebuild budgets, cooldowns and quotas from the audit log, so a restart does not reset them."""
        since = datetime.now(timezone.utc) - RECALL
        recalled = self.core.recall(read_commands(self.settings, self.codec, start=since))
        log.info("recalled %d command(s) issued since %s", recalled, since.isoformat(timespec="seconds"))

    def _claim_epoch(self, timeout_s: float = 30.0) -> None:
        """Append ``highest + 1`` and read on until it comes back: the first claim of an epoch wins."""
        while True:
            claim = epoch_claim(self.highest_epoch + 1, self.controller_id)
            self._producer.produce(control_topic(self.settings), key=b"*", value=self.codec.encode(claim))
            flush_or_raise(self._producer)
            winner = None
            for change in self._follow_until(claim.config_id, timeout_s):
                if winner is None and claimed_epoch(change) == claimed_epoch(claim):
                    winner = change.issued_by
                self._on_control(change)
            if winner == self.controller_id:
                key = self.settings.signing_key
                self.core.stamp = Stamp(claimed_epoch(claim), key.get_secret_value().encode() if key else None)
                metrics.EPOCH.set(self.core.stamp.epoch)
                return

    def _follow_until(self, config_id: str, timeout_s: float):
        """Control records from where the follower is, up to and including the one with ``config_id``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for change in self._follower.poll(timeout_s=0.1):
                yield change
                if change.config_id == config_id:
                    return
        raise BusError(f"our epoch claim {config_id} did not come back within {timeout_s:.0f} s")

    def _start_positions(self) -> list[TopicPartition]:
        counts = partition_counts(make_admin(self.settings), self._inputs)
        wanted = [TopicPartition(topic, p) for topic in self._inputs for p in range(counts[topic])]
        committed = self._consumer.committed(wanted, timeout=10)
        return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in committed]

    def close(self) -> None:
        self.ready.clear()
        if self.actuator is not None:
            self.actuator.close()
        drain(self._producer)
        self._follower.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        if self._watch is not None:
            self._watch.release()
            self._watch = None

    # ------------------------------------------------------------ one cycle

    def step(self) -> int:
        """Process one batch of input; returns how many records it read."""
        self._after_bus_reset()
        self._follow_control()
        messages = poll_batch(self._consumer, self.config.batch_size, self.config.poll_timeout_s)
        if not messages:
            return 0
        published: list[MitigationCommand] = []
        for message in messages:
            event = decode_or_deadletter(message, self.codec, self._deadletter, expected=(StragglerVerdict, WorkerMetrics))
            if event is not None:
                published += self._publish(self._decide_or_deadletter(message, event))
        if published:
            flush_or_raise(self._producer)  # commands durable before the input is committed
            self._actuate(published)
        self._consumer.commit(asynchronous=True)
        return len(messages)

    def _decide_or_deadletter(self, message: Message, event: StragglerVerdict | WorkerMetrics) -> Outcome:
        """The decision on one event; a policy that fails on it costs that record, not the controller.

        The failure is a bug (the event passed every check of its model), so
        it is logged with its traceback; nothing was published for it, and
        the view a policy reads is rebuilt by the next reports of the worker.
        """
        try:
            return self._decide(event)
        except Exception as exc:
            log.exception("deciding failed for %s[%d]@%d", message.topic(), message.partition(), message.offset())
            self._deadletter.send(SourceRecord.from_confluent(message), exc)
            return Outcome()

    def _decide(self, event: StragglerVerdict | WorkerMetrics) -> Outcome:
        now = datetime.now(timezone.utc)
        if isinstance(event, StragglerVerdict):
            metrics.VERDICTS.inc()
            return self.core.on_verdict(event, now)
        return self.core.on_metrics(event, now)

    def _publish(self, outcome: Outcome) -> list[MitigationCommand]:
        for reason in outcome.skipped:
            metrics.SKIPPED.inc()
            log.info("not done: %s", reason)
        if self.fenced:
            metrics.FENCED_DROPS.inc(len(outcome.commands))
            return []
        for command in outcome.commands:
            key = worker_key(command.job_id, command.target_worker).encode()
            self._producer.produce(self._commands_topic, key=key, value=self.codec.encode(command))
            metrics.COMMANDS.labels(command.action.value, str(command.dry_run).lower()).inc()
            log.info("command %s %s %s: %s", command.command_id, command.action.value, key.decode(), command.reason)
        self._producer.poll(0)
        return list(outcome.commands)

    def _actuate(self, commands: list[MitigationCommand]) -> None:
        """Hand durable commands to the cluster actuator, if remediation is on (it never blocks)."""
        if self.actuator is not None:
            for command in commands:
                self.actuator.submit(command)

    def _after_bus_reset(self) -> None:
        """If the bus came back empty: input from the beginning, and our epoch claimed again.

        The claim is the only state of ours the bus kept; without it a
        controller started later would claim our epoch again. Budgets,
        cooldowns and quotas stay in memory; the command log before the
        reset is gone, so a controller started later cannot recall them.
        """
        if self._rewinder is None or not self._rewinder.check():
            return
        metrics.BUS_RESETS.inc()
        if self.fenced:
            return
        claim = epoch_claim(self.core.stamp.epoch, self.controller_id)
        refresh_metadata(self._producer)
        self._producer.produce(control_topic(self.settings), key=b"*", value=self.codec.encode(claim))
        flush_or_raise(self._producer)
        log.warning("the bus was reset: epoch %d claimed again; reading the input from the beginning", self.core.stamp.epoch)

    # ------------------------------------------------------------ control

    def _stand_down(self, why: str) -> None:
        """A newer controller holds the job: send nothing more, report not ready."""
        if not self.fenced:
            self.fenced = True
            metrics.FENCED.set(1)
            log.warning("%s: no more commands from here", why)
        self.ready.clear()

    def _follow_control(self) -> None:
        if time.monotonic() - self._last_control_poll < self.config.control_poll_s:
            return
        self._last_control_poll = time.monotonic()
        for change in self._follower.poll():
            self._on_control(change)

    def _on_control(self, change: ControlConfig) -> None:
        epoch = claimed_epoch(change)
        if epoch is not None:
            self.highest_epoch = max(self.highest_epoch, epoch)
            if self.ready.is_set() and epoch > self.core.stamp.epoch:
                self._stand_down(f"replaced by {change.issued_by} (epoch {epoch} > {self.core.stamp.epoch})")
            return
        apply_and_count(self.core.apply, change, metrics.CONFIG_CHANGES)
