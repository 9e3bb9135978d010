"""A process whose bus is not there: one line saying what it waits for and why, not librdkafka's
line for every failed connection, and one clear error at the bound."""

from __future__ import annotations

import logging

import pytest

import antdt.bus.admin as admin_module
import antdt.bus.clients as clients_module
from antdt.bus.admin import cluster_metadata
from antdt.bus.clients import RepeatedFailures, make_admin
from antdt.embedded.broker import free_port
from antdt.errors import BusUnreachable
from antdt.settings import load_settings

REFUSED = (
    "FAIL [antdt#producer-1] [thrd:localhost:{port}/bootstrap]: localhost:{port}/bootstrap: "
    "Connect to ipv4#127.0.0.1:{port} failed: Connection refused (after {tail})"
)
CONNECT = "0ms in state CONNECT"


def record(text: str) -> logging.LogRecord:
    return logging.LogRecord("antdt.kafka", logging.WARNING, __file__, 1, text, (), None)


def test_a_failure_librdkafka_logs_at_every_attempt_is_shown_once_a_while_with_the_count(
    monkeypatch,
):
    now = [100.0]
    monkeypatch.setattr(clients_module.time, "monotonic", lambda: now[0])
    failures = RepeatedFailures()
    # (librdkafka's own count of what it held back is part of the tail it varies)
    tails = (
        "0ms in state CONNECT",
        "1ms in state CONNECT",
        "0ms in state CONNECT, 1 identical error(s) suppressed",
        "2ms in state CONNECT",
    )
    shown = [failures.filter(record(REFUSED.format(port=9092, tail=tail))) for tail in tails]
    assert shown == [True, False, False, False]
    # another broker's failure, and a line that is no failure, are not held back
    assert failures.filter(record(REFUSED.format(port=9093, tail=CONNECT)))
    assert failures.filter(record("FAIL [antdt#producer-1]: Disconnected (after 3ms in state UP)"))
    now[0] += clients_module.AUTH_REMINDER_S
    again = record(REFUSED.format(port=9092, tail=CONNECT))
    assert failures.filter(again)
    assert again.getMessage().endswith("(and 3 time(s) since it was last shown)")
    assert not failures.filter(record(REFUSED.format(port=9092, tail=CONNECT)))


def test_waiting_for_a_bus_nothing_listens_at_says_so_once_and_what_to_do(monkeypatch, caplog):
    settings = load_settings(bootstrap_servers=f"127.0.0.1:{free_port()}", topic_prefix="nobus")
    monkeypatch.setattr(admin_module, "SAY_WAITING_AFTER_S", 0.3)
    with caplog.at_level(logging.WARNING, logger="antdt.bus.admin"):
        with pytest.raises(BusUnreachable) as caught:
            cluster_metadata(make_admin(settings), settings, timeout_s=1.5)
    waiting = [r.getMessage() for r in caplog.records if r.name == "antdt.bus.admin"]
    assert len(waiting) == 1, waiting
    assert waiting[0].startswith("waiting up to 2 s for the bus: nothing accepts connections")
    message = str(caught.value)
    assert message.startswith(f"cannot read cluster metadata from {settings.bootstrap_servers}")
    assert "`antdt up` prints the ANTDT_BOOTSTRAP_SERVERS to export" in message, message
