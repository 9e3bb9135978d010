"""Health and metrics over HTTP for every service: /healthz, /readyz, /metrics.

Orchestrators probe liveness (/healthz: the process is serving), readiness
(/readyz: topics exist and state has recovered, as the service reports) and
Prometheus scrapes /metrics. The server runs on a daemon thread so a service
loop never waits on a scrape. The agent in a training process serves its own
metrics with it too (:mod:`antdt.worker.agent_metrics`).

A process forked while a server runs (a DataLoader worker of a training
process) gets a copy of its listening socket but not its thread: the copy is
closed in the child at once, so the port is free as soon as the parent stops
serving, however long the child lives, and a child never answers for it.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

#: Servers started in this process, for the fork hook below.
_SERVING: weakref.WeakSet[HealthServer] = weakref.WeakSet()


class HealthServer:
    """Serves the three endpoints until stopped."""

    def __init__(
        self,
        port: int,
        ready: Callable[[], bool],
        registry: CollectorRegistry = REGISTRY,
        host: str = "0.0.0.0",
    ):
        handler = _handler_for(ready, registry)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="antdt-health", daemon=True
        )
        self._pid: int | None = None  # the process serving, once started

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> HealthServer:
        self._pid = os.getpid()
        self._thread.start()
        _SERVING.add(self)
        log.info("health and metrics on port %d", self.port)
        return self

    def stop(self) -> None:
        """Stop serving and free the port. In a forked child only its copy of the socket closes:
        the serving thread is the parent's, and waiting for it there would never end."""
        _SERVING.discard(self)
        if self._pid == os.getpid():
            self._server.shutdown()
        self._server.server_close()


def _close_inherited() -> None:
    """In a forked child: close the copies of the parent's listening sockets."""
    for server in list(_SERVING):
        server._server.server_close()
    _SERVING.clear()


os.register_at_fork(after_in_child=_close_inherited)


def _handler_for(
    ready: Callable[[], bool], registry: CollectorRegistry
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path == "/healthz":
                self._reply(200, b"ok\n", "text/plain")
            elif self.path == "/readyz":
                is_ready = ready()
                self._reply(
                    200 if is_ready else 503,
                    b"ready\n" if is_ready else b"not ready\n",
                    "text/plain",
                )
            elif self.path == "/metrics":
                self._reply(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            """Probes every few seconds would drown the logs."""

    return Handler
