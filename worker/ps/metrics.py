"""A parameter-server shard's Prometheus metrics (its own process: ``antdt ps``)."""

from prometheus_client import Counter, Gauge

APPLIED = Counter(
    "antdt_ps_updates_applied_total", "Updates applied after their commit was read in the shard log"
)
PENDING = Gauge("antdt_ps_updates_pending", "Gradients received and waiting for their commit")
EXPIRED = Counter(
    "antdt_ps_updates_expired_total",
    "Gradients dropped: no commit came (refused, or the worker died)",
)
STALE = Counter(
    "antdt_ps_updates_stale_total", "Gradients refused for being computed too many updates ago"
)
CHECKPOINTS = Counter(
    "antdt_ps_checkpoints_total", "Checkpoints saved at CHECKPOINT events of the log"
)
ROLLBACKS = Counter(
    "antdt_ps_rollbacks_total", "Times this shard went back to a checkpoint (a REWOUND in the log)"
)
SERVING = Gauge(
    "antdt_ps_serving",
    "1 while this shard takes gradients (0: waiting for its first checkpoint, or recovering)",
)
