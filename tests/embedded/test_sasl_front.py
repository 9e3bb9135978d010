"""The SASL front's bounds: a connection that never logs in is closed (its login over real SCRAM
clients: tests/reliability/test_auth.py)."""

from __future__ import annotations

import socket

from antdt.embedded import sasl_front
from antdt.embedded.sasl_front import SaslFront


def test_a_connection_that_never_logs_in_is_closed_at_the_login_bound(monkeypatch):
    monkeypatch.setattr(sasl_front, "LOGIN_WITHIN_S", 0.3)
    with socket.create_server(("127.0.0.1", 0)) as upstream:  # a broker that is never asked
        front = SaslFront("127.0.0.1", 0, upstream.getsockname()).bind().serve_in_background()
        try:
            with socket.create_connection(("127.0.0.1", front.port), timeout=30) as silent:
                assert silent.recv(1) == b""  # closed by the front, long before this end's 30 s
        finally:
            front.close()
