"""Child-process settings: what a service is started with is what the parent had."""

from __future__ import annotations

import pytest

from antdt.runtime.launch import settings_env
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
