"""The embedded broker: start, answer metadata, stop cleanly, and fail clearly."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from antdt.embedded.broker import RUNTIME_THREADS, EmbeddedBroker, answers_metadata, free_port
from antdt.errors import BrokerError


def test_starts_answers_metadata_and_stops():
    with EmbeddedBroker() as broker:
        assert broker.is_running()
        assert answers_metadata(broker.bootstrap_servers)
        assert broker.ready_after_s is not None and broker.ready_after_s < broker.start_timeout_s
    assert not broker.is_running()
    assert not answers_metadata(broker.bootstrap_servers, timeout_s=0.3)


def runtime_threads(broker: EmbeddedBroker) -> str:
    """What the broker process was told its runtime's thread count is (tokio reads it at start)."""
    environ = Path(f"/proc/{broker.pid}/environ").read_bytes().split(b"\0")
    return dict(entry.decode().partition("=")[::2] for entry in environ)["TOKIO_WORKER_THREADS"]


def test_the_runtime_gets_the_threads_asked_for_and_one_unless_told():
    """Tokio's default (a thread per core) cost more broker CPU here, idle and under load."""
    with EmbeddedBroker() as default, EmbeddedBroker(threads=3) as three:
        assert runtime_threads(default) == str(RUNTIME_THREADS) == "1"
        assert runtime_threads(three) == "3"
    with pytest.raises(BrokerError, match="at least one runtime thread, got 0"):
        EmbeddedBroker(threads=0)


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
