"""Test harness: one embedded broker per session, a unique topic prefix per test.

Tests that touch Kafka use the real embedded broker (Tansu) through the same
client factories the services use; nothing stands in for the bus.
"""

from __future__ import annotations

import os
import uuid
from collections import OrderedDict

import pytest
from hypothesis import HealthCheck
from hypothesis import settings as hypothesis_settings
from xdist.scheduler import LoadScopeScheduling

from antdt.bus.admin import ensure_topics
from antdt.bus.clients import make_admin
from antdt.embedded.broker import EmbeddedBroker
from antdt.settings import BrokerProfile, Settings, load_settings

# Property tests judge what the code does, not how fast: beside the serial modules' training ranks
# (make test's two workers) an example can take seconds, and a deadline or a generation-speed
# health check would fail the suite on the machine's load.
hypothesis_settings.register_profile(
    "antdt", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
hypothesis_settings.load_profile("antdt")


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


@pytest.fixture
def own_broker() -> EmbeddedBroker:
    """A broker of this test's own, for a test that stops, restarts or rolls it (doing so to the
    session's would break the rest)."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def own_bus(own_broker: EmbeddedBroker, topic_prefix: str) -> tuple[EmbeddedBroker, Settings]:
    """:func:`own_broker` with its topics made, and settings for it."""
    settings = load_settings(
        bootstrap_servers=own_broker.bootstrap_servers,
        broker_profile=BrokerProfile.EMBEDDED,
        topic_prefix=topic_prefix,
    )
    ensure_topics(make_admin(settings), settings)
    return own_broker, settings


#: The test modules that run one after another, on one worker, under ``make test``'s two workers:
#: their training ranks and services are timed against the whole machine (steps, stragglers,
#: bounds), and two of them side by side would measure each other.
SERIAL_MODULES = frozenset(
    {
        "tests/cli/test_demo_cmd.py",
        "tests/cli/test_demo_kafka_profile.py",
        "tests/cli/test_worker_cmd.py",
        "tests/examples/test_framework_examples.py",
        "tests/examples/test_user_job_bench.py",
        "tests/loadgen/test_scale_out.py",
        "tests/reliability/test_chaos.py",
        "tests/reliability/test_chaos_seeds.py",
        "tests/worker/elastic/test_torchrun.py",
        "tests/worker/preduce/test_torchrun.py",
        "tests/worker/ps/test_torchrun.py",
    }
)
SERIAL = "serial"


class SerialFirstScheduling(LoadScopeScheduling):
    """``pytest -n N`` (``make test``): the :data:`SERIAL_MODULES` as one unit of work, handed out
    first (it is the longest), and every other module as a unit of its own beside it (a module's
    module-scoped fixtures run once)."""

    def __init__(self, config: pytest.Config, log=None) -> None:
        super().__init__(config, log)
        self.workqueue = _SerialFirst()

    def _split_scope(self, nodeid: str) -> str:
        module = nodeid.split("::")[0]
        return SERIAL if module in SERIAL_MODULES else super()._split_scope(nodeid)


class _SerialFirst(OrderedDict):
    """The work queue, with the serial unit at its head whenever it is added."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if key == SERIAL:
            self.move_to_end(key, last=False)


def pytest_xdist_make_scheduler(config: pytest.Config, log) -> SerialFirstScheduling:
    return SerialFirstScheduling(config, log)
