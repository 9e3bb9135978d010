"""Health and metrics endpoints every service exposes."""

from __future__ import annotations

import multiprocessing
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


def test_a_server_never_started_stops_at_once():
    HealthServer(0, lambda: True, CollectorRegistry(), host="127.0.0.1").stop()


def test_a_forked_child_does_not_hold_the_port():
    """The child gets no serving thread, and closes its copy of the socket: the port is free once
    the parent stops, while the child lives on."""
    server = HealthServer(0, lambda: True, CollectorRegistry(), host="127.0.0.1").start()
    context = multiprocessing.get_context("fork")
    started, release = context.Event(), context.Event()
    child = context.Process(target=_hold, args=(started, release), daemon=True)
    child.start()
    try:
        assert started.wait(30), "the child never started"
        assert fetch(server.port, "/healthz") == (200, "ok\n")  # the parent still serves
        port = server.port
        server.stop()
        HealthServer(port, lambda: True, CollectorRegistry(), host="127.0.0.1").stop()
    finally:
        release.set()
        child.join(10)


def _hold(started, release) -> None:
    started.set()
    release.wait(30)
