"""Prometheus metrics of the grouper (no per-job or per-worker labels: bounded cardinality)."""

from prometheus_client import Counter, Gauge, Histogram

ANNOUNCEMENTS = Counter(
    "antdt_grouper_announcements_total", "Ready announcements read", ["finished"]
)
GROUPS = Counter("antdt_grouper_groups_total", "Groups formed", ["reason"])
RESENT = Counter(
    "antdt_grouper_groups_resent_total",
    "Group records sent again to a member that announced its step again (its record was lost)",
)
GROUP_SIZE = Histogram(
    "antdt_grouper_group_size", "Members per group", buckets=(1, 2, 3, 4, 6, 8, 16, 32, 64, 128)
)
WAIT_SECONDS = Histogram(
    "antdt_grouper_wait_seconds",
    "How long a member waited at the grouper for its group",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
)
STALE = Counter(
    "antdt_grouper_stale_total", "Announcements of an older generation of a job's process group"
)
DEADLETTERED = Counter(
    "antdt_grouper_deadlettered_total", "Input records sent to the dead-letter topic"
)
BUS_RESETS = Counter(
    "antdt_grouper_bus_resets_total",
    "Times the bus came back empty and the announcements were read anew",
)
JOBS = Gauge("antdt_grouper_jobs", "Jobs this instance forms groups for")
