"""A stand-in Kubernetes API server for the actuator's tests: it records requests and answers with
chosen statuses.

It is not a fake of Kubernetes' behaviour: the actuator's contract with the
cluster is the method, path, headers and body of each request, and that is
what it keeps.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class RecordingApiServer:
    """Answers every request with ``statuses.get((method, path), 200)`` and records it."""

    def __init__(self):
        self.requests: list[dict] = []
        self.statuses: dict[tuple[str, str], int] = {}
        self.seen = threading.Condition()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def wait_for(self, count: int, timeout_s: float = 10.0) -> list[dict]:
        with self.seen:
            assert self.seen.wait_for(lambda: len(self.requests) >= count, timeout_s), self.requests
        return self.requests

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with server.seen:  # recorded before the answer, so the caller sees it on return
                    server.requests.append(
                        {
                            "method": self.command,
                            "path": self.path,
                            "body": body,
                            "headers": dict(self.headers),
                        }
                    )
                    server.seen.notify_all()
                self.send_response(server.statuses.get((self.command, self.path), 200))
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_DELETE = do_PATCH = _record  # noqa: N815 - http.server's naming

            def log_message(self, *args) -> None:
                pass

        return Handler
