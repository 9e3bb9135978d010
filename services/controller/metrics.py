"""Prometheus metrics of the controller (no per-job or per-worker labels: bounded cardinality)."""

from prometheus_client import Counter, Gauge

VERDICTS = Counter("antdt_controller_verdicts_total", "Verdicts read")
COMMANDS = Counter("antdt_controller_commands_total", "Commands published", ["action", "dry_run"])
DEADLETTERED = Counter(
    "antdt_controller_deadlettered_total", "Input records sent to the dead-letter topic"
)
SKIPPED = Counter("antdt_controller_skipped_total", "Actions a policy or a safety rule held back")
CONFIG_CHANGES = Counter(
    "antdt_controller_config_changes_total", "Control records for the controller", ["result"]
)
BUS_RESETS = Counter(
    "antdt_controller_bus_resets_total",
    "Times the bus came back empty and the epoch was claimed again",
)
EPOCH = Gauge("antdt_controller_epoch", "The epoch this controller holds")
PARTITIONS = Gauge(
    "antdt_controller_partitions", "Input partitions (hence jobs) this controller holds"
)
K8S_ACTIONS = Counter(
    "antdt_controller_k8s_actions_total",
    "Kubernetes calls made for commands (remediation)",
    ["action", "result"],
)
CONTROL_REFUSED = Counter(
    "antdt_controller_control_refused_total",
    "Control records refused, by reason (unusable, unsigned, forged, replayed, stale)",
    ["reason"],
)
