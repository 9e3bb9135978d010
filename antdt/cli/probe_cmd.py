"""``antdt probe``: an HTTP health check that needs nothing but the antdt image.

The image is built on ``python:3.11-slim``, which has neither curl nor wget, so
container health checks (Compose ``healthcheck``, Kubernetes ``exec`` probes)
run ``antdt probe --port 9402 --path /readyz`` instead. It exits 0 when the
endpoint answers HTTP 200; anything else prints one line saying why
(``antdt: error: ...``) and exits 1, so a failing check's log explains itself.

It speaks :mod:`http.client` directly rather than :mod:`urllib.request`:
urllib would honour ``HTTP_PROXY`` from the container's environment and follow
redirects, and a local health check must do neither.
"""

from __future__ import annotations

import http.client
import socket

import typer

from antdt.errors import AntdtError


class ProbeFailed(AntdtError):
    """The endpoint did not answer HTTP 200 (or did not answer at all)."""


def probe(
    port: int = typer.Option(
        ...,
        min=1,
        max=65535,
        help=(
            "The service's --http-port (sharder 9402, monitor 9403, controller 9404, grouper 9406)."
        ),
    ),
    path: str = typer.Option(
        "/readyz", help="Endpoint to GET: /healthz (alive), /readyz (ready) or /metrics."
    ),
    host: str = typer.Option("127.0.0.1", help="Host to connect to."),
    timeout: float = typer.Option(
        2.0, min=0.1, max=300, help="Seconds to wait for the connection and the answer."
    ),
) -> None:
    """Exit 0 if http://HOST:PORT/PATH answers 200; otherwise print why and exit 1."""
    if not path.startswith("/"):
        raise typer.BadParameter(
            f"expected a path starting with '/', got {path!r}", param_hint="--path"
        )
    url = f"http://{host}:{port}{path}"
    status, body = get(host, port, path, timeout, url)
    if status != 200:
        raise ProbeFailed(f"{url} answered HTTP {status}{describe_body(body)}")
    typer.echo(f"{url}: HTTP 200")


def get(host: str, port: int, path: str, timeout: float, url: str) -> tuple[int, bytes]:
    """The status and (start of the) body of one GET, or ProbeFailed naming what went wrong."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", path, headers={"User-Agent": "antdt-probe"})
        response = connection.getresponse()
        return response.status, response.read(200)
    except TimeoutError:
        raise ProbeFailed(f"{url}: no answer within {timeout:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ProbeFailed(f"{url}: {describe_failure(exc)}") from None
    finally:
        connection.close()


def describe_failure(exc: BaseException) -> str:
    """Why nothing usable came back, in words an operator reads in a health log."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused (is the service running, with this --http-port?)"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve host ({exc.strerror})"
    return str(exc) or type(exc).__name__


def describe_body(body: bytes) -> str:
    """The body's first line, when short plain text (e.g. 'not ready'), as a suffix."""
    first_line = body.decode("utf-8", "replace").strip().splitlines()[:1]
    return f" ({first_line[0][:80]})" if first_line else ""
