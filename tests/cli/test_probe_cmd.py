"""``antdt probe``: the container health check, against a real HealthServer."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from antdt.cli.main import run
from antdt.embedded.broker import free_port
from antdt.runtime.observability import HealthServer

ANTDT = shutil.which("antdt") or os.path.join(os.path.dirname(sys.executable), "antdt")


@pytest.fixture
def ready() -> threading.Event:
    """The readiness the served /readyz reports; tests set it."""
    return threading.Event()


@pytest.fixture
def health(ready: threading.Event) -> Iterator[HealthServer]:
    """A service's health server on a free loopback port."""
    server = HealthServer(0, ready.is_set, host="127.0.0.1").start()
    yield server
    server.stop()


def one_error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The single line on stderr, after checking there is exactly one and no traceback."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("antdt: error: ") and "Traceback" not in captured.err + captured.out
    return lines[0]


def test_ready_service_passes(health, ready, capsys):
    ready.set()
    assert run(["probe", "--port", str(health.port), "--path", "/readyz"]) == 0
    assert capsys.readouterr().out.strip() == f"http://127.0.0.1:{health.port}/readyz: HTTP 200"


@pytest.mark.parametrize("path", ["/healthz", "/metrics"])
def test_liveness_and_metrics_answer_200_before_ready(health, path):
    assert run(["probe", "--port", str(health.port), "--path", path]) == 0


def test_not_ready_fails_with_the_status_and_the_reason(health, capsys):
    assert run(["probe", "--port", str(health.port)]) == 1  # /readyz is the default path
    assert (
        one_error_line(capsys)
        == f"antdt: error: http://127.0.0.1:{health.port}/readyz answered HTTP 503 (not ready)"
    )


def test_unknown_path_fails(health, capsys):
    assert run(["probe", "--port", str(health.port), "--path", "/nope"]) == 1
    assert "answered HTTP 404 (not found)" in one_error_line(capsys)


def test_nothing_listening_is_one_line(capsys):
    port = free_port()
    assert run(["probe", "--port", str(port), "--timeout", "1"]) == 1
    assert one_error_line(capsys) == (
        f"antdt: error: http://127.0.0.1:{port}/readyz: connection refused "
        "(is the service running, with this --http-port?)"
    )


def test_a_hung_service_fails_after_the_timeout(capsys):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts connections, never answers
        port = silent.getsockname()[1]
        assert run(["probe", "--port", str(port), "--timeout", "0.2"]) == 1
    assert (
        one_error_line(capsys)
        == f"antdt: error: http://127.0.0.1:{port}/readyz: no answer within 0.2 s"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["probe"], "Missing option '--port'"),
        (["probe", "--port", "9402", "--path", "readyz"], "expected a path starting with '/'"),
        (["probe", "--port", "70000"], "less than or equal to 65535"),
    ],
)
def test_bad_arguments_are_usage_errors(capsys, argv, expected):
    assert run(argv) == 2
    assert expected in one_error_line(capsys)


def test_console_script_as_a_healthcheck_runs_it(health, ready):
    """What Compose runs: the exit status is the verdict, stderr the one-line reason."""
    command = [ANTDT, "probe", "--port", str(health.port), "--path", "/readyz"]
    not_ready = subprocess.run(command, capture_output=True, text=True, timeout=60)
    ready.set()
    is_ready = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert (not_ready.returncode, is_ready.returncode) == (1, 0)
    assert not_ready.stderr.strip().endswith("answered HTTP 503 (not ready)")
    assert len(not_ready.stderr.strip().splitlines()) == 1 and is_ready.stderr == ""
