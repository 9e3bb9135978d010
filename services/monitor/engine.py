"""Every job's detector behind one door: raw metric records in, verdicts out (no Kafka).

The Faust app (:mod:`app`) hands each record's bytes here. The engine decodes
and validates them (anything that is not a valid ``WorkerMetrics`` raises
:class:`~antdt.errors.AntdtError`, which the app turns into a dead letter),
keeps one :class:`JobDetector` per job, and applies run-time configuration:
job-wide defaults and per-job overrides, both from the control topic. A change
is validated for every job it touches before any of it is applied, so a bad
change leaves the running configuration as it was.

Jobs that have sent nothing for ``idle_job_s`` (wall time) are forgotten, so a
monitor that runs for months does not keep every finished job.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from antdt.control import ConfigLayers
from antdt.errors import AntdtError
from antdt.schemas.codec import Codec
from antdt.schemas.models import ControlComponent, ControlConfig, StragglerVerdict, WorkerMetrics
from antdt.services.monitor.detection import DetectorConfig, JobDetector


@dataclass
class JobEntry:
    detector: JobDetector
    last_seen: float


class MonitorEngine:
    """Decode, route by job, detect; configuration changes at run time."""

    def __init__(self, codec: Codec, defaults: DetectorConfig | None = None, idle_job_s: float = 600.0):
        self._codec = codec
        self.config = ConfigLayers(ControlComponent.MONITOR, defaults or DetectorConfig())
        self.idle_job_s = idle_job_s
        self.jobs: dict[str, JobEntry] = {}

    # ------------------------------------------------------------ metrics in

    def decode(self, value: bytes | None, topic: str | None = None) -> WorkerMetrics:
        """The report in ``value``; AntdtError if it is not a valid WorkerMetrics."""
        if not value:
            raise AntdtError("record has no value")
        report = self._codec.decode(value, topic)
        if not isinstance(report, WorkerMetrics):
            raise AntdtError(f"expected WorkerMetrics, got {type(report).__name__}")
        return report

    def observe(self, report: WorkerMetrics, now: float | None = None) -> list[StragglerVerdict]:
        """Feed one report to its job's detector; the verdicts it causes."""
        entry = self.jobs.get(report.job_id)
        if entry is None:
            entry = self.jobs[report.job_id] = JobEntry(JobDetector(report.job_id, self.config_for(report.job_id)), 0.0)
        entry.last_seen = time.monotonic() if now is None else now
        return entry.detector.observe(report)

    def forget_idle(self, now: float | None = None) -> list[str]:
        """Drop jobs silent for ``idle_job_s``; their ids."""
        now = time.monotonic() if now is None else now
        idle = [job for job, entry in self.jobs.items() if now - entry.last_seen > self.idle_job_s]
        for job in idle:
            del self.jobs[job]
        return idle

    # ------------------------------------------------------------ configuration

    def config_for(self, job_id: str) -> DetectorConfig:
        return self.config.for_job(job_id)

    def apply(self, control: ControlConfig) -> bool:
        """Apply a control record if it is meant for the monitor; ConfigError (nothing applied) if invalid."""
        configs = self.config.apply(control, self.jobs)
        if configs is None:
            return False
        for job, entry in self.jobs.items():
            entry.detector.config = configs[job]
        return True
