"""Running a polling service from its command: logging, the health endpoint, start, serve until a
signal."""

from __future__ import annotations

import logging
from collections.abc import Callable

import typer

from antdt.bus.config import describe_profile
from antdt.runtime.observability import HealthServer
from antdt.runtime.shutdown import stop_on_signals


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )


def serve(service, http_port: int, banner: Callable[[], str]) -> None:
    """Serve ``service`` (a LoopService) until Ctrl-C or SIGTERM; ``/healthz``, ``/readyz``,
    ``/metrics`` on ``http_port`` (0: none).

    ``banner`` is printed once the service has started (it may name what start-up decided),
    then the broker profile its clients run with.
    """
    health = HealthServer(http_port, service.ready.is_set).start() if http_port else None
    try:
        with stop_on_signals() as stop:
            service.start()
            typer.echo(banner())
            typer.echo(describe_profile(service.settings))
            service.run(stop)
    finally:
        if health:
            health.stop()
