"""Prometheus metrics of the monitor (no per-job or per-worker labels: bounded cardinality)."""

from prometheus_client import Counter, Gauge, Histogram

REPORTS = Counter("antdt_monitor_reports_total", "Worker metric reports processed")
DEADLETTERED = Counter(
    "antdt_monitor_deadlettered_total", "Input records sent to the dead-letter topic"
)
VERDICTS = Counter("antdt_monitor_verdicts_total", "Verdicts published", ["kind", "classification"])
JOBS = Gauge("antdt_monitor_jobs", "Jobs with a live detector in this instance")
CONFIG_CHANGES = Counter(
    "antdt_monitor_config_changes_total", "Control records for the monitor", ["result"]
)
REPORT_AGE_SECONDS = Histogram(
    "antdt_monitor_report_age_seconds",
    "Wall time from a report's window end to its processing",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
BATCH_SECONDS = Histogram(
    "antdt_monitor_batch_seconds",
    "Time to process one batch of reports, verdicts published",
    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5, 1.0),
)
BUS_RESETS = Counter(
    "antdt_monitor_bus_resets_total",
    "Times the bus came back empty and the monitor restarted in place",
)
CONTROL_REFUSED = Counter(
    "antdt_monitor_control_refused_total",
    "Control records refused, by reason (unusable, unsigned, forged, replayed, stale)",
    ["reason"],
)
