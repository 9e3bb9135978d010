"""Health and metrics endpoints every service exposes."""

from __future__ import annotations

import urllib.error
import urllib.request

from prometheus_client import CollectorRegistry, Counter

from antdt.runtime.observability import HealthServer


def fetch(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_health_readiness_and_metrics():
    registry = CollectorRegistry()
    Counter("antdt_test_things_total", "Things counted", registry=registry).inc(3)
    ready = {"value": False}
    server = HealthServer(0, lambda: ready["value"], registry, host="127.0.0.1").start()
    try:
        assert fetch(server.port, "/healthz") == (200, "ok\n")
        assert fetch(server.port, "/readyz")[0] == 503
        ready["value"] = True
        assert fetch(server.port, "/readyz") == (200, "ready\n")
        status, body = fetch(server.port, "/metrics")
        assert status == 200 and "antdt_test_things_total 3.0" in body
        assert fetch(server.port, "/nope")[0] == 404
    finally:
        server.stop()
