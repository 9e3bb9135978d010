"""``antdt up``: the bus and the three services for a user's own script; stopped cleanly, a dead
service reported."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import threading
import time
from contextlib import contextmanager

import pytest

from antdt.embedded.broker import answers_metadata
from tests.cli.test_cli import ANTDT

pytestmark = [pytest.mark.slow, pytest.mark.e2e]


class Up:
    """``antdt up`` as a child process, its output read line by line (every wait bounded)."""

    def __init__(self, *args: str):
        env = {k: v for k, v in os.environ.items() if k != "ANTDT_BOOTSTRAP_SERVERS"}
        self.process = subprocess.Popen(
            [ANTDT, "up", "--ready-within", "90", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.seen: list[str] = []

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def until(self, text: str, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.2)
            except queue.Empty:
                assert self.process.poll() is None, f"antdt up exited: {self.process.stderr.read()}"
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout_s:.0f} s: {self.seen}")

    def pid_of(self, service: str) -> int:
        line = next(line for line in self.seen if line.startswith(f"{service} ready"))
        return int(line.split("(pid ")[1].split(",")[0])

    def close(self) -> None:
        """SIGTERM, as a user's Ctrl-C: ``antdt up`` stops its broker and services (a SIGKILL would
        orphan them)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
                raise AssertionError("antdt up did not stop within 60 s of SIGTERM") from None


@contextmanager
def serving(*args: str, last: str = "controller"):
    """``antdt up *args`` until ``last`` is ready: the settings of its bus, as a user exports them;
    stopped on exit."""
    from antdt.settings import load_settings

    up = Up(*args)
    try:
        up.until(f"{last} ready")
        if "async" in args:
            up.until("ANTDT_PS_SERVERS=")  # printed once the job's parameter servers are ready
        yield load_settings(**exported(up.seen))
    finally:
        up.close()


def exported(lines: list[str]) -> dict[str, str]:
    """The settings the ``export ANTDT_...`` lines printed so far set, by field name."""
    fields = {}
    for line in lines:
        if line.startswith("export "):
            for assignment in line.split("#")[0].split()[1:]:
                name, _, value = assignment.partition("=")
                if name.startswith("ANTDT_"):
                    fields[name.removeprefix("ANTDT_").lower()] = value
    return fields


def gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


def test_up_serves_the_bus_and_the_services_until_sigterm_then_stops_them_all():
    up = Up()
    try:
        bootstrap = up.until("export ANTDT_BOOTSTRAP_SERVERS=").split("=")[1].split()[0]
        up.until("controller ready")
        pids = [up.pid_of(name) for name in ("monitor", "sharder", "controller")]
        assert answers_metadata(bootstrap)
        up.process.send_signal(signal.SIGTERM)
        assert up.process.wait(60) == 0
    finally:
        up.close()
    assert all(gone(pid) for pid in pids) and not answers_metadata(bootstrap, timeout_s=0.3)


def test_a_service_that_dies_is_reported_at_once_in_one_line():
    up = Up()
    try:
        up.until("controller ready")
        os.kill(up.pid_of("monitor"), signal.SIGKILL)
        assert up.process.wait(60) == 1
        errors = [
            line
            for line in up.process.stderr.read().splitlines()
            if line.startswith("antdt: error:")
        ]
    finally:
        up.close()
    assert len(errors) == 1 and "monitor exited with code -9; its log: " in errors[0], errors
