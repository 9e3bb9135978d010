"""The command line: help, version, the broker command, and one-line errors."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest

from antdt import __version__
from antdt.cli.main import run
from antdt.embedded.broker import answers_metadata, free_port

ANTDT = shutil.which("antdt") or os.path.join(os.path.dirname(sys.executable), "antdt")


def test_version(capsys):
    assert run(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"antdt {__version__}"


def test_help_lists_the_commands(capsys):
    assert run(["--help"]) == 0
    out = capsys.readouterr().out
    for command in ("broker", "topics", "demo", "bench", "check"):
        assert command in out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["broker", "--port", "abc"], "Invalid value for '--port'"),
        (["broker", "--port", "0"], "greater than or equal to 1"),
        (["broker", "--bogus"], "No such option: --bogus"),
        (["broker", "--threads", "0"], "Invalid value for '--threads'"),
        (["nope"], "No such command 'nope'"),
        (["ps", "--shard", "2", "--shards", "2"], "shard 2 of 2: shards are numbered from 0"),
        (["ps", "--max-staleness", "-1"], "--max-staleness"),
        (["audit", "--job", "j", "--ledger", "/no/such/dir"], "--ledger"),
        (["up", "--mode", "async", "--job", "no good"], "'no good' is not a job name"),
        (["up", "--ps-shards", "2"], "configure the parameter servers of --mode async"),
    ],
)
def test_bad_arguments_are_one_line(capsys, argv, expected):
    assert run(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("antdt: error: ") and expected in lines[0]
    assert "Traceback" not in captured.err + captured.out


def test_bad_setting_is_one_line_naming_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("ANTDT_TOPIC_PREFIX", "bad prefix!")
    assert run(["topics"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("antdt: error: ANTDT_TOPIC_PREFIX: ")


def test_console_script_errors_are_one_line_without_traceback():
    env = {**os.environ, "ANTDT_REPORT_INTERVAL_S": "never"}
    result = subprocess.run([ANTDT, "topics"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == "antdt: error: ANTDT_REPORT_INTERVAL_S: Input should be a valid number, "
        "unable to parse string as a number (got 'never')"
    )


def test_broker_port_in_use_is_one_line(capsys):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert run(["broker", "--port", str(taken.getsockname()[1])]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "already in use" in lines[0]


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_broker_command_serves_until_signalled(stop_signal):
    port = free_port()
    process = subprocess.Popen(
        [ANTDT, "broker", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[1].strip() == f"bootstrap servers: 127.0.0.1:{port}", lines
        assert answers_metadata(f"127.0.0.1:{port}")
        process.send_signal(stop_signal)
        assert process.wait(10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert not answers_metadata(f"127.0.0.1:{port}", timeout_s=0.3)


def test_topics_markdown_prints_the_registry(capsys):
    assert run(["topics", "--markdown"]) == 0
    assert "`antdt.shard.log`" in capsys.readouterr().out


def test_topics_create_on_a_real_broker(capsys, monkeypatch, settings):
    monkeypatch.setenv("ANTDT_BOOTSTRAP_SERVERS", settings.bootstrap_servers)
    monkeypatch.setenv("ANTDT_BROKER_PROFILE", "embedded")
    monkeypatch.setenv("ANTDT_TOPIC_PREFIX", settings.topic_prefix)
    assert run(["topics", "--create"]) == 0
    assert f"{settings.topic_prefix}.shard.log\t3 partitions" in capsys.readouterr().out


@pytest.mark.e2e
def test_bus_check_on_the_embedded_broker():
    result = subprocess.run([ANTDT, "check"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "bus check passed" in result.stdout
    assert "corrupt records dead-lettered: 1" in result.stdout
