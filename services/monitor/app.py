"""``antdt monitor``: the Faust app that turns worker metrics into straggler verdicts.

Data flow (one Faust worker process; run several, they split the jobs):

* ``worker.metrics`` is keyed by job, so all of a job's workers land in one
  partition and the detector for a job lives in exactly one instance: no
  repartitioning and no tables. Records are consumed as raw bytes in batches
  (``stream.take_events``) and decoded by :class:`MonitorEngine`, so a record
  that does not decode or validate, or is not keyed by its job id (it would
  start a second detector for the job in another instance), can be
  dead-lettered with its provenance and counted while the batch goes on.
* Verdicts go to ``monitor.verdicts`` keyed by job, published before the
  batch is acknowledged (at-least-once; redelivered reports are dropped by
  the detector's per-worker sequence check).
* Thresholds and windows change at run time from ``control.config``
  (:mod:`antdt.control.topic`): the history is folded before the worker starts
  consuming, then followed every ``control_poll_s``.

Liveness, readiness and Prometheus metrics are served by
:class:`antdt.runtime.observability.HealthServer`; ready means the control history is
applied and the consumer has its partitions.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.bus.config import FetchPace
from antdt.bus.deadletter import DeadLetter, SourceRecord
from antdt.bus.faust_app import FaustRecordSink, make_faust_app
from antdt.bus.readers import check_key
from antdt.control.topic import ControlFollower, apply_and_count
from antdt.errors import AntdtError
from antdt.schemas.codec import make_codec
from antdt.schemas.models import ControlConfig, StragglerVerdict
from antdt.services.monitor import metrics
from antdt.services.monitor.detection import DetectorConfig
from antdt.services.monitor.engine import MonitorEngine
from antdt.settings import Settings
from antdt.topics import topic_spec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MonitorConfig:
    """Service knobs (detection thresholds live in :class:`DetectorConfig`)."""

    batch_max: int = 2000
    batch_within_s: float = 0.01
    control_poll_s: float = 0.25
    idle_job_s: float = 600.0
    max_clock_jump_s: float = 3600.0


class MonitorService:
    """The Faust app, its engine and its control follower (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        defaults: DetectorConfig | None = None,
        config: MonitorConfig | None = None,
    ):
        self.settings = settings
        self.config = config or MonitorConfig()
        codec = make_codec(settings.schema_registry_url)
        self.engine = MonitorEngine(
            codec, defaults, self.config.idle_job_s, self.config.max_clock_jump_s
        )
        # reports are judged over windows of seconds: a fetch waits longer, the idle broker works
        # less (the embedded broker's CPU is the ranks' on a small machine: docs/embedded-broker.md)
        self.app = make_faust_app(
            settings, "monitor", pace=FetchPace.BACKGROUND, topic_allow_declare=False
        )
        self.ready = threading.Event()
        self._partitions_assigned = False
        self._control_applied = False
        prefix = settings.topic_prefix
        self._metrics_topic = self.app.topic(
            topic_spec("worker", "metrics").full_name(prefix), value_serializer="raw"
        )
        self._verdicts_topic = self.app.topic(topic_spec("monitor", "verdicts").full_name(prefix))
        self._deadletter = DeadLetter.for_settings(
            FaustRecordSink(self.app), settings, "monitor", counter=metrics.DEADLETTERED
        )
        self._follower = ControlFollower(
            settings,
            codec,
            client_id=f"{settings.client_id}-monitor-control",
            deadletter=self._deadletter,
            refused=metrics.CONTROL_REFUSED,
        )
        self._define_agents()

    # ------------------------------------------------------------ lifecycle

    def start(self) -> MonitorService:
        """Create the topics and fold the control history (before the Faust worker runs)."""
        ensure_topics(make_admin(self.settings), self.settings)
        for change in self._follower.catch_up():
            self.apply_control(change)
        self._control_applied = True
        self._update_ready()
        return self

    def close(self) -> None:
        self.ready.clear()
        self._follower.close()

    def _update_ready(self) -> None:
        if self._control_applied and self._partitions_assigned:
            self.ready.set()

    # ------------------------------------------------------------ the app

    def _define_agents(self) -> None:
        app, config = self.app, self.config

        @app.agent(self._metrics_topic, name=f"{app.conf.id}.detect")
        async def detect(stream: Any) -> None:
            async for events in stream.take_events(config.batch_max, config.batch_within_s):
                await self.process(events)

        @app.timer(config.control_poll_s, name=f"{app.conf.id}.follow-control")
        async def follow_control() -> None:
            for change in self._follower.poll():
                self.apply_control(change)

        @app.timer(max(config.idle_job_s / 10, 1.0), name=f"{app.conf.id}.forget-idle")
        async def forget_idle() -> None:
            for job in self.engine.forget_idle():
                log.info("forgot idle job %s", job)
            metrics.JOBS.set(len(self.engine.jobs))

        @app.on_rebalance_complete.connect
        async def on_assigned(sender: Any, **kwargs: Any) -> None:
            self._partitions_assigned = True
            self._update_ready()

    async def process(self, events: list[Any]) -> None:
        """Decode, detect and publish for one batch; bad records are dead-lettered, never fatal."""
        started, wall = time.perf_counter(), time.time()
        for event in events:
            for verdict in self._verdicts_for(event.message, wall):
                await self._verdicts_topic.send(key=verdict.job_id.encode(), value=verdict)
                metrics.VERDICTS.labels(verdict.kind.value, verdict.classification.value).inc()
        metrics.REPORTS.inc(len(events))
        metrics.JOBS.set(len(self.engine.jobs))
        metrics.BATCH_SECONDS.observe(time.perf_counter() - started)

    def _verdicts_for(self, message: Any, wall: float) -> list[StragglerVerdict]:
        try:
            report = self.engine.decode(message.value, message.topic)
            # a job's detector lives with the partition its id hashes to
            check_key(message.key, report.job_id)
            metrics.REPORT_AGE_SECONDS.observe(max(wall - report.window_end.timestamp(), 0.0))
            return self.engine.observe(report)
        except AntdtError as exc:
            self._reject(message, exc)
        except Exception as exc:  # a bug must cost one record, not the service
            log.exception(
                "processing failed for %s[%d]@%d", message.topic, message.partition, message.offset
            )
            self._reject(message, exc)
        return []

    def _reject(self, message: Any, error: BaseException) -> None:
        self._deadletter.send(SourceRecord.from_faust(message), error)

    def apply_control(self, change: ControlConfig) -> None:
        """Apply a control record meant for the monitor; an invalid one is logged and counted."""
        apply_and_count(self.engine.apply, change, metrics.CONFIG_CHANGES)
