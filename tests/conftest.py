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


#: The xdist group of the tests marked ``serial``: they run one after another on one worker.
SERIAL_GROUP = "serial"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests for ``pytest -n 2 --dist loadgroup`` (``make test``).

    Tests marked ``serial`` (training ranks and services whose timings and
    bounds are sized for the whole machine: chaos, the framework examples,
    the demo runs) run one at a time, in one group; two side by side would
    measure each other. A module with a module-scoped fixture stays on one
    worker, so the fixture runs once (in the serial group if any of its tests
    is there). Everything else spreads over the workers, beside the serial
    group.
    """
    groups = {item: _own_group(item) for item in items}
    serial_modules = {_module(item) for item, group in groups.items() if group == SERIAL_GROUP}
    for item, group in groups.items():
        if group is not None and _module(item) in serial_modules:
            group = SERIAL_GROUP
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _own_group(item: pytest.Item) -> str | None:
    if item.get_closest_marker("serial"):
        return SERIAL_GROUP
    if _has_module_fixture(item):
        return _module(item)
    return None


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0]


def _has_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    return any(chain[-1].scope == "module" for chain in defs if chain)
