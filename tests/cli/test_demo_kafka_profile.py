"""The short demo on the ``kafka`` client profile, the one users deploy, on the embedded broker.

Every other test runs the ``embedded`` profile: producers without idempotence,
2 s group sessions, 5-100 ms fetch waits. Here every antdt client of the run
(the demo's own readers, the monitor's Faust app, the sharder, the controller,
the parameter server and the three workers' agents) runs the production
profile: idempotent producers, librdkafka's 45 s and Faust's 60 s sessions,
100 ms fetch waits. No setting is overridden: none is impossible on the
embedded broker (Tansu).

What the profile costs there: Tansu holds a group join for half the session
timeout, so the controller's group forms after ~23 s and the monitor's after
~30 s, and the run takes about twice as long as on the embedded profile
(about a minute). On Apache Kafka a new group's first join waits
``group.initial.rebalance.delay.ms`` (3 s by default) instead
(docs/embedded-broker.md, "The kafka profile on the embedded broker").
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cli.test_demo_cmd import assert_short_demo_succeeded, short_demo

#: What each process prints at start (antdt.bus.config.describe_profile): written out here, not
#: computed, so a profile that drifted towards the embedded tuning fails this test.
KAFKA_CLIENTS = (
    "kafka clients: broker profile kafka, enable.idempotence=true, "
    "session.timeout.ms=default, fetch.wait.max.ms=100"
)
#: Faust's defaults, as the monitor prints them (antdt.bus.faust_app.describe_faust).
FAUST_CLIENTS = (
    "faust clients: broker_session_timeout=60 s, broker_heartbeat_interval=3 s, "
    "broker_rebalance_timeout=60 s, fetch.wait.max.ms=100"
)
#: Every process of the run that has Kafka clients, by the start of its log file's name.
PROCESSES = ("monitor-", "sharder-", "controller-", "ps-0-", "worker-w0", "worker-w1", "worker-w2")


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.timeout(360)
def test_the_short_demo_on_the_kafka_profile_mitigates_the_straggler_exactly_once(
    broker, topic_prefix, tmp_path, monkeypatch
):
    monkeypatch.setenv("ANTDT_BOOTSTRAP_SERVERS", broker.bootstrap_servers)
    monkeypatch.setenv("ANTDT_BROKER_PROFILE", "kafka")
    monkeypatch.setenv("ANTDT_TOPIC_PREFIX", topic_prefix)
    said = assert_short_demo_succeeded(short_demo(tmp_path, timeout=300), tmp_path)
    assert KAFKA_CLIENTS in said, f"the demo's own clients did not run the kafka profile: {said}"
    logs = processes_logs(tmp_path / "logs")
    for name, text in logs.items():
        assert KAFKA_CLIENTS in text, f"{name} did not run the kafka profile; its log:\n{text}"
    assert FAUST_CLIENTS in logs["monitor-"], logs["monitor-"]


def processes_logs(log_dir: Path) -> dict[str, str]:
    """Each process's log text by :data:`PROCESSES` name; one missing or extra fails the test."""
    found = {path.name: path.read_text(errors="replace") for path in log_dir.glob("*.log")}
    named = {p: [n for n in found if n.startswith(p)] for p in PROCESSES}
    assert all(len(names) == 1 for names in named.values()), f"expected one log each: {named}"
    assert len(found) == len(PROCESSES), f"a process this test does not know of: {sorted(found)}"
    return {p: found[names[0]] for p, names in named.items()}
