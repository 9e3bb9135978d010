"""``antdt controller``: verdicts and worker reports in, signed and fenced commands out.

Run one or several: the controllers of a deployment form a consumer group
and split the jobs by partition. Each cycle a controller

1. reads a batch of verdicts (``monitor.verdicts``) and worker reports
   (``worker.metrics``) of the partitions it holds. Both topics are keyed by
   job and have as many partitions, so the group's range assignment gives a
   job's verdicts and reports to the same controller;
2. lets :class:`ControllerCore` decide (policies, budgets, dry run, rate
   limit, ids, epoch, signature);
3. publishes the commands to ``controller.commands`` keyed
   ``<job>/<worker>`` (each agent reads its own partition) and waits until
   they are durable before committing the input: the commands topic is the
   audit log.

**Taking jobs over.** When partitions are assigned to it, a controller

* claims a new epoch: it reads the control topic's history, takes the
  highest ``controller.epoch`` claimed so far plus one and appends it; of two
  rivals claiming the same epoch, the first in the log wins and the other
  claims the next. Every owner of a job therefore stamps a higher epoch than
  every earlier owner, and agents, which reject commands older than the
  highest epoch they have seen, fence a controller that lost the job and has
  not noticed yet;
* reads the last hour of the commands topic back (its predecessors'
  decisions on these jobs) to rebuild budgets, cooldowns, quotas, batch
  sizes and the verdict ids already acted on;
* resumes the input from the group's committed offsets, or from the end
  where none were committed (old verdicts are not acted on again).

A job whose partition stays with the controller through a rebalance keeps
its state; one that moved away is forgotten.

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
from datetime import UTC, datetime, timedelta

from confluent_kafka import Consumer, Message, TopicPartition

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import drain, flush_or_raise, make_admin, make_consumer, make_producer
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.murmur2 import partition_for
from antdt.bus.readers import decode_or_deadletter, poll_batch, resume_or_end
from antdt.bus.watch import Rewinder, deliver_through_reset, refresh_metadata, shared_watch
from antdt.control.epoch import claimed_epoch, epoch_claim
from antdt.control.topic import ControlFollower, apply_and_count, control_topic
from antdt.control.trust import signed_change
from antdt.errors import ConfigError
from antdt.runtime.service_loop import LoopService
from antdt.schemas.codec import Codec, make_codec
from antdt.schemas.models import ControlConfig, MitigationCommand, StragglerVerdict, WorkerMetrics
from antdt.services.controller import metrics
from antdt.services.controller.command_log import read_commands
from antdt.services.controller.config import ControllerConfig
from antdt.services.controller.core import ControllerCore, Outcome
from antdt.services.controller.k8s import KubernetesActuator
from antdt.services.controller.safety import Stamp
from antdt.settings import Settings
from antdt.topics import worker_key

log = logging.getLogger(__name__)

#: How far back a controller taking jobs over reads their earlier commands: the
#: longest budget window (restarts per hour) and cooldown it must honour.
RECALL = timedelta(hours=1)


@dataclass(frozen=True)
class ServiceConfig:
    batch_size: int = 1000
    poll_timeout_s: float = 0.05
    control_poll_s: float = 0.25


class ControllerService(LoopService):
    """See the module docstring."""

    def __init__(
        self,
        settings: Settings,
        defaults: ControllerConfig | None = None,
        config: ServiceConfig | None = None,
        controller_id: str | None = None,
        actuator: KubernetesActuator | None = None,
    ):
        self.settings = settings
        self.actuator = actuator
        self.config = config or ServiceConfig()
        self.controller_id = (
            controller_id
            or f"controller-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        )
        self.codec: Codec = make_codec(settings.schema_registry_url)
        self.core = ControllerCore(defaults)
        self.ready = threading.Event()
        self.highest_epoch = 0
        self.held: set[int] = set()  # the input partitions this controller holds
        self._producer = make_producer(settings, client_id=self.controller_id, **{"linger.ms": 0})
        self._deadletter = DeadLetter.for_settings(
            self._producer, settings, "controller", counter=metrics.DEADLETTERED
        )
        self._follower = ControlFollower(
            settings,
            self.codec,
            client_id=f"{self.controller_id}-control",
            deadletter=self._deadletter,
            refused=metrics.CONTROL_REFUSED,
        )
        self._commands_topic = settings.topic("controller", "commands")
        self._inputs = [settings.topic("monitor", "verdicts"), settings.topic("worker", "metrics")]
        self._partitions = 0  # of each input topic
        self._consumer = None
        self._watch = None
        self._rewinder: Rewinder | None = None
        self._last_control_poll = 0.0
        self._revoked: set[int] = set()  # partitions given up in the rebalance under way

    # ------------------------------------------------------------ lifecycle

    def start(self) -> ControllerService:
        """Create topics, fold the control history, join the group (jobs come with partitions)."""
        self._partitions = self._co_partitioned(
            ensure_topics(make_admin(self.settings), self.settings)
        )
        for change in self._follower.catch_up():
            self._on_control(change)
        self._consumer = make_consumer(
            self.settings,
            group_id=self.settings.group("controller"),
            client_id=self.controller_id,
            # decisions rest on seconds of reports, commands switch a second ahead: a fetch waits
            # longer, the idle broker works less (docs/embedded-broker.md)
            pace=FetchPace.BACKGROUND,
            # co-partitioned: same numbers
            **{"partition.assignment.strategy": "range"},
        )
        self._consumer.subscribe(
            self._inputs,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        self._watch = shared_watch(self.settings, look_now=True)
        self._rewinder = Rewinder(self._consumer, self._watch, group=True)
        self._follower.follow_resets(self._watch)
        if self.actuator is not None:
            self.actuator.start()
        log.info("controller %s joined the group", self.controller_id)
        return self

    def _co_partitioned(self, counts: dict[str, int]) -> int:
        """The input topics' common partition count; ConfigError if they differ (a job would have
        two owners)."""
        found = {counts[topic] for topic in self._inputs}
        if len(found) != 1:
            raise ConfigError(
                f"{' and '.join(self._inputs)} must have as many partitions (found "
                f"{', '.join(f'{t}: {counts[t]}' for t in self._inputs)}): "
                "add partitions to the smaller"
            )
        return found.pop()

    # ------------------------------------------------------------ jobs taken over and given up

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """New partitions: a new epoch, the jobs' recent commands recalled, input resumed where the
        group left it."""
        held = {tp.partition for tp in partitions}
        kept, self._revoked = held & self._revoked, set()
        self._forget(self.held - kept)
        self.held = held
        if held - kept:
            self._claim_epoch()
            self._recall_recent_commands(held - kept)
        consumer.assign(resume_or_end(consumer, partitions))
        metrics.PARTITIONS.set(len(held))
        self.ready.set()
        log.info(
            "controller %s holds partitions %s with epoch %d",
            self.controller_id,
            sorted(held),
            self.core.stamp.epoch,
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions given up in a rebalance; their jobs are kept until we know whether they come
        back."""
        self._revoked |= {tp.partition for tp in partitions}

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        """Partitions lost without a rebalance (our session expired): someone else may hold them
        already."""
        lost = {tp.partition for tp in partitions}
        self._forget(lost)
        self.held -= lost

    def _forget(self, partitions: set[int]) -> None:
        if partitions:
            self.core.forget(
                [
                    job
                    for job in self.core.jobs
                    if partition_for(job, self._partitions) in partitions
                ]
            )

    def _recall_recent_commands(self, partitions: set[int]) -> None:
        """Rebuild the taken-over jobs' budgets, cooldowns and quotas from the audit log."""
        since = datetime.now(UTC) - RECALL
        commands = (
            c
            for c in read_commands(self.settings, self.codec, start=since)
            if partition_for(c.job_id, self._partitions) in partitions
        )
        recalled = self.core.recall(commands)
        log.info(
            "recalled %d command(s) issued since %s", recalled, since.isoformat(timespec="seconds")
        )

    def _claim_epoch(self, timeout_s: float = 30.0) -> None:
        """Append ``highest + 1`` and read on until it comes back: the first claim of an epoch
        wins."""
        while True:
            claim = self._claim_of(self.highest_epoch + 1)
            self._write_claim(claim)
            changes = self._follower.read_through(claim.config_id, timeout_s)
            # the first claim of the epoch in the log wins; ours is among the changes
            winner = next(c for c in changes if claimed_epoch(c) == claimed_epoch(claim)).issued_by
            for change in changes:
                self._on_control(change)
            if winner == self.controller_id:
                key = self.settings.signing_key
                self.core.stamp = Stamp(
                    claimed_epoch(claim), key.get_secret_value().encode() if key else None
                )
                metrics.EPOCH.set(self.core.stamp.epoch)
                return

    def _write_claim(self, claim: ControlConfig) -> None:
        """Append ``claim`` to the control topic, durably; after a bus reset, once the topic is
        back (a rebalance can ask for a claim before it is)."""
        record = (control_topic(self.settings), b"*", self.codec.encode(claim))
        deliver_through_reset(self._producer, self._watch, [record])

    def _claim_of(self, epoch: int) -> ControlConfig:
        """Our claim of ``epoch``, signed with the control key when there is one: every claim we
        write, at takeover or again after a bus reset, must pass the services' control gate."""
        return signed_change(epoch_claim(epoch, self.controller_id), self.settings)

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
            event = decode_or_deadletter(
                message, self.codec, self._deadletter, expected=(StragglerVerdict, WorkerMetrics)
            )
            if event is not None:
                published += self._publish(self._decide_or_deadletter(message, event))
        if published:
            flush_or_raise(self._producer)  # commands durable before the input is committed
            self._actuate(published)
        self._consumer.commit(asynchronous=True)
        return len(messages)

    def _decide_or_deadletter(
        self, message: Message, event: StragglerVerdict | WorkerMetrics
    ) -> Outcome:
        """The decision on one event; a policy that fails on it costs that record, not the
        controller.

        The failure is a bug (the event passed every check of its model), so
        it is logged with its traceback; nothing was published for it, and
        the view a policy reads is rebuilt by the next reports of the worker.
        """
        try:
            return self._decide(event)
        except Exception as exc:
            log.exception(
                "deciding failed for %s[%d]@%d",
                message.topic(),
                message.partition(),
                message.offset(),
            )
            self._deadletter.send(SourceRecord.from_confluent(message), exc)
            return Outcome()

    def _decide(self, event: StragglerVerdict | WorkerMetrics) -> Outcome:
        now = datetime.now(UTC)
        if isinstance(event, StragglerVerdict):
            metrics.VERDICTS.inc()
            return self.core.on_verdict(event, now)
        return self.core.on_metrics(event, now)

    def _publish(self, outcome: Outcome) -> list[MitigationCommand]:
        for reason in outcome.skipped:
            metrics.SKIPPED.inc()
            log.info("not done: %s", reason)
        records = [
            (
                self._commands_topic,
                worker_key(command.job_id, command.target_worker).encode(),
                self.codec.encode(command),
            )
            for command in outcome.commands
        ]
        if records:
            deliver_through_reset(self._producer, self._watch, records)
        for command, (_, key, _) in zip(outcome.commands, records, strict=True):
            metrics.COMMANDS.labels(command.action.value, str(command.dry_run).lower()).inc()
            log.info(
                "command %s %s %s: %s",
                command.command_id,
                command.action.value,
                key.decode(),
                command.reason,
            )
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
        if not self.held:
            return
        refresh_metadata(self._producer)
        self._write_claim(self._claim_of(self.core.stamp.epoch))
        log.warning(
            "the bus was reset: epoch %d claimed again; reading the input from the beginning",
            self.core.stamp.epoch,
        )

    # ------------------------------------------------------------ control

    def _follow_control(self) -> None:
        if time.monotonic() - self._last_control_poll < self.config.control_poll_s:
            return
        self._last_control_poll = time.monotonic()
        for change in self._follower.poll():
            self._on_control(change)

    def _on_control(self, change: ControlConfig) -> None:
        epoch = claimed_epoch(change)
        if epoch is not None:  # a claim, ours or another controller's: the next one must be higher
            self.highest_epoch = max(self.highest_epoch, epoch)
            return
        apply_and_count(self.core.apply, change, metrics.CONFIG_CHANGES)
