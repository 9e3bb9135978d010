"""The three endpoints every service exposes, probed live on each service against the embedded
broker.

Deployments probe ``/healthz`` (liveness) and ``/readyz`` (readiness) and
Prometheus scrapes ``/metrics``; the compose and Kubernetes files rely on
exactly these answers. The metric names are checked against Prometheus
conventions, and no label may carry an unbounded value (a job, worker, node,
shard or command id), so a scrape stays small however large the cluster.
"""

from __future__ import annotations

import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from antdt.embedded.broker import free_port
from antdt.runtime.launch import service_process
from antdt.settings import load_settings

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = ("sharder", "monitor", "controller", "grouper")
NAME = re.compile(r"^antdt_(sharder|monitor|controller|grouper)_[a-z][a-z0-9_]*$")
UNBOUNDED_LABELS = {
    "job",
    "job_id",
    "worker",
    "worker_id",
    "node",
    "node_id",
    "shard",
    "shard_id",
    "command_id",
    "verdict_id",
    "pod",
    "epoch",
}


def antdt_families(text: str) -> list:
    return [
        family
        for family in text_string_to_metric_families(text)
        if family.name.startswith("antdt_")
    ]


@pytest.mark.parametrize("command", SERVICES)
def test_health_readiness_and_metrics_answer_live(settings, command, tmp_path):
    with service_process(settings, command, log_dir=tmp_path) as service:
        service.wait_ready()
        assert service.get("/healthz") == (200, "ok\n")
        assert service.get("/readyz") == (200, "ready\n")
        assert service.get("/nothing-here")[0] == 404
        status, text = service.get("/metrics")
        assert status == 200
        families = antdt_families(text)
        assert {f.name.split("_")[1] for f in families} == {command}, (
            "each service exports its own metrics"
        )
        for family in families:
            assert NAME.match(family.name), f"{family.name}: not antdt_<service>_<snake_case>"
            if family.type == "counter":
                assert all(s.name.endswith(("_total", "_created")) for s in family.samples), (
                    family.name
                )
            assert not any(
                unit in family.name for unit in ("_ms", "_millis", "_minutes", "_kb", "_mb")
            ), f"{family.name}: use base units (seconds, bytes)"
            labels = {label for sample in family.samples for label in sample.labels} - {"le"}
            assert not labels & UNBOUNDED_LABELS, (
                f"{family.name} has unbounded label(s) {labels & UNBOUNDED_LABELS}"
            )


@pytest.mark.parametrize("command", (*SERVICES, "ps"))
def test_alive_but_not_ready_while_the_bus_is_unreachable(command, tmp_path):
    """Liveness must not fail while Kafka is down (a restart would not help); readiness must. A
    parameter-server shard (``antdt ps``) starts as the services do."""
    nowhere = load_settings(bootstrap_servers=f"127.0.0.1:{free_port()}", topic_prefix="nowhere")
    args = ("--port", "0", "--checkpoint-dir", str(tmp_path / "ps")) if command == "ps" else ()
    with service_process(nowhere, command, *args, log_dir=tmp_path) as service:
        service.wait_until(
            lambda: service.get("/healthz")[0] == 200, "the health endpoint answers", timeout_s=30
        )
        assert service.get("/readyz") == (503, "")
        # The sharder and the controller sit in their first metadata request (15 s deadline) and
        # only act on SIGTERM after it; nothing here is about stopping, so do not wait that out
        # (SIGKILL after 1 s).
        service.stop(grace_s=1.0)
