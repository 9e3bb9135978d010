"""Straggler and leader detection, pure (no Kafka): WorkerMetrics in, verdicts out.

Per job, :class:`JobDetector` keeps each worker's recent reports, refreshes
the job baseline every ``step_s`` of report time (the job's clock is the
latest ``window_end`` seen) and judges each worker on each of its reports:

* **warm-up**: each process's reports up to and including its first one
  with samples are left out: its first steps pay one-time costs (building
  the model, the first pull, allocations) that are not its speed.
* **statistic**: time per sample, (compute + data wait) / samples. Per sample,
  so a batch-size change is never a slowdown; barrier time excluded, so a
  worker that only waits for others is never a straggler.
* **baseline**: median and MAD, across the job's workers, of their statistic
  over the hopping window (``window_s`` wide, default 10 s).
* **scores**: the worker's *recent* statistic (its last ``recent_reports``
  reports, so an onset is seen within a couple of report intervals; a
  report with no samples is not judged: the worker only waited) against
  the baseline: ``speed_ratio`` = recent / median, ``relative_score`` =
  robust z = (recent - median) / (1.4826 MAD); ``individual_score`` =
  window statistic / the worker's own best window so far.
* **hysteresis**: a worker becomes a STRAGGLER after ``k`` consecutive
  evaluations over both thresholds (ratio and z), and is CLEARED after ``k``
  consecutive evaluations under the clear ratio; LEADER likewise for workers
  faster than ``leader_ratio``.
* **pairs**: a role with only two members (a parameter server of two
  shards) is judged, when asked for, against its faster member: the ratio
  alone decides, as a MAD of two says nothing.
* **classes**: DETERMINISTIC if the episode began as the worker joined, or
  if the worker stands no worse against the job (``speed_ratio``) than at
  its best (heterogeneous hardware: slow since the start, however long the
  first verdict took, and what a restart onto the same kind of node comes
  back as); otherwise
  TRANSIENT, escalated by a second verdict to PERSISTENT once the episode
  lasts ``persistent_s`` and the worker is still over both thresholds (not
  merely inside the hysteresis band).
* **evidence**: the worker's resource figures over the window that stand out
  against the job's medians (steal, CPU contention, memory, IO, network,
  GPU, data wait).

Verdicts are emitted on changes only (onset, escalation, clear), each with a
deterministic id.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from antdt.control.topic import refuse_broken, with_text_changes
from antdt.schemas.models import (
    Evidence,
    EvidenceCause,
    StepTimeStats,
    StragglerClass,
    StragglerVerdict,
    VerdictKind,
    VerdictWindow,
    WorkerMetrics,
    trusted,
)

MAD_SCALE = 1.4826

#: Per-sample times at or below this are not measurements (a picosecond): a job whose median is that
#: small has reported no time at all, and ratios against it would be meaningless or infinite.
MEASURABLE_S = 1e-12


@dataclass(frozen=True)
class DetectorConfig:
    """Thresholds and windows; every field can be changed at run time."""

    window_s: float = 10.0
    step_s: float = 1.0
    recent_reports: int = 1
    straggler_ratio: float = 1.3
    clear_ratio: float = 1.15
    leader_ratio: float = 0.8
    z_threshold: float = 3.0
    k: int = 2
    persistent_s: float = 30.0
    min_workers: int = 3
    join_grace_ticks: int = 3

    def __post_init__(self) -> None:
        refuse_broken(
            "detector config",
            (
                (self.window_s <= 0, "window_s must be > 0"),
                (not 0 < self.step_s <= self.window_s, "step_s must be in (0, window_s]"),
                (self.recent_reports < 1, "recent_reports must be >= 1"),
                (
                    not 1.0 < self.clear_ratio < self.straggler_ratio,
                    "need 1 < clear_ratio < straggler_ratio",
                ),
                (not 0.0 < self.leader_ratio < 1.0, "leader_ratio must be in (0, 1)"),
                (self.z_threshold < 0, "z_threshold must be >= 0"),
                (self.k < 1, "k must be >= 1"),
                (self.persistent_s <= 0, "persistent_s must be > 0"),
                (self.min_workers < 2, "min_workers must be >= 2"),
                (self.join_grace_ticks < 0, "join_grace_ticks must be >= 0"),
            ),
        )

    def with_changes(self, changes: dict[str, str]) -> DetectorConfig:
        """A copy with ``changes`` (field name -> text, as the control topic carries them)
        applied."""
        return with_text_changes(self, changes, "detector config")


@dataclass
class VerdictEpisode:
    kind: VerdictKind
    classification: StragglerClass
    started: datetime


@dataclass
class WorkerTrack:
    """What the detector remembers about one worker.

    ``reports`` is the worker's window; ``busy_s`` and ``samples`` are its
    running sums (compute + data wait, samples), kept as reports enter and
    leave so the window statistic costs O(1) per report.
    """

    worker_id: str
    node_id: str | None
    incarnation: str = ""
    last_seq: int = -1
    reports: deque = field(default_factory=deque)
    busy_s: float = 0.0
    samples: int = 0
    best_window: float | None = None
    # its lowest window statistic / the job median so far: its best standing
    best_ratio: float | None = None
    # its first report with samples was seen (and left out: it carries the warm-up)
    warmed: bool = False
    ticks_seen: int = 0
    over: int = 0
    under: int = 0
    fast: int = 0
    episode: VerdictEpisode | None = None

    def add(self, report: WorkerMetrics) -> None:
        self.reports.append(report)
        self.busy_s += _busy(report)
        self.samples += report.samples

    def expire(self, window_start: datetime) -> None:
        """Drop reports that ended at or before ``window_start``."""
        reports = self.reports
        while reports and reports[0].window_end <= window_start:
            old = reports.popleft()
            self.busy_s -= _busy(old)
            self.samples -= old.samples
        if not reports:
            self.busy_s, self.samples = 0.0, 0

    def window_stat(self) -> float | None:
        """Per-sample time over the window."""
        return self.busy_s / self.samples if self.samples > 0 else None

    def recent_stat(self, count: int) -> float | None:
        """Per-sample time over the last ``count`` reports."""
        last = [self.reports[-i] for i in range(1, min(count, len(self.reports)) + 1)]
        samples = sum(r.samples for r in last)
        return sum(_busy(r) for r in last) / samples if samples > 0 else None


_NO_TIME = StepTimeStats(sum_s=0.0, min_s=0.0, max_s=0.0, p50_s=0.0, p90_s=0.0)


def _busy(report: WorkerMetrics) -> float:
    """The worker's own time in a report: compute and data wait, never barrier wait."""
    return report.compute.sum_s + report.data_wait_s


class JobDetector:
    """Detects stragglers and leaders in one job (see the module docstring)."""

    def __init__(self, job_id: str, config: DetectorConfig | None = None, pairs: bool = False):
        """``pairs``: judge a group of two (a two-shard parameter server) against its faster
        member."""
        self.job_id = job_id
        self.config = config or DetectorConfig()
        self.pairs = pairs
        self.workers: dict[str, WorkerTrack] = {}
        self.clock: datetime | None = None
        self.next_tick: datetime | None = None
        self.baseline: tuple[float, float] | None = None
        self.stats: dict[str, float] = {}

    def observe(self, report: WorkerMetrics) -> list[StragglerVerdict]:
        """Add one report and judge its worker against the job baseline.

        The baseline (median and MAD of the workers' window statistics) is
        recomputed every ``step_s`` of report time; the worker is judged on
        its own report at once, so an onset is caught on the reports that
        show it, not a tick later.
        """
        track = self.workers.get(report.worker_id)
        restarted: list[StragglerVerdict] = []
        if track is not None and track.incarnation != report.incarnation:
            restarted = self._forget(track, report.window_end)
            track = None
        if track is None:
            track = self.workers[report.worker_id] = WorkerTrack(
                report.worker_id, report.node_id, report.incarnation
            )
        if report.seq <= track.last_seq:
            return restarted  # redelivered (input is at-least-once): seen already
        track.last_seq = report.seq
        # a process's first steps pay its one-time costs: kept as a sign of life, not timed
        if not track.warmed:
            track.warmed = report.samples > 0
            report = report.model_copy(
                update={"samples": 0, "data_wait_s": 0.0, "compute": _NO_TIME}
            )
        track.add(report)
        if self.clock is None or report.window_end > self.clock:
            self.clock = report.window_end
        if self.next_tick is None or self.clock >= self.next_tick:
            self._rebaseline(self.clock)
            self.next_tick = self.clock + timedelta(seconds=self.config.step_s)
        return restarted + self._judge(track, report.window_end)

    def _forget(self, track: WorkerTrack, now: datetime) -> list[StragglerVerdict]:
        """A new incarnation (the worker restarted): its history ends, and so does any episode."""
        del self.workers[track.worker_id]
        if track.episode is None:
            return []
        track.episode = None
        # relative, individual, ratio: nothing measured against the new process yet
        neutral = (0.0, 1.0, 1.0)
        return [
            self._verdict(
                track,
                (VerdictKind.CLEARED, StragglerClass.NONE),
                now,
                now - timedelta(seconds=self.config.window_s),
                neutral,
                evidence=[],
            )
        ]

    def _rebaseline(self, now: datetime) -> None:
        """Drop reports older than the window; recompute the job's median and spread."""
        window_start = now - timedelta(seconds=self.config.window_s)
        stats: dict[str, float] = {}
        for track in list(self.workers.values()):
            track.expire(window_start)
            if not track.reports:
                del self.workers[track.worker_id]  # silent for a whole window: out of the baseline
                continue
            value = track.window_stat()
            if value is not None:
                stats[track.worker_id] = value
                track.best_window = (
                    value if track.best_window is None else min(track.best_window, value)
                )
        self.stats = stats
        self.baseline = self._baseline_of(stats)
        if self.baseline is not None and self.baseline[0] > MEASURABLE_S:
            for worker, value in stats.items():
                track = self.workers[worker]
                ratio = value / self.baseline[0]
                track.best_ratio = (
                    ratio if track.best_ratio is None else min(track.best_ratio, ratio)
                )

    def _baseline_of(self, stats: dict[str, float]) -> tuple[float, float] | None:
        """(median, spread) of the window statistics; None with too few workers."""
        # a pair's median is its mean and every z is +-0.67: the ratio decides
        if self.pairs and len(stats) == 2:
            fastest = min(stats.values())
            return fastest, max(0.01 * fastest, 1e-12)
        if len(stats) < self.config.min_workers:
            return None
        median = statistics.median(stats.values())
        mad = statistics.median(abs(v - median) for v in stats.values())
        return median, max(MAD_SCALE * mad, 0.01 * median, 1e-12)

    def _judge(self, track: WorkerTrack, now: datetime) -> list[StragglerVerdict]:
        if self.baseline is None or track.worker_id not in self.stats:
            return []
        config = self.config
        median, spread = self.baseline
        track.ticks_seen += 1
        # no time measured (all of it at a barrier): nothing to compare against
        if median <= MEASURABLE_S:
            return []
        if track.reports and not track.reports[-1].samples:
            # it trained nothing since its last report (it waited for the others at an epoch's
            # end, say): no speed to judge; its window alone would still show an episode over
            return []
        window_stat = track.window_stat() or self.stats[track.worker_id]
        recent = track.recent_stat(config.recent_reports) or window_stat
        ratio = recent / median
        individual = window_stat / track.best_window if track.best_window else 1.0
        scores = ((recent - median) / spread, individual, ratio)
        slowed = track.best_ratio is not None and ratio / track.best_ratio >= config.straggler_ratio
        due = self._step(track, now, ratio, scores[0], slowed)
        if due is None:
            return []
        window_start = now - timedelta(seconds=config.window_s)
        return [self._verdict(track, due, now, window_start, scores)]

    def _step(
        self, track: WorkerTrack, now: datetime, ratio: float, z: float, slowed: bool
    ) -> tuple | None:
        """Advance the worker's hysteresis; return (kind, class) when a verdict is due.

        ``slowed``: the worker stands worse against the job now than at its
        best (it changed); one that does not has always been this slow.
        """
        config = self.config
        slow = ratio >= config.straggler_ratio and z >= config.z_threshold
        quick = ratio <= config.leader_ratio and z <= -config.z_threshold
        track.over = track.over + 1 if slow else 0
        track.fast = track.fast + 1 if quick else 0
        episode = track.episode
        if episode is None:
            kind = (
                VerdictKind.STRAGGLER
                if track.over >= config.k
                else VerdictKind.LEADER
                if track.fast >= config.k
                else None
            )
            if kind is None:
                return None
            began = now - timedelta(seconds=config.step_s * (config.k - 1))
            joined = track.ticks_seen <= config.k + config.join_grace_ticks or not slowed
            classification = StragglerClass.DETERMINISTIC if joined else StragglerClass.TRANSIENT
            track.episode = VerdictEpisode(kind, classification, began)
            track.under = 0
            return kind, classification
        back = (
            ratio < config.clear_ratio
            if episode.kind is VerdictKind.STRAGGLER
            else ratio > 1 / config.clear_ratio
        )
        track.under = track.under + 1 if back else 0
        if track.under >= config.k:
            track.episode = None
            return VerdictKind.CLEARED, StragglerClass.NONE
        long_enough = (now - episode.started).total_seconds() >= config.persistent_s
        # not merely inside the hysteresis band
        still_slow = slow if episode.kind is VerdictKind.STRAGGLER else quick
        if episode.classification is StragglerClass.TRANSIENT and long_enough and still_slow:
            episode.classification = StragglerClass.PERSISTENT
            return episode.kind, StragglerClass.PERSISTENT
        return None

    # ------------------------------------------------------------ the verdict

    def _verdict(self, track, due, now, window_start, scores, evidence=None) -> StragglerVerdict:
        kind, classification = due
        relative, individual, ratio = scores
        episode_start = track.episode.started if track.episode else None
        return trusted(
            StragglerVerdict,
            verdict_id=(
                f"{self.job_id}:{track.worker_id}:{int(now.timestamp() * 1000)}:{kind.value}"
            ),
            job_id=self.job_id,
            worker_id=track.worker_id,
            node_id=track.node_id,
            kind=kind,
            classification=classification,
            relative_score=float(relative),
            individual_score=float(individual),
            speed_ratio=float(ratio),
            window=trusted(VerdictWindow, start=window_start, end=now, reports=len(track.reports)),
            episode_start=episode_start,
            issued_at=now,
            evidence=evidence_for(track, self.workers) if evidence is None else evidence,
        )


# ---------------------------------------------------------------- evidence


def _mean(reports, metric) -> float | None:
    """Mean of ``metric`` over the reports that have it (GPU figures are absent without a GPU)."""
    values = [v for v in (metric(r) for r in reports) if v is not None]
    return sum(values) / len(values) if values else None


def _gpu_memory_percent(report: WorkerMetrics) -> float | None:
    used, total = report.resources.gpu_memory_used_bytes, report.resources.gpu_memory_total_bytes
    return 100.0 * used / total if used is not None and total else None


#: (cause, metric, read, test, margin). "add": above the job median by margin;
#: "times": above margin times the median; "apart": that far from it either
#: way (a GPU both busier and slower hints at a competitor, an idle one at
#: starvation or throttling).
_RESOURCE_CHECKS = (
    (
        EvidenceCause.CPU_STEAL,
        "resources.cpu_steal_percent",
        lambda r: r.resources.cpu_steal_percent,
        "add",
        5.0,
    ),
    (EvidenceCause.CPU_CONTENTION, "resources.load_1m", lambda r: r.resources.load_1m, "add", 0.5),
    (
        EvidenceCause.MEMORY_PRESSURE,
        "resources.host_memory_percent",
        lambda r: r.resources.host_memory_percent,
        "add",
        15.0,
    ),
    (
        EvidenceCause.IO,
        "resources.io_read_bytes",
        lambda r: r.resources.io_read_bytes + r.resources.io_write_bytes,
        "times",
        3.0,
    ),
    (
        EvidenceCause.NETWORK,
        "resources.net_recv_bytes",
        lambda r: r.resources.net_recv_bytes + r.resources.net_sent_bytes,
        "times",
        3.0,
    ),
    (
        EvidenceCause.GPU,
        "resources.gpu_utilization_percent",
        lambda r: r.resources.gpu_utilization_percent,
        "apart",
        20.0,
    ),
    (EvidenceCause.GPU, "resources.gpu_memory_percent", _gpu_memory_percent, "add", 15.0),
    (
        EvidenceCause.DATA_WAIT,
        "data_wait_s",
        lambda r: r.data_wait_s / max(r.compute.sum_s + r.data_wait_s, 1e-9),
        "add",
        0.2,
    ),
)


def _stands_out(value: float, baseline: float, test: str, margin: float) -> bool:
    if test == "add":
        return value > baseline + margin
    if test == "times":
        return value > max(baseline, 1.0) * margin
    return abs(value - baseline) >= margin


def evidence_for(track: WorkerTrack, workers: dict[str, WorkerTrack]) -> list[Evidence]:
    """Resource figures of the worker that stand out against the job's medians."""
    found = []
    for cause, metric, read, test, margin in _RESOURCE_CHECKS:
        value = _mean(track.reports, read)
        others = [m for m in (_mean(t.reports, read) for t in workers.values()) if m is not None]
        if value is None or not others:
            continue
        baseline = statistics.median(others)
        if _stands_out(value, baseline, test, margin):
            found.append(
                trusted(
                    Evidence,
                    cause=cause,
                    metric=metric,
                    value=float(value),
                    baseline=float(baseline),
                    detail=None,
                )
            )
    return found


def utc(seconds: float) -> datetime:
    """Seconds since the epoch as an aware datetime (for traces and tests)."""
    return datetime.fromtimestamp(seconds, UTC)
