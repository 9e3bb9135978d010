"""Test harness: one embedded broker per session, a unique topic prefix per test.

Tests that touch Kafka use the real embedded broker (Tansu) through the same
client factories the services use; nothing stands in for the bus.
"""

from __future__ import annotations

import os
import uuid

import pytest

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.embedded.broker import EmbeddedBroker
from antdt.settings import BrokerProfile, Settings, load_settings


@pytest.fixture(autouse=True)
def _isolated_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ANTDT_* variable from the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("ANTDT_"):
            monkeypatch.delenv(name)


@pytest.fixture(scope="session")
def broker() -> EmbeddedBroker:
    """The embedded broker, started once per test session on a free port."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def topic_prefix() -> str:
    """A prefix no other test uses, so tests never see each other's records."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def settings(broker: EmbeddedBroker, topic_prefix: str) -> Settings:
    """Settings pointing at the session broker with this test's topic prefix."""
    return load_settings(
        bootstrap_servers=broker.bootstrap_servers,
        broker_profile=BrokerProfile.EMBEDDED,
        topic_prefix=topic_prefix,
        client_id="antdt-test",
    )


@pytest.fixture
def topics(settings: Settings) -> dict[str, int]:
    """Every registry topic created under this test's prefix; name -> partitions."""
    return ensure_topics(make_admin(settings), settings)
