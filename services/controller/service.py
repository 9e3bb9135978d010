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
from datetime import datetime, timezone

from confluent_kafka import OFFSET_END, TopicPartition

from antdt.bus.admin import ensure_topics, partition_counts
from antdt.bus.clients import drain, flush_or_raise, make_admin, make_consumer, make_producer
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.readers import assign_now, decode_or_deadletter, poll_batch
from antdt.control import ControlFollower, apply_and_count, control_topic
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import ControlComponent, ControlConfig, StragglerVerdict, WorkerMetrics
from antdt.services.controller import metrics
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.core import ControllerCore, Outcome
from antdt.services.controller.safety import Stamp
from antdt.service_loop import LoopService
from antdt.settings import Settings
from antdt.topics import topic_spec, worker_key

log = logging.getLogger(__name__)

EPOCH_KEY = "controller.epoch"


@dataclass(frozen=True)
class ServiceConfig:
    batch_size: int = 1000
    poll_timeout_s: float = 0.05
    control_poll_s: float = 0.25


def epoch_claim(epoch: int, controller_id: str) -> ControlConfig:
    """The control record by which a controller takes ``epoch``."""
    return ControlConfig(config_id=f"epoch-{epoch}-{controller_id}", job_id=None, component=ControlComponent.CONTROLLER,
                         changes={EPOCH_KEY: str(epoch)}, issued_by=controller_id, issued_at=datetime.now(timezone.utc))


def claimed_epoch(change: ControlConfig) -> int | None:
    """The epoch a control record claims, if it is an epoch claim."""
    value = change.changes.get(EPOCH_KEY)
    return int(value) if value is not None and value.isdigit() else None


class ControllerService(LoopService):
    """See the module docstring."""

    def __init__(self, settings: Settings, defaults: ControllerConfig | None = None, config: ServiceConfig | None = None,
                 controller_id: str | None = None):
        self.settings = settings
        self.config = config or ServiceConfig()
        self.controller_id = controller_id or f"controller-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.codec: Codec = make_codec(settings.schema_registry_url)
        self.core = ControllerCore(defaults)
        self.ready = threading.Event()
        self.fenced = False
        self.highest_epoch = 0
        self._producer = make_producer(settings, client_id=self.controller_id, **{"linger.ms": 0})
        self._deadletter = DeadLetter(self._producer, topic_spec("", "deadletter").full_name(settings.topic_prefix), "controller")
        self._follower = ControlFollower(settings, self.codec, client_id=f"{self.controller_id}-control")
        self._commands_topic = settings.topic("controller", "commands")
        self._inputs = [settings.topic("monitor", "verdicts"), settings.topic("worker", "metrics")]
        self._consumer = None
        self._last_control_poll = 0.0

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ControllerService:
        """Create topics, fold the control history, claim an epoch, position the input."""
        ensure_topics(make_admin(self.settings), self.settings)
        for change in self._follower.catch_up():
            self._on_control(change)
        self._claim_epoch()
        self._consumer = make_consumer(self.settings, group_id=f"{self.settings.topic_prefix}.controller",
                                       client_id=self.controller_id, low_latency=True)
        assign_now(self._consumer, self._start_positions())
        self.ready.set()
        log.info("controller %s serving with epoch %d", self.controller_id, self.core.stamp.epoch)
        return self

    def _claim_epoch(self) -> None:
        """Append ``highest + 1`` and read the topic back: the first claim of an epoch wins."""
        while True:
            wanted = self.highest_epoch + 1
            self._producer.produce(control_topic(self.settings), key=b"*", value=self.codec.encode(epoch_claim(wanted, self.controller_id)))
            flush_or_raise(self._producer)
            winner = None
            for change in self._follower.catch_up():
                epoch = claimed_epoch(change)
                if epoch == wanted and winner is None:
                    winner = change.issued_by
                self._on_control(change)
            if winner == self.controller_id:
                self.core.stamp = Stamp(wanted, self.settings.signing_key.get_secret_value().encode()
                                        if self.settings.signing_key else None)
                metrics.EPOCH.set(wanted)
                return

    def _start_positions(self) -> list[TopicPartition]:
        counts = partition_counts(make_admin(self.settings), self._inputs)
        wanted = [TopicPartition(topic, p) for topic in self._inputs for p in range(counts[topic])]
        committed = self._consumer.committed(wanted, timeout=10)
        return [TopicPartition(tp.topic, tp.partition, tp.offset if tp.offset >= 0 else OFFSET_END) for tp in committed]

    def close(self) -> None:
        self.ready.clear()
        drain(self._producer)
        self._follower.close()
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None

    # ------------------------------------------------------------ one cycle

    def step(self) -> int:
        """Process one batch of input; returns how many records it read."""
        self._follow_control()
        messages = poll_batch(self._consumer, self.config.batch_size, self.config.poll_timeout_s)
        if not messages:
            return 0
        published = 0
        for message in messages:
            event = decode_or_deadletter(message, self.codec, self._deadletter)
            if isinstance(event, (StragglerVerdict, WorkerMetrics)):
                published += self._publish(self._decide(event))
            elif event is not None:
                self._deadletter.send(SourceRecord.from_confluent(message),
                                      f"expected StragglerVerdict or WorkerMetrics, got {type(event).__name__}")
        if published:
            flush_or_raise(self._producer)  # commands durable before the input is committed
        self._consumer.commit(asynchronous=True)
        return len(messages)

    def _decide(self, event: StragglerVerdict | WorkerMetrics) -> Outcome:
        now = datetime.now(timezone.utc)
        if isinstance(event, StragglerVerdict):
            metrics.VERDICTS.inc()
            return self.core.on_verdict(event, now)
        return self.core.on_metrics(event, now)

    def _publish(self, outcome: Outcome) -> int:
        for reason in outcome.skipped:
            metrics.SKIPPED.inc()
            log.info("not done: %s", reason)
        if self.fenced:
            metrics.FENCED_DROPS.inc(len(outcome.commands))
            return 0
        for command in outcome.commands:
            key = worker_key(command.job_id, command.target_worker).encode()
            self._producer.produce(self._commands_topic, key=key, value=self.codec.encode(command))
            metrics.COMMANDS.labels(command.action.value, str(command.dry_run).lower()).inc()
            log.info("command %s %s %s: %s", command.command_id, command.action.value, key.decode(), command.reason)
        self._producer.poll(0)
        return len(outcome.commands)

    # ------------------------------------------------------------ control

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
            if self.core.stamp.epoch and epoch > self.core.stamp.epoch and self.ready.is_set() and not self.fenced:
                self.fenced = True
                self.ready.clear()
                metrics.FENCED.set(1)
                log.warning("replaced by %s (epoch %d > %d): no more commands from here", change.issued_by, epoch,
                            self.core.stamp.epoch)
            return
        apply_and_count(self.core.apply, change, metrics.CONFIG_CHANGES)
