"""Every job's detector behind one door: raw metric records in, verdicts out (no Kafka).

The Faust app (:mod:`app`) hands each record's bytes here. The engine decodes
and validates them (anything that is not a valid ``WorkerMetrics`` raises
:class:`~antdt.errors.AntdtError`, which the app turns into a dead letter),
keeps one :class:`JobDetector` per job (refusing a report that would break
its job's detection: absurd dates or durations, a clock far ahead of the
job's), and applies run-time configuration:
job-wide defaults and per-job overrides, both from the control topic. A change
is validated for every job it touches before any of it is applied, so a bad
change leaves the running configuration as it was.

Jobs that have sent nothing for ``idle_job_s`` (wall time) are forgotten, so a
monitor that runs for months does not keep every finished job.

Processes are compared only with others of their role (``WorkerMetrics.role``):
a parameter-server shard's step is one applied update, whose time says
nothing about a worker's training step, so each role has its own detector
(and its own baseline) within the job; the shards of a parameter server
are often two, and a pair is judged against its faster member.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from antdt.control.topic import ConfigLayers
from antdt.errors import AntdtError
from antdt.schemas.codec import Codec
from antdt.schemas.models import (
    WORKER_ROLE,
    ControlComponent,
    ControlConfig,
    StragglerVerdict,
    WorkerMetrics,
)
from antdt.services.monitor.detection import DetectorConfig, JobDetector

#: Report dates the monitor accepts (see MonitorEngine._refuse_implausible).
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
#: The most compute or waiting time one report may claim (about 11.6 days).
MAX_REPORT_S = 1e6


@dataclass
class JobEntry:
    detector: JobDetector  # the workers'
    last_seen: float
    # every other role's (parameter servers)
    roles: dict[str, JobDetector] = field(default_factory=dict)

    def for_role(self, role: str) -> JobDetector:
        if role == WORKER_ROLE:
            return self.detector
        if role not in self.roles:
            self.roles[role] = JobDetector(self.detector.job_id, self.detector.config, pairs=True)
        return self.roles[role]

    def detectors(self) -> list[JobDetector]:
        return [self.detector, *self.roles.values()]


class MonitorEngine:
    """Decode, route by job, detect; configuration changes at run time."""

    def __init__(
        self,
        codec: Codec,
        defaults: DetectorConfig | None = None,
        idle_job_s: float = 600.0,
        max_clock_jump_s: float = 3600.0,
    ):
        self._codec = codec
        self.config = ConfigLayers(ControlComponent.MONITOR, defaults or DetectorConfig())
        self.idle_job_s = idle_job_s
        self.max_clock_jump_s = max_clock_jump_s
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
        """Feed one report to its job's detector; the verdicts it causes.

        AntdtError, and nothing changed, for a report the detector must not
        take in (see :meth:`_refuse_implausible`).
        """
        entry = self.jobs.get(report.job_id)
        self._refuse_implausible(report, entry.detector.clock if entry is not None else None)
        if entry is None:
            entry = self.jobs[report.job_id] = JobEntry(
                JobDetector(report.job_id, self.config_for(report.job_id)), 0.0
            )
        entry.last_seen = time.monotonic() if now is None else now
        return entry.for_role(report.role).observe(report)

    def _refuse_implausible(self, report: WorkerMetrics, job_clock: datetime | None) -> None:
        """AntdtError for a report that is valid on its own but would break its job's detection.

        * dated outside [EARLIEST, LATEST]: no job trains then, and window
          arithmetic near the ends of ``datetime`` overflows;
        * more than ``MAX_REPORT_S`` of compute or waiting in one report:
          the statistics would overflow to infinity and the verdicts with them;
        * ending more than ``max_clock_jump_s`` after the job's latest report:
          the job's clock is its latest window end, so one report from far
          ahead (a broken clock, a forged record) would expire every other
          worker's window and stall the baseline. A live job reports
          continuously, and one silent for ``idle_job_s`` is forgotten, so a
          real jump that large does not happen.
        """
        if report.window_start < EARLIEST or report.window_end > LATEST:
            raise AntdtError(
                f"window {report.window_start.isoformat()} - {report.window_end.isoformat()} "
                f"is outside {EARLIEST.year}-{LATEST.year}"
            )
        longest = max(
            report.compute.sum_s, report.compute.max_s, report.data_wait_s, report.sync_wait_s
        )
        if longest > MAX_REPORT_S:
            raise AntdtError(
                f"{longest:g} s of compute or waiting in one report (at most {MAX_REPORT_S:g})"
            )
        if (
            job_clock is not None
            and (report.window_end - job_clock).total_seconds() > self.max_clock_jump_s
        ):
            raise AntdtError(
                f"window_end {report.window_end.isoformat()} is more than "
                f"{self.max_clock_jump_s:g} s "
                f"after job {report.job_id}'s latest report ({job_clock.isoformat()})"
            )

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
        """Apply a control record if it is meant for the monitor; ConfigError (nothing applied) if
        invalid."""
        configs = self.config.apply(control, self.jobs)
        if configs is None:
            return False
        for job, entry in self.jobs.items():
            for detector in entry.detectors():
                detector.config = configs[job]
        return True
