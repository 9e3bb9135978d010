"""Prometheus metrics of the sharder (no per-job or per-worker labels: bounded cardinality)."""

from prometheus_client import Counter, Gauge, Histogram

REPORTS = Counter("antdt_sharder_reports_total", "Worker reports processed", ["kind"])
EVENTS = Counter("antdt_sharder_log_events_total", "Shard log events appended", ["transition"])
DEADLETTERED = Counter(
    "antdt_sharder_deadlettered_total", "Input records sent to the dead-letter topic"
)
ASSIGNMENTS = Counter("antdt_sharder_assignments_total", "Assignments published", ["status"])
SNAPSHOTS = Counter("antdt_sharder_snapshots_total", "Snapshots written")
SNAPSHOT_FAILURES = Counter(
    "antdt_sharder_snapshot_failures_total", "Snapshots that could not be written"
)
SNAPSHOT_BUILDER_FAILURES = Counter(
    "antdt_sharder_snapshot_builder_failures_total",
    "Snapshots the builder process failed to build (built in the service instead)",
)
BUS_RESETS = Counter(
    "antdt_sharder_bus_resets_total",
    "Times the bus came back empty and the jobs' state was re-published",
)
JOBS = Gauge("antdt_sharder_jobs", "Jobs this instance is the writer of")
RECOVERY_SECONDS = Histogram(
    "antdt_sharder_recovery_seconds", "Time to recover a job and take it over"
)
BATCH_SECONDS = Histogram(
    "antdt_sharder_batch_seconds",
    "Time to process one batch of input, log append included",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
)
