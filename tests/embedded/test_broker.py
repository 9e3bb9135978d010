"""The embedded broker: start, answer metadata, stop cleanly, and fail clearly."""

from __future__ import annotations

import socket

import pytest

from antdt.embedded.broker import EmbeddedBroker, answers_metadata, free_port
from antdt.errors import BrokerError


def test_starts_answers_metadata_and_stops():
    with EmbeddedBroker() as broker:
        assert broker.is_running()
        assert answers_metadata(broker.bootstrap_servers)
        assert broker.ready_after_s is not None and broker.ready_after_s < broker.start_timeout_s
    assert not broker.is_running()
    assert not answers_metadata(broker.bootstrap_servers, timeout_s=0.3)


def test_port_in_use_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BrokerError, match=f"port {port} on 127.0.0.1 is already in use"):
            EmbeddedBroker(port=port).start()


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("CALF_TANSU_BIN", str(tmp_path / "no-such-tansu"))
    with pytest.raises(BrokerError, match="embedded broker binary not found"):
        EmbeddedBroker(port=free_port()).start()


def test_broker_that_dies_at_start_is_reported(monkeypatch, tmp_path):
    fake = tmp_path / "tansu"
    fake.write_text("#!/bin/sh\necho 'boom: cannot start' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CALF_TANSU_BIN", str(fake))
    with pytest.raises(BrokerError, match="exited with code 3: boom: cannot start"):
        EmbeddedBroker().start()
