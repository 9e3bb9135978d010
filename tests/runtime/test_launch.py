"""Child services: started with the parent's settings, on a port of their own, never taken for
ready when dead."""

from __future__ import annotations

import subprocess
import sys

import pytest

from antdt.embedded.broker import free_port
from antdt.errors import AntdtError
from antdt.runtime.launch import ServiceProcess, service_process, settings_env
from antdt.runtime.observability import HealthServer
from antdt.settings import BrokerProfile, load_settings


def test_settings_survive_the_trip_through_the_environment(monkeypatch: pytest.MonkeyPatch):
    settings = load_settings(
        bootstrap_servers="h1:9092,h2:9093",
        broker_profile=BrokerProfile.EMBEDDED,
        topic_prefix="p1",
        signing_key="s3cret",
        report_interval_s=0.5,
        worker_id="w-1",
    )
    env = settings_env(settings)
    assert env["ANTDT_SIGNING_KEY"] == "s3cret" and env["ANTDT_BROKER_PROFILE"] == "embedded"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert load_settings() == settings


def test_defaults_are_not_written():
    assert settings_env(load_settings()) == {}


def test_a_port_is_handed_out_once():
    """Two children started in a row once got the same port: the second to bind it died."""
    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)


def test_a_dead_child_is_not_ready_though_another_service_answers_on_its_port(tmp_path):
    other = HealthServer(0, ready=lambda: True, host="127.0.0.1").start()
    try:
        child = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        child.wait(30)
        service = ServiceProcess(child, other.port, tmp_path / "child.log")
        assert service.is_ready()  # the other one answers...
        with pytest.raises(AntdtError, match="exited with 3"):
            service.wait_ready(timeout_s=5)  # ...but this child is dead
    finally:
        other.stop()


def test_a_service_started_without_a_log_folder_takes_the_one_it_made_with_it(settings, topics):
    """About 400 such folders were left in /tmp after two suite runs."""
    with service_process(settings, "grouper") as service:
        folder = service.log_path.parent
        service.wait_ready(30)
        assert folder.is_dir() and folder.name.startswith("antdt-grouper-")
    assert not folder.exists()
